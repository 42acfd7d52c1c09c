"""`tensorrt_llm.LLM` over the CPU engine: upstream's public methods and their contracts.

Where the engine runs is upstream's choice too: with `TLLM_SPAWN_PROXY_PROCESS=1` (what `trtllm-llmapi-launch`
sets) the LLM is a client of the leader node at `TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR`, which runs the engine with
the MPI job's ranks (backend/cpu_engine/llmapi/: the stand-in's own wire, protocol.py, in place of upstream's
MPI session and ZeroMQ queues); without it the engine runs in this process, a world of one rank (upstream spawns
its workers then; the CPU stand-in asks for the launch above when tensor_parallel_size > 1).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from multiprocessing import Pipe
from typing import Any

from backend.cpu_engine.llmapi import protocol as p
from launcher.contracts.llmapi import SPAWN_PROXY_VAR

from ..executor.result import GenerationResult, IterationResult
from ..executor.utils import RequestError
from ..sampling_params import SamplingParams
from .tokenizer import TransformersTokenizer, tokenizer_factory

log = logging.getLogger("tensorrt_llm")
RequestOutput = GenerationResult


def _as_mapping(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


async def _empty() -> AsyncIterator[dict[str, Any]]:
    return
    yield  # an async generator that yields nothing


class LLM:
    """The LLM API's entry point: `LLM(model=..., **llm_args)`."""

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(model, str | os.PathLike):
            raise TypeError(f"model must be a path or a Hugging Face name, got {type(model).__name__}")
        # a section given as its class (KvCacheConfig(...)) travels to the leader node as its mapping
        kwargs = {k: _as_mapping(v) for k, v in kwargs.items()}
        self.args: dict[str, Any] = {"model": str(model), "tensor_parallel_size": tensor_parallel_size, **kwargs}
        if tokenizer is not None:
            self.args["tokenizer"] = str(tokenizer)
        self._ids = itertools.count(1)
        self._results: dict[int, GenerationResult] = {}
        self._lock = threading.Lock()
        self._replies: dict[type, p.Stats | p.KvEvents] = {}
        self._ask_lock = threading.Lock()
        self._reply = threading.Condition(self._lock)
        self._last_stats_iteration = 0
        #: upstream's executor's `_iter_stats_result` / `_iter_kv_events_result`: made by the first request
        self._iter_stats: IterationResult | None = None
        self._iter_kv_events: IterationResult | None = None
        self._shut = False
        self._broken: str | None = None
        self._local: threading.Thread | None = None
        self._channel = self._open(tensor_parallel_size)
        self._channel.send(p.Load(self.args))
        reply = self._channel.recv()
        if not isinstance(reply, p.Loaded):
            self._channel.close()
            raise RuntimeError(f"Failed to load the model: {reply.error}")
        self.loaded: p.Loaded = reply
        self._tokenizer: TransformersTokenizer | None = (
            None if skip_tokenizer_init else tokenizer_factory(self.args.get("tokenizer") or reply.model)
        )
        self._reader = threading.Thread(target=self._read, name="tllm-result-reader", daemon=True)
        self._reader.start()

    def _open(self, tp: int) -> p.Channel:
        if os.environ.get(SPAWN_PROXY_VAR) == "1":
            return p.connect(p.endpoint())
        if tp != 1:
            raise RuntimeError(
                f"tensor_parallel_size {tp}: the CPU stand-in runs more than one rank only under "
                "trtllm-llmapi-launch (the leader node and its workers; hpc-serve's launcher starts them)"
            )
        from backend.cpu_engine.llmapi.leader_node import LeaderNode
        from backend.cpu_engine.parallel import SingleComm
        from backend.engines import engine_kind

        ours, theirs = Pipe()
        min_step_s = float(os.environ.get("HPC_SERVE_CPU_MIN_STEP_MS") or 0) / 1000
        node = LeaderNode(SingleComm(), min_step_s, kind=engine_kind())  # the engine the nodes would run
        self._local = threading.Thread(target=node.serve, args=(p.Channel(theirs),), name="tllm-engine", daemon=True)
        self._local.start()
        return p.Channel(ours)

    # ------------------------------------------------------------------ properties
    @property
    def tokenizer(self) -> TransformersTokenizer | None:
        return self._tokenizer

    # ------------------------------------------------------------------ requests
    def generate_async(
        self,
        inputs: str | Sequence[int] | dict[str, Any],
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        cache_salt: str | None = None,
    ) -> GenerationResult:
        """Submit one prompt (text, token ids, or upstream's {"prompt": ...} / {"prompt_token_ids": ...});
        returns its RequestOutput at once."""
        if self._shut:
            raise RuntimeError("LLM is shutting down or has already been shut down")
        if self._broken:
            raise RequestError(self._broken)
        if lora_request is not None and not self.args.get("enable_lora"):
            # upstream: without enable_lora the worker drops a lora_request, whatever it is; so NVIDIA's model.py,
            # which passes `streaming` positionally into this slot, gets one final response (streaming False)
            log.warning("lora_request %r given to an LLM built without enable_lora: ignored", lora_request)
        sampling_params = self._prepare_sampling_params(sampling_params)
        prompt, prompt_ids = self._prompt(inputs, sampling_params)
        self._check_arguments(prompt_ids, sampling_params)
        request_id = next(self._ids)
        result = GenerationResult(
            request_id, prompt, prompt_ids, sampling_params, bool(streaming), self._decode(sampling_params), self._abort
        )
        self._maybe_initialize_iteration_results()
        with self._lock:
            self._results[request_id] = result
        end_id = None if sampling_params.ignore_eos else sampling_params.end_id
        # length_penalty is not passed: it scores finished beams, and one beam is made (upstream's at beam width 1)
        sampling = p.Sampling(
            max_tokens=sampling_params.max_tokens,
            temperature=sampling_params.temperature,
            top_k=sampling_params.top_k,
            top_p=sampling_params.top_p,
            frequency_penalty=sampling_params.frequency_penalty,
            presence_penalty=sampling_params.presence_penalty,
            seed=sampling_params.seed or 0,
            end_id=end_id,
            stop_words=sampling_params._stop_words,
            repetition_penalty=sampling_params.repetition_penalty,
            min_tokens=sampling_params.min_tokens or 0,
            return_log_probs=bool(sampling_params.logprobs),
        )
        try:
            self._channel.send(p.Submit(str(request_id), prompt_ids, sampling, bool(streaming)))
        except OSError as e:
            with self._lock:
                self._results.pop(request_id, None)
            raise RequestError(f"the executor is gone: {e}") from None
        return result

    def generate(
        self, inputs: Any, sampling_params: SamplingParams | None = None, **kwargs: Any
    ) -> GenerationResult | list[GenerationResult]:
        """Blocking: one RequestOutput per prompt (a list for a list of prompts)."""
        many = isinstance(inputs, list) and not (inputs and isinstance(inputs[0], int))
        results = [self.generate_async(i, sampling_params, **kwargs) for i in (inputs if many else [inputs])]
        done = [r.result() for r in results]
        return done if many else done[0]

    def _prepare_sampling_params(self, sampling_params: SamplingParams | None) -> SamplingParams:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"The sampling_params must be type SamplingParams or None, but got {type(sampling_params)}")
        if self._tokenizer is None and sampling_params.end_id is None:
            raise ValueError(
                "tokenizer is required to initialize a default sampling_params, or you can explicitly "
                "specify a sampling_params"
            )
        if self._tokenizer is not None:
            sampling_params._setup(self._tokenizer, sampling_params.add_special_tokens and False)
        if sampling_params.n != 1 or (sampling_params.best_of or 1) != 1 or sampling_params.use_beam_search:
            raise ValueError(
                f"n={sampling_params.n}, best_of={sampling_params.best_of}, use_beam_search="
                f"{sampling_params.use_beam_search}: the CPU engine returns one sequence (n=1, best_of=1)"
            )
        return sampling_params

    def _prompt(self, inputs: Any, sampling_params: SamplingParams) -> tuple[str | None, list[int]]:
        if isinstance(inputs, dict):
            if "prompt_token_ids" in inputs:
                return None, [int(t) for t in inputs["prompt_token_ids"]]
            inputs = inputs.get("prompt")
        if isinstance(inputs, str):
            if self._tokenizer is None:
                raise ValueError("a text prompt needs the tokenizer (skip_tokenizer_init=False)")
            return inputs, self._tokenizer.encode(inputs, add_special_tokens=sampling_params.add_special_tokens)
        if isinstance(inputs, list | tuple) and all(isinstance(t, int) for t in inputs):
            return None, list(inputs)
        raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")

    def _check_arguments(self, prompt_ids: list[int], sampling_params: SamplingParams) -> None:
        """upstream's `_check_arguments`: a prompt must fit the model's context."""
        max_seq_len = self.loaded.max_seq_len
        if len(prompt_ids) >= max_seq_len:  # upstream's words (its limit is max_num_tokens; the CPU engine's, this)
            raise ValueError(
                f"The sum of prompt length ({len(prompt_ids) / 1}), query length (0) should not exceed "
                f"max_seq_len ({max_seq_len})"
            )
        if not prompt_ids:
            raise ValueError("The inputs must not be empty: the prompt has no tokens")

    def _decode(self, sampling_params: SamplingParams) -> Callable[[list[int]], str]:
        tokenizer = self._tokenizer

        def decode(ids: list[int]) -> str:
            if tokenizer is None:
                return ""
            return tokenizer.decode(ids, skip_special_tokens=sampling_params.skip_special_tokens)

        return decode

    def _abort(self, request_id: int) -> None:
        try:
            self._channel.send(p.Abort(str(request_id)))
        except OSError:
            pass

    # ------------------------------------------------------------------ engine outputs
    def _read(self) -> None:
        while True:
            try:
                message = self._channel.recv()
            except (EOFError, OSError, p.ProtocolError) as e:
                if not self._shut:
                    self._fail_all(f"the executor is gone: {type(e).__name__}: {e}")
                return
            if isinstance(message, p.Output):
                request_id = int(message.request_id)
                with self._lock:
                    result = self._results.get(request_id)
                    if result is not None and message.finished:
                        del self._results[request_id]
                if result is not None:
                    result._deliver(message)
            elif isinstance(message, p.Stats | p.KvEvents):
                with self._lock:
                    self._replies[type(message)] = message
                    self._reply.notify_all()

    def _fail_all(self, reason: str) -> None:
        self._broken = reason
        with self._lock:
            results, self._results = list(self._results.values()), {}
            self._reply.notify_all()
        for result in results:
            result._deliver(reason)

    # ------------------------------------------------------------------ stats and KV-cache events
    def _ask(self, query: p.StatsQuery | p.KvEventsQuery, timeout: float) -> p.Stats | p.KvEvents | None:
        """One query to the engine and its answer (None: no answer in `timeout`, or the executor is gone)."""
        kind = p.Stats if isinstance(query, p.StatsQuery) else p.KvEvents
        with self._ask_lock:  # one query of each kind at a time; a late answer to an earlier one is replaced
            with self._lock:
                self._replies.pop(kind, None)
            try:
                self._channel.send(query)
            except OSError:
                return None
            with self._lock:
                if not self._reply.wait_for(lambda: kind in self._replies or bool(self._broken), timeout):
                    return None
                return self._replies.pop(kind, None)

    def _new_stats(self, timeout: float) -> list[dict[str, Any]]:
        """The iterations since the last read, as upstream's iteration stats (the latest step stands for those not
        read: the CPU engine keeps no per-iteration history)."""
        if not self.args.get("enable_iter_perf_stats"):
            return []
        s = self._ask(p.StatsQuery(), timeout)
        if not isinstance(s, p.Stats) or s.iterations == self._last_stats_iteration:
            return []
        self._last_stats_iteration = s.iterations
        return [iteration_stats(s)]

    def _new_kv_events(self, timeout: float) -> list[dict[str, Any]]:
        events = self._ask(p.KvEventsQuery(), timeout)
        return list(events.events) if isinstance(events, p.KvEvents) else []

    def _maybe_initialize_iteration_results(self) -> None:
        """upstream's executor: the stats and events results are made once, then marked undone at every request
        (NVIDIA/TensorRT-LLM/tensorrt_llm/executor/executor.py@ed53795b)."""
        if self._iter_stats is None or self._iter_kv_events is None:
            self._iter_stats = IterationResult(self._new_stats)
            self._iter_kv_events = IterationResult(self._new_kv_events)
        else:
            self._iter_stats.mark_undone()
            self._iter_kv_events.mark_undone()

    def get_stats(self, timeout: float = 2) -> list[dict[str, Any]]:
        """Nothing before the first request (upstream prints that the stats are not available yet)."""
        if self._iter_stats is None:
            return []
        self._iter_stats.set_timeout(timeout)
        return self._iter_stats.get_results()

    def get_stats_async(self, timeout: float = 2) -> AsyncIterator[dict[str, Any]]:
        """upstream's: the one IterationResult of this LLM (see it: after a read timed out, every read ends at once
        until the next request); nothing before the first request."""
        if self._iter_stats is None:
            return _empty()
        self._iter_stats.set_timeout(timeout)
        return self._iter_stats

    def _kv_events_result(self, timeout: float) -> IterationResult:
        assert self._iter_kv_events is not None, "KV Event IterationResult is not properly instantiated."
        self._iter_kv_events.set_timeout(timeout)
        return self._iter_kv_events

    def get_kv_cache_events(self, timeout: float = 2) -> list[dict[str, Any]]:
        """The KV-cache events since the last read (needs kv_cache_config.event_buffer_max_size > 0 and block
        reuse, as upstream's docstring says; without them, none)."""
        return self._kv_events_result(timeout).get_results()

    def get_kv_cache_events_async(self, timeout: float = 2) -> AsyncIterator[dict[str, Any]]:
        return self._kv_events_result(timeout)

    # ------------------------------------------------------------------ lifetime
    def shutdown(self) -> None:
        """Release the engine: the in-process engine stops; under trtllm-llmapi-launch the leader node's end is
        the launch's to decide (launcher/contracts/trtllm_versions.py: which releases stop it at shutdown)."""
        if self._shut:
            return
        self._shut = True
        from launcher.contracts.trtllm_versions import client_shutdown_stops_leader

        from ..version import __version__

        if self._local is not None or client_shutdown_stops_leader(__version__):
            try:
                self._channel.send(p.Shutdown())
            except OSError:
                pass
        self._channel.close()
        if self._local is not None:
            self._local.join(timeout=30)

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def iteration_stats(s: p.Stats) -> dict[str, Any]:
    """One iteration's stats in upstream's JSON shape (the executor's IterationStats as a dict)."""
    return {
        "iter": s.iterations,
        "numActiveRequests": s.active_requests,
        "numQueuedRequests": s.waiting_requests,
        "numCompletedRequests": s.completed_requests,
        "maxNumActiveRequests": s.max_requests,
        "inflightBatchingStats": {
            "numScheduledRequests": s.scheduled_requests,
            "numContextRequests": s.context_requests,
            "numGenRequests": s.generation_requests,
            "numCtxTokens": s.context_tokens,
            "numPausedRequests": 0,
            "microBatchId": 0,
        },
        "kvCacheStats": {
            "maxNumBlocks": s.max_blocks,
            "freeNumBlocks": s.free_blocks,
            "usedNumBlocks": s.used_blocks,
            "tokensPerBlock": s.tokens_per_block,
        },
    }
