"""Requests, the KV-cache token budget and admission (TensorRT-LLM's ``guaranteed_no_evict`` policy).

Why reserve prompt + max output at admission: a running sequence can then never run out of cache, so nothing is
ever evicted or crashed mid-generation; requests that do not fit yet simply wait in FIFO order.  Accounting is in
blocks of ``block_size`` tokens so the metrics read like TensorRT-LLM's paged cache (used/free/max blocks).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..refusals import CPU_CONTEXT
from .sampling import SamplingParams

log = logging.getLogger("hpc_serve.cpu_engine")
#: how many finished request ids the engine remembers, to say in the log what a stop that matched nothing was
FINISHED_IDS_KEPT = 1024

_ids = itertools.count()


@dataclass
class GenerationOutput:
    """One streamed chunk (or the whole result when not streaming) for a request."""

    request: GenerationRequest
    new_tokens: list[int]
    new_log_probs: list[float]
    finished: bool
    finish_reason: str | None = None  # "end_id" | "stop_words" | "length" | "cancelled" | "error"
    error: str | None = None


@dataclass
class GenerationRequest:
    """An engine-level request, independent of Triton (the Triton model converts tensors into this)."""

    input_ids: np.ndarray
    max_new_tokens: int
    end_id: int | None = None
    pad_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_log_probs: bool = False
    streaming: bool = False
    on_output: Callable[[GenerationOutput], None] | None = None  # called from the engine thread
    is_cancelled: Callable[[], bool] | None = None  # polled every step (Triton's response_sender.is_cancelled)
    request_id: str = ""
    tag: object = None  # caller's bookkeeping (e.g. Triton request + batch index)
    # --- engine state
    uid: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    cancel_requested: bool = False
    reserved_blocks: int = 0  # currently held (0 once released)
    kv_blocks_allocated: int = 0  # reserved at admission (reported in kv_cache_alloc_* outputs)
    kv_blocks_reused: int = 0  # of the prompt's blocks, copied from the cache, not computed (prefix_cache.py)
    arrival_time_ns: int = field(default_factory=time.time_ns)
    first_scheduled_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    rng: np.random.Generator | None = None
    _unsent: int = 0  # index of the first output token not yet streamed

    def __post_init__(self) -> None:
        self.input_ids = np.asarray(self.input_ids, dtype=np.int64).reshape(-1)
        if not self.request_id:
            self.request_id = str(self.uid)

    @property
    def prompt_len(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def total_tokens(self) -> int:
        """Cache footprint reserved at admission."""
        return self.prompt_len + self.max_new_tokens

    def cancelled(self) -> bool:
        if self.cancel_requested:
            return True
        if self.is_cancelled is not None:
            try:
                return bool(self.is_cancelled())
            except Exception:  # a dead client connection counts as cancelled
                return True
        return False


class KVBudget:
    """Token budget of the KV cache counted in blocks (like ``max_tokens_in_paged_kv_cache``)."""

    def __init__(self, max_tokens: int, block_size: int = 64) -> None:
        if max_tokens <= 0 or block_size <= 0:
            raise ValueError(f"max_tokens ({max_tokens}) and block_size ({block_size}) must be > 0")
        self.block_size = block_size
        self.max_blocks = max_tokens // block_size
        if self.max_blocks == 0:
            raise ValueError(f"max_tokens_in_paged_kv_cache {max_tokens} is smaller than one block ({block_size})")
        self.used_blocks = 0

    @property
    def max_tokens(self) -> int:
        return self.max_blocks * self.block_size

    @property
    def free_blocks(self) -> int:
        return self.max_blocks - self.used_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def try_reserve(self, tokens: int) -> int:
        """Reserve blocks for ``tokens``; return the number reserved, or 0 if they do not fit now."""
        n = self.blocks_for(tokens)
        if n > self.free_blocks:
            return 0
        self.used_blocks += n
        return n

    def release(self, blocks: int) -> None:
        self.used_blocks = max(0, self.used_blocks - blocks)


class Scheduler:
    """FIFO waiting queue + the running batch (list index == KV slot)."""

    def __init__(self, budget: KVBudget, max_batch_size: int, max_seq_len: int) -> None:
        self.budget = budget
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.waiting: deque[GenerationRequest] = deque()
        self.running: list[GenerationRequest] = []

    def fit(self, req: GenerationRequest) -> str | None:
        """Cut a request's new tokens to the room its prompt leaves in the context, as TensorRT-LLM does
        (`LlmRequest::validate`: a warning, not an error; the answer ends with finish reason "length"), so that
        a client asking for more than fits (OpenAI chat's default, a large `max_tokens`) is served the same by
        both engines. Returns the warning when it cut, None otherwise; a prompt that leaves no room is `check`'s."""
        room = self.max_seq_len - req.prompt_len
        if req.prompt_len == 0 or room <= 0 or req.max_new_tokens <= room:
            return None
        asked, req.max_new_tokens = req.max_new_tokens, room
        return (
            f"Prompt length + number of requested output tokens ({req.prompt_len} + {asked}) exceeds maximum sequence "
            f"length ({self.max_seq_len}). Number of requested output tokens is changed to ({room})."
        )

    def check(self, req: GenerationRequest) -> str | None:
        """Why a request can never run (so it fails now instead of waiting forever), or None."""
        if req.prompt_len == 0:
            return "input 'input_ids' is empty: the prompt must have at least one token"
        if req.max_new_tokens <= 0:
            return f"input 'request_output_len' must be at least 1, got {req.max_new_tokens}"
        if req.prompt_len >= self.max_seq_len:
            return (
                f"input 'input_ids': the prompt has {req.prompt_len} tokens but {CPU_CONTEXT} is "
                f"{self.max_seq_len} tokens (prompt + new tokens); shorten the prompt"
            )
        need = self.budget.blocks_for(req.total_tokens)
        if need > self.budget.max_blocks:
            return (
                f"input length {req.prompt_len} + request_output_len {req.max_new_tokens} needs {need} KV blocks "
                f"but max_tokens_in_paged_kv_cache allows only {self.budget.max_blocks}"
            )
        return None

    def admit(self) -> list[GenerationRequest]:
        """Move waiting requests into the running batch while slots and KV budget allow (strict FIFO)."""
        admitted = []
        while self.waiting and len(self.running) < self.max_batch_size:
            req = self.waiting[0]
            blocks = self.budget.try_reserve(req.total_tokens)
            if not blocks:
                break
            self.waiting.popleft()
            req.reserved_blocks = blocks
            req.kv_blocks_allocated = blocks
            req.first_scheduled_time_ns = time.time_ns()
            self.running.append(req)
            admitted.append(req)
        return admitted

    def remove_finished(self) -> list[tuple[int, int]]:
        """Drop finished requests from the batch, free their blocks; return slot moves that keep slots dense."""
        moves: list[tuple[int, int]] = []
        i = 0
        while i < len(self.running):
            req = self.running[i]
            if not req.finished:
                i += 1
                continue
            self.budget.release(req.reserved_blocks)
            req.reserved_blocks = 0
            last = len(self.running) - 1
            if i != last:
                moves.append((last, i))
                self.running[i] = self.running[last]
            self.running.pop()
        return moves


class RecentlyFinished:
    """Ids of requests finished lately, newest last (at most `kept`): tells a stop that came after its request
    ended from one that matched nothing, in the log."""

    def __init__(self, kept: int = FINISHED_IDS_KEPT) -> None:
        self.kept = kept
        self._ids: OrderedDict[str, float] = OrderedDict()

    def add(self, request_id: str) -> None:
        self._ids[request_id] = time.monotonic()
        self._ids.move_to_end(request_id)
        if len(self._ids) > self.kept:
            self._ids.popitem(last=False)

    def unmatched_stop(self, request_id: str) -> None:
        """A stop whose id matches no waiting or running request: said in the log, and otherwise ignored, as
        TensorRT-LLM's backend does (DEVELOPERS.md, "Abandoned streams"). Either it came after its request ended
        (normal: a client gives up as the answer completes) or before its request reached the engine."""
        finished = self._ids.get(request_id)
        if finished is not None:
            log.info("stop for request id %r: it finished %.3f s ago", request_id, time.monotonic() - finished)
        else:
            log.warning(
                "stop for request id %r matches nothing this engine holds (none by that id seen lately)", request_id
            )
