"""Cache-aware routing without I/O: the prefix index (hpc/serving/prefix_index.py) from KV-cache events and from
routed prompts, the `cache` mode's scoring in the balancer (hpc/serving/routing.py, balancer.py `_by_route`) on
replayed multi-turn traces, and a mode that degrades saying so (its log line and the gateway's metric). The engine
side of the events (what the CPU engine really sends): tests/test_gateway_routing_events.py."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from hpc.serving.balancer import Balancer, Replica
from hpc.serving.prefix_index import CHUNK_CHARS, EventBlocks, RoutedPrompts, matched, text_keys, token_keys
from hpc.serving.routing import CachedPrefix, PrefixChars, routing_mode
from tests.test_balancer import Clock, _replicas

BLOCK = 4


def _stored(event_id: int, parent: int | None, blocks: list[tuple[int, list[int]]]) -> dict:
    """TensorRT-LLM's envelope of a "stored" event (as backend/cpu_engine/prefix_cache.py `stored_event` makes it)."""
    data = {
        "type": "stored",
        "parent_hash": parent,
        "blocks": [
            {"type": "stored_block", "block_hash": h, "tokens": [{"type": "unique_token", "token_id": t} for t in toks]}
            for h, toks in blocks
        ],
    }
    return {"event_id": event_id, "data": data}


def _event(event_id: int, data: dict) -> dict:
    return {"event_id": event_id, "data": data}


# ------------------------------------------------------------------------------------ the index from events
def test_stored_blocks_are_matched_by_their_tokens_not_the_engines_hashes():
    blocks = EventBlocks()
    prompt = list(range(13))  # 3 full blocks of 4, and 1 token more
    assert blocks.apply(
        [_stored(0, None, [(900, prompt[0:4]), (901, prompt[4:8])]), _stored(1, 901, [(77, prompt[8:12])])]
    )
    keys = token_keys(prompt, BLOCK)
    assert len(keys) == 3 and blocks.tokens_per_block == BLOCK
    assert matched(keys, blocks) == 3
    other = [0, 1, 2, 3, 9, 9, 9, 9]
    assert matched(token_keys(other, BLOCK), blocks) == 1, "the same first block, then another"
    # another engine's hashes for the same tokens: the same keys (our own chain)
    again = EventBlocks()
    again.apply([_stored(5, None, [(1, prompt[0:4]), (2, prompt[4:8]), (3, prompt[8:12])])])
    assert [k for k in keys if k in again] == keys


def test_removed_blocks_shorten_the_match_and_created_resets():
    blocks = EventBlocks()
    prompt = list(range(12))
    blocks.apply([_stored(0, None, [(1, prompt[0:4]), (2, prompt[4:8]), (3, prompt[8:12])])])
    blocks.apply([_event(1, {"type": "removed", "block_hashes": [3]})])
    assert matched(token_keys(prompt, BLOCK), blocks) == 2
    blocks.apply([_event(2, {"type": "created", "num_blocks_per_cache_level": [10, 0]})])
    assert matched(token_keys(prompt, BLOCK), blocks) == 0 and len(blocks) == 0


def test_a_block_whose_parent_is_unknown_is_not_indexed():
    blocks = EventBlocks()
    blocks.apply([_stored(0, 555, [(1, [1, 2, 3, 4])])])
    assert len(blocks) == 0


def test_events_lost_between_two_reads_reset_the_index_and_say_so():
    blocks = EventBlocks()
    prompt = list(range(8))
    assert blocks.apply([_stored(0, None, [(1, prompt[0:4])])])
    assert blocks.apply([_stored(0, None, [(1, prompt[0:4])])]), "an event already followed is skipped"
    assert not blocks.apply([_stored(5, None, [(7, [5, 5, 5, 5])])]), "events 1-4 were lost"
    assert matched(token_keys(prompt, BLOCK), blocks) == 0, "what was held before the gap is not trusted"
    assert matched(token_keys([5, 5, 5, 5], BLOCK), blocks) == 1 and blocks.last_event_id == 5


# ------------------------------------------------------------------------------------ routed prompts
def test_routed_prompts_match_by_chunks_and_trim_a_prefix_from_its_end():
    held = RoutedPrompts(capacity=4)
    a = "a" * (3 * CHUNK_CHARS)
    held.add(text_keys(a))
    assert matched(text_keys(a + "question"), held) == 3
    assert matched(text_keys("b" + a), held) == 0
    held.add(text_keys("z" * (2 * CHUNK_CHARS)))  # 5 chunks held: the least recent goes, a's last
    assert matched(text_keys(a), held) == 2


# ------------------------------------------------------------------------------------ the policy on traces
def _chat_trace(conversations: int, turns: int, seed: int = 0) -> list[tuple[int, str]]:
    """Interleaved turns of conversations that open with one long system prompt; each turn's prompt holds the
    conversation so far (earlier answers included)."""
    rng = random.Random(seed)
    system = "You are a careful assistant. " * 60
    history = {
        c: f"{system}\nUser {c}: " + f"my question number {c} is this. " * 8 + "\n" for c in range(conversations)
    }
    order = [c for _ in range(turns) for c in rng.sample(range(conversations), conversations)]
    trace = []
    for c in order:
        trace.append((c, history[c]))
        history[c] += f"Assistant: answer {rng.random():.6f} " * 8 + f"\nUser {c}: and then?\n"
    return trace


def _replay(mode, trace, replicas: int, concurrent: int) -> tuple[dict[int, set[str]], dict[str, int]]:
    """Route `trace` with `concurrent` requests in flight (the oldest ends as the next comes): each
    conversation's replicas, and requests per replica."""
    b = Balancer(clock=Clock(), round_robin=mode.round_robin)
    b.update(_replicas(*[f"r{i}" for i in range(replicas)]))
    held: list = []
    where: dict[int, set[str]] = {}
    count: dict[str, int] = {}

    async def one(prompt: str) -> Replica:
        route = mode.route(prompt)
        return b.pick(prefix_key=mode.prefix_key(prompt), route=await route() if route else None)

    for conversation, prompt in trace:
        replica = asyncio.run(one(prompt))
        where.setdefault(conversation, set()).add(replica.key)
        count[replica.key] = count.get(replica.key, 0) + 1
        track = b.track(replica)
        track.__enter__()
        held.append(track)
        if len(held) > concurrent:
            held.pop(0).__exit__(None, None, None)
    return where, count


@pytest.mark.parametrize("replicas", [2, 4])
def test_cache_routing_keeps_each_conversation_on_one_replica_and_uses_them_all(replicas):
    trace = _chat_trace(16, 4)
    where, count = _replay(CachedPrefix(follows_events=False), trace, replicas, concurrent=replicas)
    assert all(len(r) == 1 for r in where.values()), where
    assert len(count) == replicas and max(count.values()) <= 2 * min(count.values()), count


def test_documents_each_asked_several_questions_stay_on_one_replica_each():
    """A document is a shared prefix too, but a cold one (1/16 of the requests): it is not worth a prefill on every
    replica, so its questions meet where it is cached, and the documents spread over the replicas."""
    rng = random.Random(1)
    docs = [
        f"Document {d}: " + " ".join(rng.choice(["river", "budget", "harbor", "data"]) for _ in range(80))
        for d in range(16)
    ]
    trace = [(d, f"{docs[d]}\nQuestion {q}: what is it about?") for d in range(16) for q in range(8)]
    rng.shuffle(trace)
    where, count = _replay(CachedPrefix(follows_events=False), trace, 2, concurrent=4)
    moved = sum(len(r) - 1 for r in where.values())
    assert moved <= 2, where
    assert len(count) == 2 and max(count.values()) <= 2 * min(count.values()), count


def test_todays_prefix_key_sends_every_conversation_of_one_system_prompt_to_one_replica():
    trace = _chat_trace(16, 4)
    _, count = _replay(PrefixChars(), trace, 2, concurrent=1)
    assert len(count) == 1, "one key for every request"


def test_the_bound_spills_a_conversation_when_its_replica_is_too_busy():
    b = Balancer(clock=Clock(), load_slack=1)
    b.update(_replicas("a", "b"))
    mode = CachedPrefix(follows_events=False)
    prompt = "a long shared history " * 40

    async def pick() -> Replica:
        return b.pick(route=await mode.scored(prompt))

    first = asyncio.run(pick())
    holds = [b.track(first) for _ in range(3)]
    for h in holds:
        h.__enter__()
    assert asyncio.run(pick()) is not first, "over the bound: the other replica, though it holds nothing"
    assert b.outcomes["spilled"] == 1


def test_the_prefill_queued_breaks_ties_but_never_outweighs_what_a_replica_holds():
    """Within the bound, the replica holding the prompt keeps it however much prefill is queued there (counted,
    it cost conversations their history: docs/decisions.md "Routing by the longest cached prefix"); among
    replicas holding alike, the least queued."""
    b = Balancer(clock=Clock(), load_slack=8)
    b.update(_replicas("a", "b", "c"))
    mode = CachedPrefix(follows_events=False)
    prompt = "x" * (8 * CHUNK_CHARS)

    async def route(text: str = prompt):
        return await mode.scored(text)

    first = b.pick(route=asyncio.run(route()))
    with b.track(first, prefill=10_000):
        assert b.pick(route=asyncio.run(route())) is first, "it holds the whole prompt"
        b.replicas[1].prefill_queued = 500  # of the two holding nothing of a new prompt, the less queued
        other = b.pick(route=asyncio.run(route("y" * (8 * CHUNK_CHARS))))
        assert other is b.replicas[2]


def test_a_prompt_sent_counts_as_held_until_its_events_could_have_shown_it():
    """Where events are followed, a prompt just sent is not in them yet: for SENT_TTL_S it counts as held (by the
    fake clock), so the next request of that new prefix meets it there; then only the events say."""
    from hpc.serving.prefix_index import SENT_TTL_S

    clock = Clock()
    mode = CachedPrefix(lambda text: [ord(c) for c in text], clock=clock)
    b = Balancer(clock=clock)
    b.update(_replicas("a", "b"))
    for key in ("a", "b"):
        mode.follow(key, [_stored(0, None, [(1, [1, 2, 3, 4])])])  # followed, holding something else
    prompt = "a new document " * 30

    async def route():
        return await mode.scored(prompt + f" question {clock.now}")

    first = b.pick(route=asyncio.run(route()))
    assert asyncio.run(route()).held_tokens(first) > 0
    assert b.pick(route=asyncio.run(route())) is first
    clock.now += SENT_TTL_S
    assert asyncio.run(route()).held_tokens(first) == 0, "its events never showed it"


# ------------------------------------------------------------------------------------ degraded, said so
def test_a_replica_without_events_is_degraded_with_one_log_line_and_recovers(caplog):
    mode = CachedPrefix()
    with caplog.at_level(logging.INFO, logger="hpc_serve.gateway.routing"):
        mode.unfollowed("j/0", "events_failed", "UNAVAILABLE")
        mode.unfollowed("j/0", "events_failed", "UNAVAILABLE")
        assert mode.degraded_reasons() == {"j/0": "events_failed"}
        mode.follow("j/0", [_stored(0, None, [(1, [1, 2, 3, 4])])])
    assert mode.degraded_reasons() == {}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "asking its model for KV-cache events failed (UNAVAILABLE)" in lines[0], lines
    assert "follows its KV-cache events again" in lines[1]


def test_a_failing_tokenizer_degrades_every_followed_replica():
    def broken(text: str) -> list[int]:
        raise RuntimeError("no tokenizer.json")

    mode = CachedPrefix(broken)
    mode.follow("j/0", [_stored(0, None, [(1, [1, 2, 3, 4])])])
    route = asyncio.run(mode.scored("a prompt"))
    assert route.token_keys is None and mode.degraded_reasons() == {"j/0": "no_tokenizer"}


def test_the_client_mode_that_follows_no_events_is_never_degraded():
    mode = CachedPrefix(follows_events=False)
    mode.unfollowed("j/0", "no_events")
    assert mode.degraded_reasons() == {}


def test_the_gateway_metric_names_each_degraded_replica_and_why():
    from prometheus_client import generate_latest

    from hpc.gateway.metrics import Metrics

    b = Balancer()
    b.update(_replicas("j/0", "j/1"))
    mode = routing_mode("cache")
    assert isinstance(mode, CachedPrefix)
    mode.unfollowed("j/1", "events_off")
    mode.follow("j/0", [_stored(0, None, [(1, [1, 2, 3, 4])])])
    mode.follow("j/0", [_stored(7, None, [(2, [5, 6, 7, 8])])])  # events 1-6 lost
    registry = Metrics(lambda: b, mode.degraded_reasons, lambda: mode.events_lost).registry
    text = generate_latest(registry).decode()
    rows = [line for line in text.splitlines() if line.startswith("hpc_serve_gateway_replica_routing_degraded{")]
    assert rows == ['hpc_serve_gateway_replica_routing_degraded{reason="events_off",replica="j/1"} 1.0']
    lost = [line for line in text.splitlines() if line.startswith("hpc_serve_gateway_replica_kv_events_lost_total{")]
    assert lost == ['hpc_serve_gateway_replica_kv_events_lost_total{replica="j/0"} 1.0']


def test_routing_modes_by_name():
    assert routing_mode("round_robin").round_robin and routing_mode("least").route("p") is None
    assert routing_mode("prefix", prefix_chars=3).prefix_key("abcd") == "abc"
    with pytest.raises(ValueError, match="one of cache, prefix"):
        routing_mode("fastest")


# ------------------------------------------------------------------------------------ a joining replica's warm-up
class HeldEngine:
    """Answers each generation with one piece once `release` is set; records the prompts it was sent."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.release = asyncio.Event()

    async def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        from hpc.serving.model_io import Chunk

        self.prompts.append(params.prompt)
        await self.release.wait()
        yield Chunk("x", 1, finish_reason="length")


def test_a_replica_that_joins_gets_the_hottest_shared_prefix_before_it_takes_requests():
    from hpc.serving.warmup import Warmer

    mode = CachedPrefix(follows_events=False)
    b = Balancer(clock=Clock())
    (a,) = _replicas("a")
    b.update([a])
    trace = _chat_trace(4, 1)
    for _, prompt in trace:
        b.pick(route=asyncio.run(mode.scored(prompt)))
    system = trace[0][1].split("\nUser")[0]
    (hot,) = mode.hottest(8)
    assert system.startswith(hot) and len(hot) > len(system) - CHUNK_CHARS, "the system prompt, to its last chunk"

    async def main() -> None:
        engine = HeldEngine()
        warmer = Warmer(mode, b, engine, lambda _r: None)  # type: ignore[arg-type]
        warmer.joined(b.replicas)  # the first look: the deployment as it is, nothing to warm
        assert not warmer.tasks
        joining = _replicas("b")[0]
        b.update([a, joining])
        warmer.joined(b.replicas)
        assert joining.warming and [r.key for r in b.takers()] == ["a"], "no requests while it warms"
        engine.release.set()
        await asyncio.gather(*warmer.tasks)
        assert not joining.warming and warmer.warmed == {"b": 1} and engine.prompts == [hot]
        assert {r.key for r in b.takers()} == {"a", "b"}

    asyncio.run(main())


def test_a_lone_replica_is_never_held_back_by_a_warm_up():
    from hpc.serving.warmup import Warmer

    mode = CachedPrefix(follows_events=False)
    b = Balancer(clock=Clock())
    warmer = Warmer(mode, b, HeldEngine(), lambda _r: None)  # type: ignore[arg-type]
    warmer.joined([])
    (only,) = _replicas("a")
    b.update([only])
    warmer.joined(b.replicas)
    assert not only.warming and not warmer.tasks
