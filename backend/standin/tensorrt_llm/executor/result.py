"""What a request gives back, as upstream's `tensorrt_llm/executor/result.py` shapes it: `CompletionOutput` (the
cumulative text and token ids of one sequence, with the diffs since the last read, finish and stop reasons,
log-probs and perf metrics) and `GenerationResult` (`RequestOutput` in tensorrt_llm.llmapi): one object, updated
in place by each response and yielded again by `async for`, `aresult()` and `result()`.

The async side is upstream's: the result binds to the event loop running when `generate_async` made it; without
one, async iteration is refused with upstream's AssertionError. A failed request raises `RequestError`.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .utils import RequestError

#: the CPU engine's finish reasons → upstream's `CompletionOutput.finish_reason`
FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "length": "length", "cancelled": "cancelled"}
NO_LOOP = "The asyncio event loop was not present during initialization, so async operations are not available."
#: how often a stats or events read asks the engine again while it waits for a new item
ITEM_POLL_S = 0.05


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class TimingMetrics:
    arrival_time: timedelta = timedelta(0)
    first_scheduled_time: timedelta = timedelta(0)
    first_token_time: timedelta = timedelta(0)
    last_token_time: timedelta = timedelta(0)


@dataclass
class KvCacheMetrics:
    num_total_allocated_blocks: int = 0
    num_new_allocated_blocks: int = 0
    num_reused_blocks: int = 0
    num_missed_blocks: int = 0
    kv_cache_hit_rate: float = 0.0


@dataclass
class SpeculativeDecodingMetrics:
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


@dataclass
class RequestPerfMetrics:
    timing_metrics: TimingMetrics = field(default_factory=TimingMetrics)
    kv_cache_metrics: KvCacheMetrics = field(default_factory=KvCacheMetrics)
    speculative_decoding: SpeculativeDecodingMetrics = field(default_factory=SpeculativeDecodingMetrics)
    first_iter: int | None = None
    last_iter: int | None = None
    iter: int | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    generation_logits: Any = None
    request_perf_metrics: RequestPerfMetrics | None = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]


def _ns(value: int) -> timedelta:
    return timedelta(microseconds=value / 1000)


class GenerationResult:
    """One request's result; the LLM's reader thread feeds it (`_deliver`), the caller reads it."""

    def __init__(
        self,
        request_id: int,
        prompt: str | None,
        prompt_token_ids: list[int],
        sampling_params: Any,
        streaming: bool,
        decode: Callable[[list[int]], str],
        abort: Callable[[int], None],
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.streaming = streaming
        self.outputs = [CompletionOutput(index=0)]
        self._decode = decode
        self._abort = abort
        self._done = False
        self._iter_done = False
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._aqueue: asyncio.Queue[Any] | None = asyncio.Queue() if self._loop is not None else None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ fed by the LLM's reader thread
    def _deliver(self, response: Any) -> None:
        """A response of the engine (wire Output) or an error text; safe from any thread."""
        if self._loop is not None and self._aqueue is not None:
            try:
                self._loop.call_soon_threadsafe(self._aqueue.put_nowait, response)
            except RuntimeError:  # the caller's loop is closed: nobody left to read it
                pass
        else:
            self._queue.put(response)

    # ------------------------------------------------------------------ read by the caller
    @property
    def finished(self) -> bool:
        return self._done

    def _handle_response(self, response: Any) -> None:
        out = self.outputs[0]
        out._last_text_len, out._last_token_ids_len = len(out.text), len(out.token_ids)
        if isinstance(response, str):
            self._done = True
            raise RequestError(response)
        if response.error or response.finish_reason == "error":
            self._done = True
            raise RequestError(response.error or "the engine failed the request")
        out.token_ids.extend(response.new_tokens)
        if self.sampling_params.logprobs:
            out.logprobs.extend(
                {t: Logprob(lp, None)} for t, lp in zip(response.new_tokens, response.log_probs, strict=True)
            )
        out.cumulative_logprob = response.cum_log_prob
        if response.finished:
            self._done = True
            out.finish_reason = FINISH_REASONS.get(response.finish_reason or "", response.finish_reason)
            if response.finish_reason == "stop_words":
                self._cut_stop_word(out)
            if response.perf is not None and self.sampling_params.return_perf_metrics:
                perf = response.perf
                out.request_perf_metrics = RequestPerfMetrics(
                    timing_metrics=TimingMetrics(
                        _ns(perf.arrival_time_ns),
                        _ns(perf.first_scheduled_time_ns),
                        _ns(perf.first_token_time_ns),
                        _ns(perf.last_token_time_ns),
                    ),
                    kv_cache_metrics=KvCacheMetrics(
                        perf.kv_cache_alloc_total_blocks,
                        perf.kv_cache_alloc_new_blocks,
                        perf.kv_cache_reused_block,
                        perf.kv_cache_missed_block,
                        perf.kv_cache_hit_rate,
                    ),
                )
        if self._done and not self.streaming and not self.sampling_params.exclude_input_from_output:
            out.token_ids[:0] = self.prompt_token_ids  # the executor returns the input too (never streamed)
        if self.sampling_params.detokenize:
            out.text = self._decode(out.token_ids)  # the prompt's too when returned: decoded as one text
            self._match_stop_strings(out)

    def _match_stop_strings(self, out: CompletionOutput) -> None:
        """upstream's DetokenizedGenerationResultBase._handle_response
        (NVIDIA/TensorRT-LLM/tensorrt_llm/executor/result.py@a678b91a; absent at @005bc848, which matched token
        ids only): while generating, or finished by stop or length, a stop string found anywhere in the decoded
        text (across token boundaries the engine's token match cannot see; in the echoed prompt too, when the
        input is returned) cuts the text there (after it with `include_stop_str_in_output`), ends the sequence
        with `finish_reason` "stop" and the string as `stop_reason`, and aborts the request in the engine."""
        if self._done and out.finish_reason not in ("stop", "length"):
            return
        stop = self.sampling_params.stop
        for word in [stop] if isinstance(stop, str) else list(stop or []):
            position = out.text.find(word)
            if position < 0:
                continue
            keep = position + len(word) if self.sampling_params.include_stop_str_in_output else position
            out.text = out.text[:keep]
            out.finish_reason, out.stop_reason = "stop", word
            self._abort(self.request_id)
            self._done = True
            return

    def _cut_stop_word(self, out: CompletionOutput) -> None:
        """upstream: the stop word that ended the sequence is its `stop_reason` (the string for `stop`, the id for
        `stop_token_ids`) and, unless `include_stop_str_in_output`, is cut from its tokens."""
        params = self.sampling_params
        strings = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        words = params._stop_words
        reasons: list[int | str] = [*strings, *(params.stop_token_ids or [])]
        for word, reason in zip(words, reasons, strict=True):
            if word and out.token_ids[-len(word) :] == word:
                out.stop_reason = reason
                if not params.include_stop_str_in_output:
                    del out.token_ids[-len(word) :]
                return

    async def _aresult_step(self) -> None:
        assert self._aqueue is not None, NO_LOOP
        self._handle_response(await self._aqueue.get())

    async def aresult(self) -> GenerationResult:
        while not self._done:
            await self._aresult_step()
        return self

    def result(self, timeout: float | None = None) -> GenerationResult:
        while not self._done:
            self._handle_response(self._queue.get(timeout=timeout))
        return self

    def __aiter__(self) -> GenerationResult:
        return self

    async def __anext__(self) -> GenerationResult:
        if self._done and self._iter_done:
            raise StopAsyncIteration
        await self._aresult_step()
        if self._done:
            self._iter_done = True
        return self

    def abort(self) -> None:
        """Ask the engine to stop this request; it ends with finish_reason 'cancelled'."""
        self._abort(self.request_id)

    def __repr__(self) -> str:
        return f"RequestOutput(request_id={self.request_id}, finished={self._done}, outputs={self.outputs!r})"


class IterationResult:
    """upstream's IterationResult (NVIDIA/TensorRT-LLM/tensorrt_llm/executor/result.py@a678b91a, @005bc848): one
    object per LLM for the stats (and one for the KV-cache events) of all its iterations, made by the first
    `generate_async` and marked undone by every later one (executor.py `_maybe_initialize_iteration_results`,
    @ed53795b). A read that waited `timeout` seconds for an item marks it done, and from then on every read ends at
    once, `async for` and `get_results` alike, until a request is submitted. `async for` needs an event loop running
    when it was made, as upstream's (an LLM whose first request came from blocking `generate` has none: the
    AssertionError). `read` asks the engine for the items since the last read (the stand-in polls; upstream's
    worker pushes them into a queue)."""

    def __init__(self, read: Callable[[float], list[dict[str, Any]]]) -> None:
        self._done = False
        self._timeout = 2.0
        self._read = read
        self._items: collections.deque[dict[str, Any]] = collections.deque()
        try:
            asyncio.get_running_loop()
            self._has_loop = True
        except RuntimeError:
            self._has_loop = False

    def set_timeout(self, timeout: float) -> None:
        self._timeout = timeout

    def mark_undone(self) -> None:
        """upstream: called when new prompts are submitted."""
        self._done = False

    def get_results(self) -> list[dict[str, Any]]:
        """Every item that comes until none came for the timeout; then done."""
        results: list[dict[str, Any]] = []
        while not self._done:
            deadline = time.monotonic() + self._timeout
            while not self._items and time.monotonic() < deadline:
                new = self._read(self._timeout)
                self._items.extend(new)
                if not new:
                    time.sleep(ITEM_POLL_S)
            if not self._items:
                self._done = True
                break
            results.append(self._items.popleft())
        return results

    def __aiter__(self) -> IterationResult:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._done:
            raise StopAsyncIteration
        assert self._has_loop, NO_LOOP
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self._timeout
        while not self._items:
            if time.monotonic() >= deadline:
                self._done = True
                raise StopAsyncIteration
            new = await loop.run_in_executor(None, self._read, self._timeout)
            self._items.extend(new)
            if not new:
                await asyncio.sleep(ITEM_POLL_S)
        return self._items.popleft()
