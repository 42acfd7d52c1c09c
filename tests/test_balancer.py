"""The routing policy (hpc/serving/balancer.py), pure: least outstanding, prefix affinity with bounded load,
draining replicas, the admission bound. Shared by the gateway and the Python client."""

from __future__ import annotations

import math

import pytest

from hpc.serving.balancer import Balancer, NoReplica, Replica, Saturated, prefix_key


def _replicas(*keys: str) -> list[Replica]:
    return [Replica(key=k, http_url=f"http://{k}", grpc_url=k) for k in keys]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_balancer_picks_the_least_outstanding_and_spreads_ties():
    b = Balancer()
    b.update(_replicas("j1/0", "j1/1", "j2/0"))
    held = []
    for _ in range(3):
        r = b.pick()
        held.append(b.track(r))
        held[-1].__enter__()
    assert sorted(r.key for r in b.replicas if r.outstanding == 1) == ["j1/0", "j1/1", "j2/0"]
    held[1].__exit__(None, None, None)  # j1/1 finished: it is the least busy now
    assert b.pick().key == "j1/1"
    assert b.pick(exclude=["j1/1"]).key == "j1/0", "a tie: the one chosen longest ago"


def test_balancer_takes_turns_among_idle_replicas_and_a_new_one_joins_the_turns():
    b = Balancer()
    b.update(_replicas("a", "b"))
    assert [b.pick().key for _ in range(4)] == ["a", "b", "a", "b"]
    b.update(_replicas("a", "b", "c"))
    assert [b.pick().key for _ in range(3)] == ["c", "a", "b"]


def test_balancer_benches_a_failed_replica_until_its_cooldown_passed():
    clock = Clock()
    b = Balancer(cooldown_s=10, clock=clock)
    b.update(_replicas("a", "b"))
    b.mark_failed(b.pick(exclude=["b"]))
    assert [r.key for r in b.healthy()] == ["b"] and [b.pick().key for _ in range(3)] == ["b"] * 3
    clock.now = 10.5
    assert {r.key for r in b.healthy()} == {"a", "b"}


def test_benched_replicas_are_tried_when_no_other_is_left_but_never_twice_for_a_request():
    """Every replica benched (one failure each, maybe passing ones): requests still go to them instead of 503s for
    the whole cooldown; not to a draining one, and not again to one this request was already sent to."""
    b = Balancer(cooldown_s=10, clock=Clock())
    b.update(_replicas("a", "b", "c"))
    b.set_draining("c")
    b.mark_failed(b.pick(exclude=["b"]))
    assert b.pick(exclude=["b"]).key == "a", "only a is left outside b: benched, it is tried"
    b.mark_failed(b.pick())
    assert b.healthy() == [next(r for r in b.replicas if r.key == "c")], "a and b benched, c draining"
    assert {b.pick().key for _ in range(4)} == {"a", "b"}
    assert b.pick(prefix_key="p" * 300).key in {"a", "b"}, "prefix affinity among the benched ones too"
    with pytest.raises(NoReplica):
        b.pick(exclude=["a", "b"])


def test_balancer_update_keeps_counters_and_drops_lost_replicas():
    b = Balancer()
    b.update(_replicas("a", "b"))
    a = b.pick(exclude=["b"])
    with b.track(a):
        b.update(_replicas("a", "c"))  # b's job ended, c's started
        assert {r.key for r in b.replicas} == {"a", "c"}
        assert next(r for r in b.replicas if r.key == "a").outstanding == 1
    with pytest.raises(NoReplica):
        Balancer().pick()


_HELD: list = []  # the open `track` blocks (one that is garbage collected ends its request)


def _hold(b: Balancer, replica: Replica) -> None:
    """Count a request in flight on `replica` until the test ends (what `track` does around a request)."""
    _HELD.append(b.track(replica))
    _HELD[-1].__enter__()


def _by_key(b: Balancer) -> dict[str, Replica]:
    return {r.key: r for r in b.replicas}


def test_prefix_key_is_the_prompts_beginning_and_none_when_too_short_or_off():
    long = "x" * 300
    assert prefix_key(long, 256) == "x" * 256 and prefix_key("short", 256) is None
    assert prefix_key(long, 0) is None, "0 turns affinity off"
    assert prefix_key("a" * 256 + "question 1") == prefix_key("a" * 256 + "question 2")


def test_a_prefix_goes_to_its_own_replica_and_prefixes_spread():
    b = Balancer()
    b.update(_replicas("a", "b", "c"))
    homes = {f"prefix {i}": b.pick(prefix_key=f"prefix {i}").key for i in range(60)}
    assert all(b.pick(prefix_key=k).key == home for k, home in homes.items()), "the same prefix, the same replica"
    counts = {key: list(homes.values()).count(key) for key in "abc"}
    assert min(counts.values()) >= 10, f"rendezvous hashing spreads prefixes over the replicas: {counts}"
    assert b.outcomes["home"] == 120 and b.outcomes["spilled"] == 0


def test_a_replica_joining_or_leaving_moves_only_its_own_prefixes():
    b = Balancer()
    b.update(_replicas("a", "b", "c"))
    before = {f"p{i}": b.pick(prefix_key=f"p{i}").key for i in range(60)}
    b.update(_replicas("a", "b"))  # c's job ended
    after = {k: b.pick(prefix_key=k).key for k in before}
    assert all(after[k] == home for k, home in before.items() if home != "c")
    b.update(_replicas("a", "b", "c", "d"))
    moved = {k for k in before if b.pick(prefix_key=k).key != after[k]}
    assert moved and all(b.pick(prefix_key=k).key in ("c", "d") for k in moved), "only to the new replicas"


def test_a_hot_prefix_spills_once_its_replica_is_over_the_bound_and_comes_back():
    b = Balancer(load_factor=1.25, load_slack=0)
    b.update(_replicas("a", "b", "c"))
    home = b.pick(prefix_key="hot")
    b.outcomes.clear()
    for total in range(1, 31):
        _hold(b, b.pick(prefix_key="hot"))
        loads = [r.outstanding for r in b.replicas]
        assert max(loads) <= math.ceil(1.25 * total / 3), f"no replica above 1.25 x the mean: {loads}"
    assert home.outstanding == max(r.outstanding for r in b.replicas), "the prefix's replica is the busiest"
    assert b.outcomes["home"] == home.outstanding == math.ceil(1.25 * 30 / 3) and b.outcomes["spilled"] == 30 - 13
    others = [r for r in b.replicas if r is not home]
    for r in others:
        r.outstanding = 0  # their requests ended
    home.outstanding = 1
    assert b.pick(prefix_key="hot") is not home, "far over the bound now: it spills"
    home.outstanding = 0
    assert b.pick(prefix_key="hot") is home, "back home once its load is within the bound"


def test_no_prefix_key_is_least_outstanding_even_when_others_have_one():
    b = Balancer()
    b.update(_replicas("a", "b"))
    home = b.pick(prefix_key="p")
    _hold(b, home)
    assert b.pick().key != home.key
    assert b.outcomes["least"] == 1


def test_a_draining_replica_gets_no_new_requests_but_finishes_its_own():
    b = Balancer()
    b.update(_replicas("a", "b"))
    a = _by_key(b)["a"]
    with b.track(a):
        b.set_draining("a")
        assert [r.key for r in b.available()] == ["b"] and {r.key for r in b.healthy()} == {"a", "b"}
        assert {b.pick(prefix_key=f"p{i}").key for i in range(20)} == {"b"}
        assert {b.pick().key for _ in range(4)} == {"b"}
    assert a.outstanding == 0 and a.served == 1, "its request in flight finished and was counted"
    b.set_draining("gone")  # a replica discovery already dropped: nothing to do
    b.update([*_replicas("a"), Replica("b", "http://b", "b", draining=True)])  # discovery's view: b stops now
    assert not _by_key(b)["a"].draining and _by_key(b)["b"].draining
    assert b.pick().key == "a"
    b.set_draining("a")
    with pytest.raises(NoReplica) as exc:
        b.pick()
    assert not isinstance(exc.value, Saturated), "all draining: none ready (503), not busy (429)"


def test_the_admission_bound_refuses_once_every_replica_is_full():
    b = Balancer(max_outstanding=2)
    b.update(_replicas("a", "b"))
    for _ in range(4):
        _hold(b, b.pick(prefix_key="same"))
    assert sorted(r.outstanding for r in b.replicas) == [2, 2], "the bound beats affinity"
    with pytest.raises(Saturated):
        b.pick()
    with pytest.raises(Saturated):
        b.pick(prefix_key="same")
    _by_key(b)["b"].outstanding = 1
    assert b.pick().key == "b"
    with pytest.raises(NoReplica) as exc:
        b.pick(exclude=["b"])
    assert isinstance(exc.value, Saturated), "a is full: busy, not missing"
    with pytest.raises(NoReplica) as exc:
        b.pick(exclude=["a", "b"])
    assert not isinstance(exc.value, Saturated), "every one tried: none left"
    with pytest.raises(ValueError, match="load_factor"):
        Balancer(load_factor=0.9)


def test_a_refusal_is_counted_and_does_not_bench():
    b = Balancer()
    b.update(_replicas("a"))
    a = b.pick()
    b.mark_refused(a)
    assert a.refusals == 1 and a.failures == 0 and b.healthy() == [a]


def test_prefixes_are_shared_out_evenly_so_each_cache_holds_its_half():
    """16 documents over 2 replicas: rendezvous hashing alone splits them as chance does (10/6 as often as not,
    and the replica with 10 thrashes a cache of 8); the home table gives each replica 8, whatever the names."""
    for names in (("a", "b"), ("job7/0", "job7/1"), ("x", "y")):
        b = Balancer()
        b.update(_replicas(*names))
        homes = [b.pick(prefix_key=f"Document {d}: " + "w" * 300).key for d in range(16)]
        assert sorted(homes.count(n) for n in names) == [8, 8], homes


def test_a_renewed_deployments_prefixes_move_to_the_new_replicas_evenly():
    """The old job drains: each prefix, next asked for, gets a home among the new job's replicas, evenly."""
    b = Balancer()
    b.update(_replicas("old/0", "old/1"))
    keys = [f"p{i}" for i in range(20)]
    for k in keys:
        b.pick(prefix_key=k)
    b.update([*(Replica(k, f"http://{k}", k, draining=True) for k in ("old/0", "old/1")), *_replicas("new/0", "new/1")])
    moved = [b.pick(prefix_key=k).key for k in keys]
    assert sorted(moved.count(n) for n in ("new/0", "new/1")) == [10, 10]
    assert [b.pick(prefix_key=k).key for k in keys] == moved, "and they stay"


def test_the_home_table_keeps_the_prefixes_used_last():
    from hpc.serving.prefix_homes import PrefixHomes

    homes = PrefixHomes(slack=1.25, size=4)
    replicas = _replicas("a", "b")
    first = {k: homes.home(k, replicas).key for k in ("k1", "k2", "k3", "k4")}
    homes.home("k1", replicas)  # k1 used again: k2 is the oldest now
    homes.home("k5", replicas)
    assert len(homes) == 4 and sum(homes.count.values()) == 4
    assert homes.home("k1", replicas).key == first["k1"], "kept"


def test_a_prefixs_home_takes_a_few_requests_above_the_mean_before_one_goes_elsewhere():
    """The slack: with few requests in flight, 1.25 x the mean is one request; a home may hold `load_slack` more
    than the mean (a batch takes them at little cost; elsewhere the prompt is prefilled again)."""
    b = Balancer(load_factor=1.25, load_slack=4)
    b.update(_replicas("a", "b"))
    home = b.pick(prefix_key="doc")
    for _ in range(6):
        _hold(b, b.pick(prefix_key="doc"))
    assert home.outstanding == 6 and b.outcomes["spilled"] == 0, "6 <= 3 + 4"
    for _ in range(4):
        _hold(b, b.pick(prefix_key="doc"))
    assert b.outcomes["spilled"] > 0 and home.outstanding - (10 - home.outstanding) <= 2 * 4 + 1


def test_nothing_serving_is_the_autoscalers_cue_and_every_replica_tried_is_not():
    """A request with no replica at all counts as `none` (the controller submits a job for it); one whose every
    replica failed before its first byte does not (a job is no remedy, and a scale-down must not be blocked)."""
    empty = Balancer()
    with pytest.raises(NoReplica):
        empty.pick()
    assert empty.outcomes["none"] == 1
    balancer = Balancer()
    balancer.update([Replica("a/0", "http://a", "a:1"), Replica("b/0", "http://b", "b:1")])
    with pytest.raises(NoReplica):
        balancer.pick(exclude=["a/0", "b/0"])
    assert balancer.outcomes["none"] == 0
