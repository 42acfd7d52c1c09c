"""The in-flight batching engine loop of a replica's leader (the other TP ranks: follower.py; how it drains when
stopping: drain.py).

Why a loop that re-forms the batch every step: new requests join at the next iteration (prefill) while running
ones take one batched decode step; finished ones leave at once and give back their slot and KV budget.  This is
what TensorRT-LLM's executor does on GPU, so latency/throughput behaviour is alike on the CPU stand-in.

Threading: ``submit`` may be called from any thread; all model work and all MPI calls happen on the engine thread
(``start()``), or on the caller's thread when driving ``step()`` by hand (tests).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import cast

import numpy as np

from .bookkeeping import Bookkeeping
from .checkpoint import ModelConfig
from .follower import load_shard
from .lockstep import StepFailed
from .model import StepPlan, TransformerShard
from .parallel import Communicator, world_comm
from .prefix_cache import PrefixReuse
from .scheduler import GenerationOutput, GenerationRequest, KVBudget, Scheduler
from .selection import greedy_picks, hit_stop_word, sampled_token
from .stats import EngineStats
from .validate import request_problem

log = logging.getLogger("hpc_serve.cpu_engine")


class Engine(Bookkeeping):
    """Leader-side engine: scheduler + KV budget + sampling around a :class:`TransformerShard` (its requests'
    bookkeeping: bookkeeping.py)."""

    def __init__(
        self,
        model_dir: str | None = None,
        *,
        shard: TransformerShard | None = None,
        comm: Communicator | None = None,
        tp_size: int = 1,
        max_batch_size: int = 8,
        max_tokens_in_kv_cache: int | None = None,
        block_size: int = 64,
        max_seq_len: int | None = None,
        heartbeat_s: float = 1.0,
        min_step_s: float = 0.0,
        block_reuse: bool = False,
        on_kv_event: Callable[[dict], None] | None = None,
    ) -> None:
        if shard is None:
            if model_dir is None:
                raise ValueError("Engine needs model_dir or shard")
            comm = comm or world_comm(tp_size)
            shard = load_shard(model_dir, comm, max_batch_size, max_seq_len)
        self.shard = shard
        super().__init__(shard.comm, heartbeat_s)
        if self.comm.rank != 0:
            raise RuntimeError("Engine is the leader (rank 0); other ranks run follower_loop()")
        self.config: ModelConfig = shard.cfg
        self.max_batch_size = min(max_batch_size, shard.max_slots)
        max_seq = shard.max_seq_len
        if max_tokens_in_kv_cache is None or max_tokens_in_kv_cache <= 0:
            max_tokens_in_kv_cache = self.max_batch_size * max_seq
        self.budget = KVBudget(max_tokens_in_kv_cache, block_size)
        self.scheduler = Scheduler(self.budget, self.max_batch_size, max_seq)
        #: KV blocks kept for later prompts (prefix_cache.py; kv_cache_config.enable_block_reuse), None: off
        #: on_kv_event: each change of those blocks, as TensorRT-LLM's KV-cache event data (engine thread)
        self.reuse = PrefixReuse(block_size, on_kv_event) if block_reuse else None
        #: the least time a step takes on the engine thread (the `min_step_ms` parameter: a GPU's pace)
        self.min_step_s = min_step_s
        self._last_context = 0
        self._last_generation = 0
        self._last_context_tokens = 0

    # ------------------------------------------------------------------ public API
    def _accept(self, req: GenerationRequest) -> None:
        req.rng = np.random.default_rng(int(req.sampling.seed) & 0xFFFFFFFFFFFFFFFF)

    def stats(self) -> EngineStats:
        """Counts as a client would read them: a request that finished in the last step is no longer active,
        although it leaves its slot (and its KV blocks) only at the start of the next step."""
        s = self.scheduler
        live = [r for r in s.running if not r.finished]
        leaving_blocks = sum(r.reserved_blocks for r in s.running if r.finished)
        return EngineStats(
            active_requests=len(live),
            scheduled_requests=len(live),
            waiting_requests=len(s.waiting) + self._incoming.qsize(),
            max_requests=self.max_batch_size,
            context_requests=self._last_context,
            generation_requests=self._last_generation,
            context_tokens=self._last_context_tokens,
            completed_requests=self.completed,
            iterations=self.iterations,
            used_blocks=self.budget.used_blocks - leaving_blocks,
            free_blocks=self.budget.free_blocks + leaving_blocks,
            max_blocks=self.budget.max_blocks,
            tokens_per_block=self.budget.block_size,
        )

    def shutdown(self) -> None:
        """Stop the loop, fail what is still queued, and release the followers (they exit their loop)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._fail_all("engine shut down")
        self._stop_followers()

    def generate(self, req: GenerationRequest, timeout: float | None = None) -> GenerationRequest:
        """Convenience: submit and wait (engine thread must be running, or we step here ourselves)."""
        done = threading.Event()
        user_cb = req.on_output

        def cb(out: GenerationOutput) -> None:
            if user_cb:
                user_cb(out)
            if out.finished:
                done.set()

        req.on_output = cb
        self.submit(req)
        if self._thread is None:
            while not done.is_set():
                self.step()
        elif not done.wait(timeout):
            raise TimeoutError(f"request {req.request_id} not finished after {timeout}s")
        return req

    def run_until_idle(self) -> None:
        """Step until nothing is waiting or running (synchronous driving for tests/benchmarks)."""
        while self.has_work():
            self.step()

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        last_msg = time.monotonic()
        while not self._stop.is_set():
            self._check_drain(time.monotonic())
            if self.has_work():
                started = time.monotonic()
                self.step_or_fail()
                last_msg = time.monotonic()
                if self.min_step_s > 0:  # a GPU's pace: the rest of the step's time, ended early by shutdown only
                    self._stop.wait(started + self.min_step_s - last_msg)
                continue
            if self._cancel_ids:  # stops while idle match nothing: said now, not applied to the next request's step
                self._intake()
            self._idle()
            if self.comm.size > 1 and time.monotonic() - last_msg >= self.heartbeat_s:
                self._ping()
                last_msg = time.monotonic()

    def step_or_fail(self) -> str | None:
        """One :meth:`step`; if it fails, only the requests of that step fail (with the reason, returned here)
        and the engine keeps serving: the server must never go down because of one batch."""
        try:
            self.step()
            return None
        except StepFailed as e:  # every rank skipped it together (lockstep.py)
            reason = str(e)
            log.error("%s", reason)
        except Exception as e:  # noqa: BLE001 - e.g. sampling on the leader, after the ranks finished the step
            reason = f"engine step failed: {type(e).__name__}: {e}"
            log.exception("engine step failed")
        self._fail_running(reason)
        return reason

    # ------------------------------------------------------------------ the bookkeeping's questions
    @property
    def _waiting(self) -> deque[GenerationRequest]:
        return self.scheduler.waiting

    def _running_requests(self) -> list[GenerationRequest]:
        return self.scheduler.running

    def _problem(self, req: GenerationRequest) -> str | None:
        if (cut := self.scheduler.fit(req)) is not None:
            log.warning("request %s: %s", req.request_id, cut)
        return request_problem(req, self.config.vocab_size) or self.scheduler.check(req)

    def _fail_all(self, message: str) -> None:
        super()._fail_all(message)
        self._report()  # the metrics must show the emptied batch now, not at some later step

    def _fail_running(self, message: str) -> None:
        for req in self.scheduler.running:
            if not req.finished:
                self._finish(req, "error", message)
        self.scheduler.remove_finished()

    def step(self) -> None:
        """One iteration: intake/cancel, compact, admit, one forward (decode + prefills), sample, emit."""
        completed = self.completed
        self._intake()
        sched = self.scheduler
        moves = sched.remove_finished()
        running = list(sched.running)
        admitted = sched.admit()
        if not running and not admitted:  # nothing survives, so pending slot moves are moot
            if self.completed != completed:  # a cancel or a refused request emptied the batch: say so
                self._report()
            return
        n_run = len(running)
        plan = StepPlan(
            moves=moves,
            decode_tokens=np.array([r.output_ids[-1] for r in running], np.int64),
            decode_positions=np.array([r.prompt_len + len(r.output_ids) - 1 for r in running], np.int64),
            prefills=[(n_run + j, r.input_ids) for j, r in enumerate(admitted)],
        )
        if self.reuse is not None:
            self._reuse_blocks(plan, admitted)
        if self.comm.size > 1:
            self.comm.bcast_obj(plan)
        try:
            decode_logits, prefill_logits = self.shard.run_step(plan)
        except StepFailed:
            if self.reuse is not None:
                self.reuse.forget()
            raise
        self.iterations += 1
        self._last_context, self._last_generation = len(admitted), n_run
        self._last_context_tokens = sum(r.prompt_len for r in admitted)
        now = time.time_ns()
        reqs = running + admitted
        # the leader computes logits (model.run_step returns None only on followers)
        prefill_rows = cast("list[np.ndarray]", prefill_logits)
        if n_run and admitted:
            logits = np.concatenate([cast(np.ndarray, decode_logits), np.stack(prefill_rows)])
        else:
            logits = cast(np.ndarray, decode_logits) if n_run else np.stack(prefill_rows)
        picks = greedy_picks(reqs, logits)
        for j, req in enumerate(reqs):
            self._advance(req, logits[j], now, picks[j])
        self._report()
        # finished requests leave (and free their slot/budget) at the start of the next step

    def _reuse_blocks(self, plan: StepPlan, admitted: list[GenerationRequest]) -> None:
        """Start each admitted prompt after the cached blocks it begins with, keep its new ones (prefix_cache.py)."""
        assert self.reuse is not None
        blocks, placed = self.reuse.step(plan.prefills, self.budget.free_blocks)
        plan.prefills, plan.starts, plan.loads = blocks.prefills, blocks.starts, blocks.loads
        plan.saves, plan.drops, plan.block_tokens = blocks.saves, blocks.drops, self.reuse.tokens_per_block
        for req, reuse in zip(admitted, placed, strict=True):
            req.kv_blocks_reused = len(reuse.found)

    def _report(self) -> None:
        if self.on_step is not None:
            try:
                self.on_step(self.stats())
            except Exception:
                log.exception("on_step hook failed")

    def _advance(
        self, req: GenerationRequest, logits: np.ndarray, now: int, pick: tuple[int, float] | None = None
    ) -> None:
        """Sample one token for ``req`` (or take ``pick``, its batched greedy choice) and apply the stop rules."""
        p = req.sampling
        n_out = len(req.output_ids)
        token, logp = pick if pick is not None else sampled_token(req, logits)
        if not req.first_token_time_ns:
            req.first_token_time_ns = now
        req.last_token_time_ns = now
        if req.end_id is not None and token == req.end_id:
            self._finish(req, "end_id")
            return
        req.output_ids.append(token)
        req.log_probs.append(logp)
        req.cum_log_prob += logp
        n_out += 1
        if n_out >= p.min_tokens and req.stop_words and hit_stop_word(req):
            self._finish(req, "stop_words")
        elif n_out >= req.max_new_tokens:
            self._finish(req, "length")
        else:
            self._emit(req, final=False)
