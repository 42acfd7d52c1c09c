"""KV-cache block reuse between requests, as TensorRT-LLM's `kv_cache_config.enable_block_reuse` does it: the KV
of a prompt's full blocks stays after its request ended, keyed by every token up to the block's end (a block is
reused only after the same whole prefix), and a later prompt that starts with those blocks copies them instead of
computing them; it prefills from the first block it does not find. At least the prompt's last token is always
computed (its logits give the first new token), so a prompt whose every block is cached reuses all but the last.

Why: the gateway's prefix affinity is judged by the reuse the engine reports (`kv_cache_reused_block` in the
llmapi model's perf metrics), and an engine that reuses nothing would make every policy look alike. Reuse counts
here are real: a block is counted reused only when its KV was copied, not computed.

Two halves, because of tensor parallelism: the leader's `BlockIndex` decides (which blocks a prompt finds, which
new ones to keep, which to evict, all bookkeeping), and every rank's `BlockStore` holds its own shard of each
block's KV and acts on the decisions the leader put in the step's plan (model.StepPlan `loads`, `saves`,
`drops`), so the ranks' stores stay alike without talking. The index keeps at most as many blocks as the KV
budget has free (scheduler.KVBudget: what running requests do not hold), least recently used evicted first, as
TensorRT-LLM reuses only blocks its free pool still holds; a block is always more recent than the blocks after
it (a prompt touches its blocks last to first), so eviction shortens a cached prefix from its end and never
leaves a block whose prefix is gone.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

#: kv_cache_config.tokens_per_block's default in TensorRT-LLM's LLM API
DEFAULT_TOKENS_PER_BLOCK = 32


@dataclass
class Reuse:
    """A prompt's place in the cache: the cached blocks it starts with (copied into its slot before its prefill,
    which then starts at `start`), and its new full blocks to keep once computed (position in the prompt, id)."""

    found: list[int] = field(default_factory=list)
    start: int = 0
    keep: list[tuple[int, int]] = field(default_factory=list)


class BlockIndex:
    """The leader's view of the cached blocks: chain key (the prompt's tokens up to the block's end) → block id,
    least recently used first."""

    def __init__(self, tokens_per_block: int) -> None:
        if tokens_per_block < 1:
            raise ValueError(f"tokens_per_block must be at least 1, got {tokens_per_block}")
        self.tokens_per_block = tokens_per_block
        self._blocks: OrderedDict[tuple[int, ...], int] = OrderedDict()
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._blocks)

    def _keys(self, prompt: Sequence[int] | np.ndarray) -> list[tuple[int, ...]]:
        bs = self.tokens_per_block
        tokens = tuple(int(t) for t in prompt)
        return [tokens[: (i + 1) * bs] for i in range(len(tokens) // bs)]

    def place(self, prompt: Sequence[int] | np.ndarray, unsaved: Collection[int] = ()) -> Reuse:
        """Which cached blocks `prompt` starts with (marked recently used), and which of its full blocks are new.
        `unsaved`: blocks not computed yet (kept by a prompt of the same step), which it cannot copy."""
        keys = self._keys(prompt)
        usable = (len(prompt) - 1) // self.tokens_per_block  # the last token is always computed
        reuse = Reuse()
        for key in keys[:usable]:
            block = self._blocks.get(key)
            if block is None or block in unsaved:
                break
            reuse.found.append(block)
        reuse.start = len(reuse.found) * self.tokens_per_block
        for position, key in enumerate(keys):
            if key not in self._blocks:
                block = next(self._ids)
                self._blocks[key] = block
                reuse.keep.append((position, block))
        for key in reversed(keys):  # used now, a block's prefix last: eviction takes a chain from its end
            self._blocks.move_to_end(key)
        return reuse

    def block_at(self, prompt: Sequence[int] | np.ndarray, position: int) -> int | None:
        """The id of `prompt`'s block at `position`, if cached."""
        keys = self._keys(prompt)
        return self._blocks.get(keys[position]) if 0 <= position < len(keys) else None

    def evict_to(self, capacity: int, keep: Sequence[int] = ()) -> list[int]:
        """Evict least recently used blocks until at most `capacity` remain (never one of `keep`: the blocks the
        step's plan loads or saves); the evicted ids, for every rank's store to drop."""
        spare = set(keep)
        dropped = []
        for key in list(self._blocks):
            if len(self._blocks) <= capacity:
                break
            if self._blocks[key] not in spare:
                dropped.append(self._blocks.pop(key))
        return dropped


class BlockStore:
    """One rank's shard of every cached block's KV: per block, each layer's keys and values [kv_heads, block,
    head_dim], copied out of a slot after its prefill and into a slot before one."""

    def __init__(self, tokens_per_block: int) -> None:
        self.tokens_per_block = tokens_per_block
        self._blocks: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def load(self, k_cache: list[np.ndarray], v_cache: list[np.ndarray], slot: int, blocks: Sequence[int]) -> None:
        bs = self.tokens_per_block
        for n, block in enumerate(blocks):
            for layer, (k, v) in enumerate(self._blocks[block]):
                k_cache[layer][slot, :, n * bs : (n + 1) * bs] = k
                v_cache[layer][slot, :, n * bs : (n + 1) * bs] = v

    def save(
        self, k_cache: list[np.ndarray], v_cache: list[np.ndarray], slot: int, blocks: Sequence[tuple[int, int]]
    ) -> None:
        bs = self.tokens_per_block
        for position, block in blocks:
            span = slice(position * bs, (position + 1) * bs)
            self._blocks[block] = [
                (kc[slot, :, span].copy(), vc[slot, :, span].copy()) for kc, vc in zip(k_cache, v_cache, strict=True)
            ]

    def drop(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            self._blocks.pop(block, None)


@dataclass
class StepBlocks:
    """A step's prompts as the plan carries them: each prefill from its first uncached token, and the block work
    around it (model.StepPlan's fields of the same names)."""

    prefills: list[tuple[int, np.ndarray]]
    starts: list[int]
    loads: list[tuple[int, list[int]]]
    saves: list[tuple[int, list[tuple[int, int]]]]
    drops: list[int]


def stored_event(parent: int | None, blocks: Sequence[tuple[int, Sequence[int] | np.ndarray]]) -> dict:
    """TensorRT-LLM's KV-cache event data for blocks kept (KVCacheEventSerializer's "stored"): each block's hash (its
    id here) and tokens, chained from `parent` (the block before the first, None at a prompt's start)."""
    return {
        "type": "stored",
        "parent_hash": parent,
        "blocks": [
            {
                "type": "stored_block",
                "block_hash": block,
                "tokens": [{"type": "unique_token", "token_id": int(t), "token_extra_id": 0} for t in tokens],
                "cache_level": 0,
                "priority": 35,
            }
            for block, tokens in blocks
        ],
    }


def removed_event(blocks: Sequence[int]) -> dict:
    """TensorRT-LLM's KV-cache event data for blocks evicted ("removed")."""
    return {"type": "removed", "block_hashes": list(blocks)}


class PrefixReuse:
    """The leader's block reuse: places each admitted prompt in the index and makes the step's block work; after a
    failed step (the ranks may not have kept its blocks) it forgets every block and has the ranks drop them.
    `on_event`: each change of the cached blocks as TensorRT-LLM's KV-cache event data (kv_cache_config's
    event_buffer_max_size), for routers that follow what each replica holds."""

    def __init__(self, tokens_per_block: int, on_event: Callable[[dict], None] | None = None) -> None:
        self.index = BlockIndex(tokens_per_block)
        self._forgotten: list[int] = []
        self.on_event = on_event

    @property
    def tokens_per_block(self) -> int:
        return self.index.tokens_per_block

    def step(self, prompts: Sequence[tuple[int, np.ndarray]], free_blocks: int) -> tuple[StepBlocks, list[Reuse]]:
        """The block work of a step admitting `prompts` (slot, token ids), keeping at most `free_blocks` cached."""
        placed: list[Reuse] = []
        unsaved: set[int] = set()  # a block kept in this step exists only after its forward
        for _, ids in prompts:
            placed.append(self.index.place(ids, unsaved))
            unsaved.update(block for _, block in placed[-1].keep)
        busy = [b for r in placed for b in [*r.found, *(block for _, block in r.keep)]]
        drops = [*self._forgotten, *self.index.evict_to(free_blocks, keep=busy)]
        self._forgotten = []
        if self.on_event is not None:
            self._events(prompts, placed, drops)
        blocks = StepBlocks(
            prefills=[(slot, ids[r.start :]) for (slot, ids), r in zip(prompts, placed, strict=True)],
            starts=[r.start for r in placed],
            loads=[(slot, r.found) for (slot, _), r in zip(prompts, placed, strict=True) if r.found],
            saves=[(slot, r.keep) for (slot, _), r in zip(prompts, placed, strict=True) if r.keep],
            drops=drops,
        )
        return blocks, placed

    def _events(self, prompts: Sequence[tuple[int, np.ndarray]], placed: list[Reuse], drops: list[int]) -> None:
        assert self.on_event is not None
        bs = self.tokens_per_block
        if drops:
            self.on_event(removed_event(drops))
        for (_, ids), reuse in zip(prompts, placed, strict=True):
            kept = [(block, ids[p * bs : (p + 1) * bs]) for p, block in reuse.keep]
            if kept:
                first = reuse.keep[0][0]
                parent = self.index.block_at(ids, first - 1) if first > 0 else None
                self.on_event(stored_event(parent, kept))

    def forget(self) -> None:
        """A step failed: no block is trusted any more; the next plan drops them all on every rank."""
        self._forgotten += self.index.evict_to(0)
