"""What each replica's KV cache holds, and for a prompt, each replica's longest cached prefix: what cache-aware
routing (hpc/serving/routing.py) scores replicas by. Pure logic, no I/O.

One structure for both sources: a prefix is a chain of units (a unit's key hashes the key before it and the
unit's own content, so a key stands for the whole prefix up to its end, as TensorRT-LLM's block hashes do), and a
replica holds a set of keys. A prompt's match on a replica is how many of its leading keys the replica holds.

- `EventBlocks`: from the replica's own KV-cache events (TensorRT-LLM's "stored", "removed", "created" data,
  which hpc-serve's llmapi model hands out as `kv_cache_events_since`): units are the engine's blocks of
  `tokens_per_block` token ids. The key is our own chain over the tokens, not the engine's `block_hash`, which
  another engine (or another release) computes otherwise; the engine's hash only names a block for its "removed"
  event and as the next block's parent. Dynamo's KV router does the same (a local hash of each block's tokens,
  `compute_block_hash_for_seq`, as `ai-dynamo/dynamo/lib/llm/src/kv_router/approx.rs`@17cf2360 uses it).
- `RoutedPrompts`: where a replica sends no events (the image's model.py, events off, the engine workflow), the
  prompts routed there, as SGLang's cache-aware router keeps them (an approximate radix tree of the text each
  worker was sent, trimmed least recently used first to a size:
  `sgl-project/sglang/sgl-router/src/policies/cache_aware.rs`@026f853b; Dynamo's approximate indexer likewise
  records each routing decision as if the worker had stored the prompt's blocks: `approx.rs` above).
  Units are `CHUNK_CHARS` characters instead of single ones: the same answer to within a chunk (a KV block is
  ~100 characters of English anyway), a dict lookup per chunk instead of a tree walk per character in Python.
  Trimmed to `capacity` chunks, an estimate of what the cache holds; a prefix is touched last to first, so
  trimming shortens a prefix from its end, as an engine's LRU eviction of blocks does.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: characters per unit of the routed-prompts index: about one KV block of English text (32 tokens)
CHUNK_CHARS = 64
#: characters per token, to compare a character match with token counts where no tokenizer is at hand
CHARS_PER_TOKEN = 4
#: chunks a routed-prompts index keeps per replica when nothing better is known: ~32k tokens of prompts
ROUTED_CAPACITY = 2048
#: how long a prompt sent to a replica whose events are followed counts as held before its events say so: its
#: prefill and the next ask of its events (every 0.5 s) take less on a replica that keeps up
SENT_TTL_S = 2.0


def chain(parent: int, content: tuple[int, ...] | str) -> int:
    """The key of a unit whose prefix has key `parent` (0 at the start). Python's own hash (64 bits, a few
    hundred nanoseconds for a block, where a cryptographic one cost 5-15 us): keys are compared only within the
    process that made them, so its per-process seed for strings does not matter."""
    return hash((parent, content))


def token_keys(token_ids: Sequence[int], tokens_per_block: int) -> list[int]:
    """The chained keys of the full blocks of `token_ids` (a partial last block is never cached)."""
    keys, parent = [], 0
    for end in range(tokens_per_block, len(token_ids) + 1, tokens_per_block):
        parent = chain(parent, tuple(token_ids[end - tokens_per_block : end]))
        keys.append(parent)
    return keys


def text_keys(text: str, chunk: int = CHUNK_CHARS) -> list[int]:
    """The chained keys of the full `chunk`-character pieces of `text`."""
    keys, parent = [], 0
    for end in range(chunk, len(text) + 1, chunk):
        parent = chain(parent, text[end - chunk : end])
        keys.append(parent)
    return keys


def matched(keys: Sequence[int], held: Any) -> int:
    """How many of `keys` (a prompt's, in order) `held` (a container of keys) holds from the start on."""
    n = 0
    for key in keys:
        if key not in held:
            break
        n += 1
    return n


class EventLog(ValueError):
    """An event this index cannot follow (its words say why); the replica's index is reset."""


class EventBlocks:
    """One replica's cached blocks, as its KV-cache events say: our chained key per engine block hash."""

    def __init__(self) -> None:
        self.tokens_per_block = 0  # learnt from the first stored block
        self.last_event_id = -1
        self._by_engine: dict[Any, int] = {}
        self._held: dict[int, int] = {}  # key → how many engine blocks have it (two engines' blocks may)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def reset(self) -> None:
        self._by_engine.clear()
        self._held.clear()

    def apply(self, events: Iterable[dict[str, Any]]) -> bool:
        """Follow `events` (TensorRT-LLM's envelopes: event_id, data), oldest first. False when some were lost
        between the last one followed and these (the model keeps only its latest): the index was then reset,
        since a "removed" may be among the lost, and follows on from these."""
        complete = True
        for event in events:
            event_id = int(event.get("event_id", -1))
            if event_id <= self.last_event_id:
                continue
            if self.last_event_id >= 0 and event_id != self.last_event_id + 1:
                self.reset()
                complete = False
            self.last_event_id = event_id
            self._apply(event.get("data") or {})
        return complete

    def _apply(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "created":  # a (new) cache: nothing held
            self.reset()
        elif kind == "stored":
            parent_hash = data.get("parent_hash")
            parent = 0 if parent_hash is None else self._by_engine.get(parent_hash)
            if parent is None:  # its prefix is not known here (removed, or stored before we followed)
                return
            for block in data.get("blocks") or []:
                tokens = [int(t["token_id"]) for t in block.get("tokens") or []]
                if not tokens:
                    return
                self.tokens_per_block = self.tokens_per_block or len(tokens)
                parent = chain(parent, tuple(tokens))
                self._by_engine[block.get("block_hash")] = parent
                self._held[parent] = self._held.get(parent, 0) + 1
        elif kind == "removed":
            for engine_hash in data.get("block_hashes") or []:
                key = self._by_engine.pop(engine_hash, None)
                if key is not None:
                    left = self._held.get(key, 0) - 1
                    if left > 0:
                        self._held[key] = left
                    else:
                        self._held.pop(key, None)
        # "updated" (a block's priority or cache level) changes nothing a router needs


class RoutedPrompts:
    """One replica's prompts routed there (chained `CHUNK_CHARS` keys), least recently used out past `capacity`,
    and with `ttl_s` each for that long only (by `clock`): where the replica's events are followed, what was sent
    there but is not in its events yet (its prefill has not run, or the events were not asked for since)."""

    def __init__(
        self, capacity: int = ROUTED_CAPACITY, ttl_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._clock = clock
        self._held: OrderedDict[int, float] = OrderedDict()  # key → when it was routed last

    def __len__(self) -> int:
        self._expire()
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        at = self._held.get(key)  # type: ignore[call-overload]
        return at is not None and (self.ttl_s is None or self._clock() - at < self.ttl_s)

    def add(self, keys: Sequence[int]) -> None:
        """The prompt of `keys` was routed here: its chunks are the most recently used, its first one last."""
        now = self._clock()
        for key in reversed(keys):
            self._held[key] = now
            self._held.move_to_end(key)
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)
        self._expire()

    def _expire(self) -> None:
        if self.ttl_s is None:
            return
        now = self._clock()
        while self._held and now - next(iter(self._held.values())) >= self.ttl_s:
            self._held.popitem(last=False)
