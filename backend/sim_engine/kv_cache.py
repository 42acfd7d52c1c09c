"""The simulated engine's paged KV cache: blocks of `tokens_per_block` tokens, as many as the GPU's memory gives,
reuse of full blocks by chained hashes over their token ids (TensorRT-LLM's `enable_block_reuse`), least recently
used eviction of blocks no request holds, and TensorRT-LLM's KV-cache events (stored / removed).

Why a cache with no data in it: routing and renewal are judged by what a replica finds in its cache, so which
blocks are kept, found and evicted must be real; their contents need not be.

Accounting (TensorRT-LLM's `guaranteed_no_evict`): a request takes, when admitted, the blocks its prompt and its
largest answer need; the prompt's blocks found in the cache are shared (held, not allocated), the rest are fresh.
Its full prompt blocks are stored (hashed, reusable) once its prefill is done, its answer's full blocks when it
ends; then it lets go of them all: stored blocks stay cached until evicted, fresh ones go back to the free pool.
A block's hash chains its parent's: the same tokens after another prefix are another block.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from backend.cpu_engine.prefix_cache import removed_event, stored_event

#: the hash of "no parent": a prompt's first block chains from it
ROOT_HASH = 0


def block_hash(parent: int, tokens: np.ndarray) -> int:
    """A block's key: its parent's hash and its token ids, 63 bits (a JSON integer every reader takes)."""
    digest = hashlib.blake2b(parent.to_bytes(8, "little") + tokens.astype(np.int64).tobytes(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") >> 1


@dataclass
class Block:
    hash: int
    parent: int
    refs: int = 0


@dataclass
class Holding:
    """A request's blocks: the stored ones it holds (the prompt's found ones first), and its fresh ones' count."""

    stored: list[Block] = field(default_factory=list)
    fresh: int = 0
    #: the prompt's blocks found in the cache when admitted
    reused: int = 0

    @property
    def blocks(self) -> int:
        return len(self.stored) + self.fresh


class PagedKvCache:
    """`max_blocks` blocks; `reuse` False: nothing is kept after its request (no lookups, no events)."""

    def __init__(
        self,
        max_blocks: int,
        tokens_per_block: int,
        reuse: bool = True,
        on_event: Callable[[dict], None] | None = None,
    ) -> None:
        if max_blocks < 1 or tokens_per_block < 1:
            raise ValueError(f"a KV cache needs at least one block of one token ({max_blocks}, {tokens_per_block})")
        self.max_blocks = max_blocks
        self.tokens_per_block = tokens_per_block
        self.reuse = reuse
        self.on_event = on_event if reuse else None
        #: stored blocks by hash; those no request holds, least recently used first, in `_idle`
        self._stored: dict[int, Block] = {}
        self._idle: OrderedDict[int, Block] = OrderedDict()
        self._free = max_blocks  # blocks neither stored nor held fresh

    # ------------------------------------------------------------------ counts
    @property
    def block_size(self) -> int:
        return self.tokens_per_block

    @property
    def max_tokens(self) -> int:
        return self.max_blocks * self.tokens_per_block

    @property
    def used_blocks(self) -> int:
        """Blocks requests hold (stored or fresh); cached blocks no one holds count as free, as upstream's."""
        return self.max_blocks - self._free - len(self._idle)

    @property
    def free_blocks(self) -> int:
        return self.max_blocks - self.used_blocks

    @property
    def cached_blocks(self) -> int:
        return len(self._stored)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.tokens_per_block)

    # ------------------------------------------------------------------ requests
    def _chain(self, tokens: np.ndarray, count: int, parent: int = ROOT_HASH, start: int = 0) -> list[int]:
        bs = self.tokens_per_block
        hashes = []
        for i in range(start, start + count):
            parent = block_hash(parent, tokens[i * bs : (i + 1) * bs])
            hashes.append(parent)
        return hashes

    def match(self, prompt: np.ndarray) -> list[Block]:
        """The cached blocks `prompt` starts with (never its last token's: that one is always computed)."""
        if not self.reuse:
            return []
        found = []
        parent = ROOT_HASH
        for i in range((len(prompt) - 1) // self.tokens_per_block):
            block = self._stored.get(
                block_hash(parent, prompt[i * self.tokens_per_block : (i + 1) * self.tokens_per_block])
            )
            if block is None:
                break
            found.append(block)
            parent = block.hash
        return found

    def admit(self, prompt: np.ndarray, total_tokens: int) -> Holding | None:
        """The blocks for a request of `total_tokens` (prompt + largest answer), evicting idle blocks as needed;
        None when they do not fit now."""
        found = self.match(prompt)
        need = self.blocks_for(total_tokens) - len(found)
        idle_found = sum(1 for b in found if b.refs == 0)
        if need > self._free + len(self._idle) - idle_found:
            return None
        for block in reversed(found):  # held now; its prefix last, so eviction takes a chain from its end
            if block.refs == 0:
                self._idle.pop(block.hash, None)
            block.refs += 1
        self._evict(need - self._free)
        self._free -= need
        return Holding(stored=list(found), fresh=need, reused=len(found))

    def store(self, holding: Holding, tokens: np.ndarray) -> None:
        """Store the full blocks of `tokens` (the request's sequence so far) beyond those it holds stored."""
        if not self.reuse:
            return
        have = len(holding.stored)
        full = len(tokens) // self.tokens_per_block
        if full <= have:
            return
        parent = holding.stored[-1].hash if holding.stored else ROOT_HASH
        run: list[tuple[int, np.ndarray]] = []  # new blocks in a row, chained from `run_parent`
        run_parent = parent
        for i, h in enumerate(self._chain(tokens, full - have, parent, have), start=have):
            block = self._stored.get(h)
            if block is None:
                block = Block(h, parent)
                self._stored[h] = block
                if not run:
                    run_parent = parent
                run.append((h, tokens[i * self.tokens_per_block : (i + 1) * self.tokens_per_block]))
            else:  # another request stored it meanwhile: share it, give the fresh block back
                self._emit_stored(run_parent, run)
                run = []
                if block.refs == 0:
                    self._idle.pop(h, None)
                self._free += 1
            block.refs += 1
            holding.fresh -= 1
            holding.stored.append(block)
            parent = h
        self._emit_stored(run_parent, run)

    def _emit_stored(self, parent: int, run: list[tuple[int, np.ndarray]]) -> None:
        if run and self.on_event is not None:
            self.on_event(stored_event(None if parent == ROOT_HASH else parent, run))

    def release(self, holding: Holding) -> None:
        """The request ended: its fresh blocks are free again, its stored ones idle (most recent: the tail first)."""
        self._free += holding.fresh
        holding.fresh = 0
        for block in reversed(holding.stored):  # the tail first: a chain's head ends most recent, evicted last
            block.refs -= 1
            if block.refs == 0:
                self._idle[block.hash] = block
                self._idle.move_to_end(block.hash)
        holding.stored = []

    def _evict(self, count: int) -> None:
        removed = []
        while count > 0 and self._idle:
            h, block = self._idle.popitem(last=False)
            del self._stored[h]
            self._free += 1
            removed.append(h)
            count -= 1
        if removed and self.on_event is not None:
            self.on_event(removed_event(removed))

    def hashes(self, prompt: Sequence[int]) -> list[int]:
        """The chained hashes of `prompt`'s full blocks (what a router following the events keys on)."""
        tokens = np.asarray(prompt, np.int64)
        return self._chain(tokens, len(tokens) // self.tokens_per_block)
