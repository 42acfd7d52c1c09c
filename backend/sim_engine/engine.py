"""The simulated engine: TensorRT-LLM's in-flight batching with a GPU's timing, where each step is waited
(timing.py says how long), never computed. What the leader node (backend/cpu_engine/llmapi/leader_node.py) uses of
the CPU engine's `Engine` it has too: submit, cancel, stats, start, shutdown, `budget`, `config`, KV events.

A step (TensorRT-LLM's scheduler, simplified): every decoding sequence makes one token; then prompts are
prefilled in chunks within `max_num_tokens` (those already started first, then new requests, admitted in order
while the batch has room, `max_batch_size`, and the KV cache the blocks, kv_cache.py). A prompt's first token
comes at the end of the step that finishes its prefill. The tokens are the corpus read on (text.py).

Why a loop that keeps a deadline: the next step starts when the last one's time is up, not when Python is done
with it, so the engine's pace is the GPU's as long as the bookkeeping takes less than a step. `run_offline`
runs the same steps on a clock of its own (no waiting), for the calibration and tests.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from backend.cpu_engine.bookkeeping import Bookkeeping
from backend.cpu_engine.parallel import Communicator, SingleComm
from backend.cpu_engine.scheduler import GenerationRequest
from backend.cpu_engine.selection import hit_stop_word
from backend.cpu_engine.stats import EngineStats
from backend.cpu_engine.validate import request_problem

from .kv_cache import Holding, PagedKvCache
from .text import CorpusText
from .timing import StepTiming, StepWork

log = logging.getLogger("hpc_serve.sim_engine")

#: how far behind its deadlines the loop may fall and still make the time up (the steps after a late wake-up start
#: at once): wake-ups late by a millisecond or two on a loaded machine would otherwise slow every step's pace
CATCH_UP_S = 0.05
#: the log-probability every simulated token reports (there are no logits): a confident model's
TOKEN_LOG_PROB = -0.1


@dataclass(frozen=True)
class SimModel:
    """The facts the leader node reports of the model (as the CPU engine's ModelConfig)."""

    family: str
    vocab_size: int


@dataclass
class _Seq:
    req: GenerationRequest
    holding: Holding
    #: where its answer starts in the corpus
    start: int
    #: prompt tokens whose KV exists (found in the cache, or prefilled)
    computed: int

    @property
    def prefilling(self) -> bool:
        return self.computed < self.req.prompt_len


@dataclass
class _Step:
    duration_s: float
    decode: list[_Seq] = field(default_factory=list)
    prefill: list[tuple[_Seq, int]] = field(default_factory=list)


class SimEngine(Bookkeeping):
    """The simulated engine; its requests' bookkeeping is the CPU engine's (backend/cpu_engine/bookkeeping.py)."""

    thread_name = "sim-engine"
    log = log  # the bookkeeping speaks through this module's logger

    def __init__(
        self,
        *,
        timing: StepTiming,
        cache: PagedKvCache,
        text: CorpusText,
        max_batch_size: int,
        max_num_tokens: int,
        max_seq_len: int,
        model: SimModel,
        comm: Communicator | None = None,
        heartbeat_s: float = 1.0,
        slowdown: float = 1.0,
    ) -> None:
        if max_batch_size < 1 or max_num_tokens < 1:
            raise ValueError(f"max_batch_size ({max_batch_size}) and max_num_tokens ({max_num_tokens}) must be > 0")
        super().__init__(comm or SingleComm(), heartbeat_s)
        self.timing, self.cache, self.text = timing, cache, text
        self.budget = cache  # the leader node reads max_blocks, block_size, max_tokens
        self.config = model
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.max_seq_len = max_seq_len
        #: each step is waited this many times its GPU time (model.sim.slowdown); busy_s counts GPU time
        self.slowdown = slowdown
        self.waiting: deque[GenerationRequest] = deque()
        self.running: list[_Seq] = []
        #: the admitted requests' sequences, by the request's id(): what a request lets go of when it finishes
        self._held: dict[int, _Seq] = {}
        self.busy_s = 0.0  # the GPU time of every step so far
        self._last = _Step(0.0)

    # ------------------------------------------------------------------ public API
    def stats(self) -> EngineStats:
        live = [s for s in self.running if not s.req.finished]
        last = self._last
        return EngineStats(
            active_requests=len(live),
            scheduled_requests=len(live),
            waiting_requests=len(self.waiting) + self._incoming.qsize(),
            max_requests=self.max_batch_size,
            context_requests=len(last.prefill),
            generation_requests=len(last.decode),
            context_tokens=sum(chunk for _, chunk in last.prefill),
            completed_requests=self.completed,
            iterations=self.iterations,
            used_blocks=self.cache.used_blocks,
            free_blocks=self.cache.free_blocks,
            max_blocks=self.cache.max_blocks,
            tokens_per_block=self.cache.tokens_per_block,
        )

    def shutdown(self) -> None:
        """Stop the loop, fail what is queued or running, release the worker nodes."""
        self._stop.set()
        self._wake.set()
        self._refusing = "engine shut down"
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():  # its loop still owns the queues: failing them here would race it
                log.warning("sim engine: its loop did not stop within 30 s; its requests are left to it")
            else:
                self._thread = None
        if self._thread is None:
            self._fail_all(self._refusing)
        self._stop_followers()

    def run_offline(self, requests: Iterable[GenerationRequest]) -> float:
        """Serve `requests`, all arrived at time 0, on the engine's own clock, without waiting; the simulated
        seconds it took (calibrate.py; tests)."""
        for req in requests:
            self.submit(req)
        clock = 0.0
        while self.has_work():
            step = self._plan()
            if step is None:
                continue
            clock += step.duration_s
            self._complete(step, int(clock * 1e9))
        return clock

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        deadline = 0.0
        pinged = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            self._check_drain(now)
            if self.comm.size > 1 and now - pinged >= self.heartbeat_s:
                self._ping()
                pinged = now
            try:
                step = self._plan()
            except Exception as e:  # noqa: BLE001 - a broken step fails its requests, never the server
                log.exception("simulated step failed")
                self._fail_all(f"engine step failed: {type(e).__name__}: {e}")
                continue
            if step is None:
                self._idle()
                deadline = 0.0
                continue
            # back to back: this step starts when the last one's time was up, so a late wake-up (a loaded machine)
            # is made up for by the next steps; later than CATCH_UP_S, the time is lost (Python fell behind)
            start = deadline if now - deadline < CATCH_UP_S else now
            deadline = start + step.duration_s * self.slowdown
            if self._stop.wait(max(0.0, deadline - time.monotonic())):
                break
            self._complete(step, time.time_ns())

    # ------------------------------------------------------------------ the bookkeeping's questions
    @property
    def _waiting(self) -> deque[GenerationRequest]:
        return self.waiting

    def _running_requests(self) -> list[GenerationRequest]:
        return [s.req for s in self.running]

    def _problem(self, req: GenerationRequest) -> str | None:
        """Why a request can never run, or None; a request asking more than its context leaves is cut, as
        TensorRT-LLM cuts it."""
        problem = request_problem(req, self.config.vocab_size)
        if problem:
            return problem
        if req.prompt_len == 0:
            return "the prompt must have at least one token"
        if req.max_new_tokens <= 0:
            return f"max_tokens must be at least 1, got {req.max_new_tokens}"
        if req.prompt_len >= self.max_seq_len:
            return f"the prompt has {req.prompt_len} tokens but max_seq_len is {self.max_seq_len}; shorten the prompt"
        req.max_new_tokens = min(req.max_new_tokens, self.max_seq_len - req.prompt_len)
        need = self.cache.blocks_for(req.total_tokens)
        if need > self.cache.max_blocks:
            return f"the request needs {need} KV blocks but the cache has {self.cache.max_blocks}"
        return None

    def _plan(self) -> _Step | None:
        """Take requests in and choose the next step's work; None when there is none."""
        self._intake()
        self.running = [s for s in self.running if not s.req.finished]
        room = self.max_num_tokens
        step = _Step(0.0)
        for seq in self.running:
            if not seq.prefilling:
                step.decode.append(seq)
        room -= len(step.decode)
        for seq in self.running:
            if seq.prefilling and room > 0:
                chunk = min(seq.req.prompt_len - seq.computed, room)
                step.prefill.append((seq, chunk))
                room -= chunk
        while self.waiting and len(self.running) < self.max_batch_size and room > 0:
            req = self.waiting[0]
            holding = self.cache.admit(req.input_ids, req.total_tokens)
            if holding is None:
                break
            self.waiting.popleft()
            req.kv_blocks_allocated = holding.blocks
            req.kv_blocks_reused = holding.reused
            req.first_scheduled_time_ns = time.time_ns()
            bs = self.cache.tokens_per_block
            seq = _Seq(req, holding, self.text.start(req.sampling.seed, req.input_ids), holding.reused * bs)
            self.running.append(seq)
            self._held[id(req)] = seq
            chunk = min(req.prompt_len - seq.computed, room)
            step.prefill.append((seq, chunk))
            room -= chunk
        if not step.decode and not step.prefill:
            return None
        work = StepWork(
            prefill_tokens=sum(chunk for _, chunk in step.prefill),
            prefill_pairs=sum(chunk * s.computed + chunk * chunk / 2 for s, chunk in step.prefill),
            prefill_context=sum(s.computed for s, _ in step.prefill),
            decode_sequences=len(step.decode),
            decode_context=sum(s.req.prompt_len + len(s.req.output_ids) for s in step.decode),
        )
        step.duration_s = self.timing.step_s(work)
        return step

    def _complete(self, step: _Step, now_ns: int) -> None:
        """The step's time is up: its tokens exist."""
        self.iterations += 1
        self.busy_s += step.duration_s
        self._last = step
        for seq, chunk in step.prefill:
            if seq.req.finished:  # cancelled while its step ran
                continue
            seq.computed += chunk
            if not seq.prefilling:
                self.cache.store(seq.holding, seq.req.input_ids)
                self._advance(seq, now_ns)
        for seq in step.decode:
            if not seq.req.finished:
                self._advance(seq, now_ns)
        if self.on_step is not None:
            self.on_step(self.stats())

    def _advance(self, seq: _Seq, now_ns: int) -> None:
        """One new token for `seq`, then the stop rules (the CPU engine's: end id, stop words after min_tokens,
        length)."""
        req = seq.req
        token = self.text.token(seq.start, len(req.output_ids))
        if not req.first_token_time_ns:
            req.first_token_time_ns = now_ns
        req.last_token_time_ns = now_ns
        if req.end_id is not None and token == req.end_id and len(req.output_ids) >= req.sampling.min_tokens:
            self._finish(req, "end_id")
            return
        req.output_ids.append(token)
        req.log_probs.append(TOKEN_LOG_PROB)
        req.cum_log_prob += TOKEN_LOG_PROB
        n_out = len(req.output_ids)
        if n_out >= req.sampling.min_tokens and req.stop_words and hit_stop_word(req):
            self._finish(req, "stop_words")
        elif n_out >= req.max_new_tokens:
            self._finish(req, "length")
        else:
            self._emit(req, final=False)

    # ------------------------------------------------------------------ endings
    def _finish(self, req: GenerationRequest, reason: str, error: str | None = None) -> None:
        seq = self._held.pop(id(req), None)
        if seq is not None:  # its answer's full blocks are kept too; then it lets go of its blocks
            if reason != "error" and req.output_ids:
                self.cache.store(
                    seq.holding, np.concatenate([req.input_ids, np.asarray(req.output_ids[:-1], np.int64)])
                )
            self.cache.release(seq.holding)
        super()._finish(req, reason, error)

    def _fail_running(self, message: str) -> None:
        for seq in self.running:
            if not seq.req.finished:
                self._finish(seq.req, "error", message)
        self.running = []
