"""How the gateway and `hpc.client` choose a replica for a prompt: the routing modes (hpc/spec/limits.py
`ROUTING_MODES`), each an object that says what the balancer (hpc/serving/balancer.py) is given per request.

- `cache` (the default): the longest cached prefix against load. Each replica's cache is known from its engine's
  KV-cache events where it sends them (hpc/serving/kv_events.py follows them; the prompt is tokenized with the
  deployment's tokenizer to match its blocks), else from the prompts routed there (hpc/serving/prefix_index.py).
  A replica known only the second way while events were wanted is *degraded*, with a reason (`DEGRADED`); the
  gateway shows it as a metric and says it in one log line per change, never silently (TensorRT-LLM's KV router
  falls back to load-only routing without a word: NVIDIA/TensorRT-LLM#14882).
- `prefix`: the prompt's first `prefix_chars` characters as an affinity key (hpc/serving/prefix_homes.py), as
  before cache-aware routing.
- `least`: least outstanding requests. `round_robin`: in turn, for comparisons.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence

from backend.models.tokenizer import RELEASE_GIL_CHARS
from hpc.serving.balancer import Replica, Route, prefix_key
from hpc.serving.prefix_index import (
    CHARS_PER_TOKEN,
    CHUNK_CHARS,
    ROUTED_CAPACITY,
    SENT_TTL_S,
    EventBlocks,
    RoutedPrompts,
    matched,
    text_keys,
    token_keys,
)
from hpc.spec.limits import PREFIX_CHARS, ROUTING

log = logging.getLogger("hpc_serve.gateway.routing")

#: why a replica's cache is known only from the prompts routed there, though the mode follows engine events
DEGRADED = {
    "no_events": "its model sends no KV-cache events (the image's model, or the engine workflow)",
    "events_off": "its model keeps no KV-cache events (llm_api.kv_cache_config.event_buffer_max_size is 0)",
    "events_failed": "asking its model for KV-cache events failed",
    "no_tokenizer": "the gateway could not tokenize a prompt to match its blocks",
}
#: prefix keys whose continuations are remembered (`CachedPrefix.next_keys`): a few MB
NEXT_KEYS = 1 << 16
#: `next_keys`' mark of a key that several prompts continued differently (no prompt text starts with it)
BRANCHED = "\x00branched"
#: shared prefixes whose text is kept for warming a joining replica (`CachedPrefix.hottest`)
SHARED_TEXTS = 256
#: how many recent requests a prefix's share of the traffic is counted over (an exponential decay)
SHARE_WINDOW = 128
_DECAY = 1 - 1 / SHARE_WINDOW


def _same_line(before: str, after: str) -> bool:
    """Two continuations of a key are one line of prompts (a conversation that grew) when one starts the other."""
    return before != BRANCHED and (before.startswith(after) or after.startswith(before))


class _Seen:
    """A routed prefix key: what continued it (`BRANCHED` once prompts continued it differently), and how many
    of the recent requests held it (decayed by `_DECAY` per request since `at`)."""

    __slots__ = ("after", "hits", "at")

    def __init__(self, after: str, at: int) -> None:
        self.after, self.hits, self.at = after, 0.0, at

    def share(self, requests: int, total: float) -> float:
        return self.hits * _DECAY ** (requests - self.at) / total if total else 0.0


class RoutingMode:
    """A routing mode: what the balancer is given for a prompt. This base is least outstanding."""

    name = "least"
    #: without an affinity the balancer takes the replica chosen longest ago, not the least loaded
    round_robin = False
    #: it follows the replicas' KV-cache events (hpc/serving/kv_events.py)
    follows_events = False

    def prefix_key(self, prompt: str | None) -> str | None:
        """The prefix affinity key of `prompt` (hpc/serving/prefix_homes.py), if this mode has one."""
        return None

    def route(self, prompt: str | None) -> Callable[[], Awaitable[Route | None]] | None:
        """What scores the replicas for `prompt` (awaited once, by the retry rule), if this mode does."""
        return None


class RoundRobin(RoutingMode):
    name = "round_robin"
    round_robin = True


class PrefixChars(RoutingMode):
    """The first `chars` characters as the affinity key (0: none, least outstanding)."""

    name = "prefix"

    def __init__(self, chars: int = PREFIX_CHARS) -> None:
        self.chars = chars

    def prefix_key(self, prompt: str | None) -> str | None:
        return prefix_key(prompt, self.chars) if prompt is not None else None


class CachedPrefix(RoutingMode):
    """The longest cached prefix against load: each replica's blocks from its KV-cache events (`follow`), or its
    routed prompts, and which replicas are degraded and why (`degraded`)."""

    name = "cache"

    def __init__(
        self,
        tokenize: Callable[[str], Sequence[int]] | None = None,
        follows_events: bool = True,
        capacity: int = ROUTED_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tokenize = tokenize
        self.follows_events = follows_events
        self.capacity = capacity
        self.clock = clock
        #: per replica whose events are followed, the prompts sent there in the last SENT_TTL_S (not in its
        #: events yet): two requests of one new prefix that come together meet on one replica
        self.sent: dict[str, RoutedPrompts] = {}
        self.blocks: dict[str, EventBlocks] = {}
        self.prompts: dict[str, RoutedPrompts] = {}
        self.degraded: dict[str, str] = {}
        #: the last tokenizer failure (every followed replica is degraded meanwhile)
        self.tokenizer_error: str | None = None
        #: events lost between two reads (the replica's index was reset), per replica
        self.events_lost: dict[str, int] = {}
        #: each routed prefix key → what continued it and how often it is routed (`_Seen`), least recent out
        self.next_keys: OrderedDict[int, _Seen] = OrderedDict()
        #: requests routed, and their count decayed as each key's `hits` is (`_Seen.share`'s denominator)
        self.requests, self.decayed = 0, 0.0
        #: the text of each shared prefix lately routed (up to its deepest branch point), for warming a replica
        #: that joins (`hottest`)
        self.shared_texts: OrderedDict[int, str] = OrderedDict()

    # ------------------------------------------------------------------ what each replica holds
    def follow(self, replica_key: str, events: Sequence[dict]) -> None:
        """The replica's new KV-cache events (oldest first): its cache is now known from them."""
        blocks = self.blocks.setdefault(replica_key, EventBlocks())
        if not blocks.apply(events):
            self.events_lost[replica_key] = self.events_lost.get(replica_key, 0) + 1
            log.warning(
                "replica %s: KV-cache events were lost between two reads (its model keeps only the latest); "
                "its index starts again from the newest",
                replica_key,
            )
        self._set_degraded(replica_key, None)

    def unfollowed(self, replica_key: str, reason: str, detail: str = "") -> None:
        """The replica's cache can be known only from the prompts routed there, for `reason` (`DEGRADED`)."""
        self.blocks.pop(replica_key, None)
        self._set_degraded(replica_key, reason, detail)

    def retain(self, replica_keys: Iterable[str]) -> None:
        """Forget the replicas not in `replica_keys` (gone from discovery)."""
        keep = set(replica_keys)
        for table in (self.blocks, self.prompts, self.sent, self.degraded, self.events_lost):
            for key in [k for k in table if k not in keep]:
                del table[key]

    def _set_degraded(self, replica_key: str, reason: str | None, detail: str = "") -> None:
        before = self.degraded.get(replica_key)
        if reason == before:
            return
        if reason is None:
            del self.degraded[replica_key]
            log.info("replica %s: routing follows its KV-cache events again", replica_key)
            return
        self.degraded[replica_key] = reason
        log.warning(
            "replica %s: routing by the prompts sent there, not its cache: %s%s",
            replica_key,
            DEGRADED[reason],
            f" ({detail})" if detail else "",
        )

    def degraded_reasons(self) -> dict[str, str]:
        """Replica key → why it is routed by its routed prompts only (`DEGRADED`), while this mode follows events."""
        if not self.follows_events:
            return {}
        if self.tokenizer_error is not None:
            return {**self.degraded, **dict.fromkeys(self.blocks, "no_tokenizer")}
        return dict(self.degraded)

    def hottest(self, count: int) -> list[str]:
        """The `count` shared prefixes the most recent requests held, hottest first (a joining replica is sent
        them before it takes requests: hpc/serving/warmup.py)."""
        shares = []
        for key, text in self.shared_texts.items():
            seen = self.next_keys.get(key)
            if seen is not None:
                shares.append((seen.share(self.requests, self.decayed), text))
        shares.sort(key=lambda pair: -pair[0])
        return [text for _, text in shares[:count]]

    def tokens_per_block(self) -> int:
        """The block size the followed replicas' events show (0 before any)."""
        return max((b.tokens_per_block for b in self.blocks.values()), default=0)

    # ------------------------------------------------------------------ a prompt
    def route(self, prompt: str | None) -> Callable[[], Awaitable[Route | None]] | None:
        return None if prompt is None else functools.partial(self.scored, prompt)

    async def scored(self, prompt: str) -> PromptRoute:
        """`prompt` as the balancer scores it; tokenized only when some replica's events are followed (a long
        prompt on a worker thread, where the tokenizer releases the GIL: docs/decisions.md "The gateway's own
        time")."""
        block = self.tokens_per_block()
        ids: Sequence[int] | None = None
        if block and self.tokenize is not None:
            try:
                if len(prompt) >= RELEASE_GIL_CHARS:
                    ids = await asyncio.to_thread(self.tokenize, prompt)
                else:
                    ids = self.tokenize(prompt)
            except Exception as exc:  # noqa: BLE001 - routed by the prompts sent, and said so
                if self.tokenizer_error is None:
                    log.warning("routing by the prompts sent, not the replicas' caches: tokenizing failed: %s", exc)
                self.tokenizer_error = f"{type(exc).__name__}: {exc}"
            else:
                if self.tokenizer_error is not None:
                    log.info("routing follows the replicas' KV-cache events again: a prompt was tokenized")
                self.tokenizer_error = None
        return PromptRoute(self, prompt, ids, block)


class PromptRoute:
    """A prompt's `Route` (hpc/serving/balancer.py): its tokens each replica holds, from that replica's events
    (whole blocks of its token ids) or from its routed prompts (whole chunks of its text, as tokens).

    Its hot shared part counts as held by every replica: up to the last prefix key that routed prompts continued
    in different ways (a system prompt, a document several questions follow) and that more than 1/R of the recent
    requests held (R the replicas that take it). Why: a prefix that more than a replica's share of the traffic
    starts with cannot live on one replica without overloading it, so it is worth one prefill on each (else the
    first replica that computed it wins every prompt that starts with it: a deployment whose chats share one
    system prompt would run on one replica); a colder one (one document of many) stays where it is cached, and
    so does what only one line of prompts continues, a conversation's own history."""

    def __init__(self, mode: CachedPrefix, prompt: str, ids: Sequence[int] | None, block: int) -> None:
        self.mode = mode
        self.prompt = prompt
        self.text_keys = text_keys(prompt)
        #: the text that follows each key in this prompt: the next chunk, after the last key what is left
        self.next_of = [prompt[(i + 1) * CHUNK_CHARS : (i + 2) * CHUNK_CHARS] for i in range(len(self.text_keys))]
        self.block = block
        self.token_keys = token_keys(ids, block) if ids is not None and block else None
        self.prompt_tokens = max(1, len(ids) if ids is not None else len(prompt) // CHARS_PER_TOKEN)
        self.prefill = self.prompt_tokens
        # as tokens as a match of routed prompts counts them
        self.per_char = len(ids) / max(1, len(prompt)) if ids is not None else 1 / CHARS_PER_TOKEN
        branches = self._branches()
        #: the prompt's branch points, deepest last: (its tokens up to there, the share of requests that hold it)
        self.shared = [(int(chunks * CHUNK_CHARS * self.per_char), share) for chunks, share in branches]
        #: the deepest, in chunks (0: none)
        self.shared_chunks = branches[-1][0] if branches else 0

    def _branches(self) -> list[tuple[int, float]]:
        """The prompt's keys that routed prompts continued otherwise than this one: (chunks up to it, its share)."""
        mode = self.mode
        found = []
        for i, (key, mine) in enumerate(zip(self.text_keys, self.next_of, strict=True)):
            seen = mode.next_keys.get(key)
            if seen is not None and mine and not _same_line(seen.after, mine):  # BRANCHED, or another continuation
                found.append((i + 1, seen.share(mode.requests, mode.decayed)))
        return found

    def cached_tokens(self, replica: Replica, among: int = 1) -> int:
        """What the balancer counts as held among `among` replicas: the replica's real match, or the deepest
        shared part more than 1/`among` of the recent requests held."""
        hot = [tokens for tokens, share in self.shared if share * among > 1]
        return max(self.held_tokens(replica), hot[-1] if hot else 0)

    def held_tokens(self, replica: Replica) -> int:
        """The prompt's tokens the replica's cache holds (its events, or sent there in the last SENT_TTL_S), or
        was sent (its routed prompts)."""
        blocks = self.mode.blocks.get(replica.key)
        if blocks is not None and self.token_keys is not None and blocks.tokens_per_block in (0, self.block):
            sent = self.mode.sent.get(replica.key)
            recent = matched(self.text_keys, sent) * CHUNK_CHARS * self.per_char if sent is not None else 0
            return max(matched(self.token_keys, blocks) * self.block, int(recent))
        prompts = self.mode.prompts.get(replica.key)
        return matched(self.text_keys, prompts) * CHUNK_CHARS // CHARS_PER_TOKEN if prompts is not None else 0

    def assigned(self, replica: Replica) -> int:
        prompts = self.mode.prompts.get(replica.key)
        return len(prompts) if prompts is not None else 0

    def routed(self, replica: Replica) -> None:
        self.prefill = max(0, self.prompt_tokens - self.held_tokens(replica))
        prompts = self.mode.prompts.get(replica.key)
        if prompts is None:
            prompts = self.mode.prompts[replica.key] = RoutedPrompts(self.mode.capacity)
        prompts.add(self.text_keys)
        mode = self.mode
        if replica.key in mode.blocks:
            sent = mode.sent.get(replica.key)
            if sent is None:
                sent = mode.sent[replica.key] = RoutedPrompts(mode.capacity, SENT_TTL_S, mode.clock)
            sent.add(self.text_keys)
        mode.requests += 1
        mode.decayed = mode.decayed * _DECAY + 1
        seen = mode.next_keys
        for key, after in zip(self.text_keys, self.next_of, strict=True):
            entry = seen.get(key)
            if entry is None:
                entry = seen[key] = _Seen(after, mode.requests)
            elif after and not _same_line(entry.after, after):
                entry.after = BRANCHED if entry.after else after
            elif len(after) > len(entry.after) and entry.after != BRANCHED:
                entry.after = after
            entry.hits = entry.hits * _DECAY ** (mode.requests - entry.at) + 1
            entry.at = mode.requests
            seen.move_to_end(key)
        while len(seen) > NEXT_KEYS:
            seen.popitem(last=False)
        if self.shared_chunks:
            texts = mode.shared_texts
            texts[self.text_keys[self.shared_chunks - 1]] = self.prompt[: self.shared_chunks * CHUNK_CHARS]
            texts.move_to_end(self.text_keys[self.shared_chunks - 1])
            while len(texts) > SHARED_TEXTS:
                texts.popitem(last=False)


#: mode name → how to make it (hpc/spec/limits.py `ROUTING_MODES` names the same)
MODES: dict[str, Callable[..., RoutingMode]] = {
    "cache": CachedPrefix,
    "prefix": PrefixChars,
    "least": RoutingMode,
    "round_robin": RoundRobin,
}


def routing_mode(
    name: str = ROUTING,
    prefix_chars: int = PREFIX_CHARS,
    tokenize: Callable[[str], Sequence[int]] | None = None,
    follows_events: bool = True,
) -> RoutingMode:
    """The mode `name` (`MODES`): `prefix_chars` for `prefix`; `tokenize` (the deployment's tokenizer, special
    tokens as the engine adds them) and `follows_events` (whether anything follows the replicas' events) for
    `cache`. `prefix_chars` 0 keeps the meaning it had before there were modes: affinity off, least outstanding,
    whatever the mode."""
    if prefix_chars == 0:
        return RoutingMode()
    if name == "cache":
        return CachedPrefix(tokenize, follows_events)
    if name == "prefix":
        return PrefixChars(prefix_chars)
    if name not in MODES:
        raise ValueError(f"routing mode {name!r}: one of {', '.join(MODES)}")
    return MODES[name]()
