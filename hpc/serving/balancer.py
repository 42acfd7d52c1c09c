"""Which replica gets a request: least outstanding, prefix affinity with bounded load, draining, admission.
Pure logic, no I/O, so it is unit-tested on its own and shared by the gateway and the Python client.

Why least outstanding and not round-robin: generation requests differ in length by orders of magnitude, so
the replica with the fewest requests in flight is the best cheap guess at the least busy one.

Why prefix affinity: with `enable_kv_cache_reuse` a replica that already computed the KV blocks of a prompt's
beginning skips that prefill; requests that share a prefix (a system prompt, few-shot examples, a document
asked several questions) should meet on one replica. The prefix's home (hpc/serving/prefix_homes.py: the
replica home to the fewest prefixes when the prefix was first seen, so each cache holds its share of the working
set) comes first, then the others by rendezvous rank, and the first of them whose load stays within
`load_factor` × the mean load, or `load_slack` requests above it when that is more (consistent hashing with
bounded loads, Mirrokni et al. 2018, with an absolute slack as SGLang's cache-aware router has) gets the request.
The bound is relative to the *mean* and not to the least loaded replica: it is the one with the guarantee (no
replica above the bound, so affinity can
never pile a hot prefix onto one replica), and a freshly joined idle replica does not make every prefix spill.

Why the key is the prompt's first `PREFIX_CHARS` characters and not tokens: routing must not tokenize (the
Python client that shares this policy may have no tokenizer, and tokenizing every prompt on the gateway's
event loop would cost more than the rest of its routing); 256 characters are ~50-70 tokens of English, one or
two KV-cache blocks, the least a shared prefix must cover for reuse to pay. A shorter key would lump together
every chat of a template whose boilerplate is that long; a longer one would separate requests that share a
system prompt of just that length. Prompts shorter than that get no key: they hold no reusable block.

Why the default key is no longer those characters (`routing: cache`, hpc/serving/routing.py): every chat that
opens with one long system prompt has one key, so one replica got everything, and a conversation spilled by the
bound lost its history. A `Route` instead tells, for each replica, how many of the prompt's tokens its cache holds
(hpc/serving/prefix_index.py); `pick` then takes, among the replicas within the same bound, the one with the
fewest of the prompt's tokens to compute, ties to the least prefill queued (prompt tokens of its requests still
waiting for their first token, less what their replica held): docs/decisions.md "Routing by the longest cached
prefix" says why the queued prefill breaks ties and is not added to the count.

Draining replicas (their job is stopping) and benched ones (failed a request before its first byte; back after
`cooldown_s`, or dropped by discovery) get no new requests while another replica takes them. When every replica
left is benched, they are tried anyway (Envoy's "panic" routing): one failure that may have been a passing one
(a lost status, a node briefly overloaded) must not turn the whole cooldown into 503s for a deployment whose
other replicas are gone, and a replica that is really dead fails such a request fast (its connection refused),
which then gets the same 503, and discovery drops it at its next look. A replica with `max_outstanding` requests in flight
takes no more: when every ready one is full, `Saturated` (the gateway's 429) instead of a queue that grows
without bound on the replicas.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from hpc.serving.prefix_homes import PrefixHomes, rank
from hpc.serving.replica_counts import LocalCounts, ReplicaCounts
from hpc.spec.limits import PREFIX_CHARS
from launcher.contracts.llmapi import ENGINE

#: a prefix's replica takes it while its load stays within this many times the mean load, or within this many
#: requests above the mean, whichever is more: an engine batches a few requests more at little cost, while a
#: request sent elsewhere prefills its whole prompt again (bench_gateway.py's shared-prefix part measures both:
#: docs/decisions.md "Prefix affinity with bounded load")
LOAD_FACTOR, LOAD_SLACK = 1.25, 4


@dataclass
class Replica:
    """One replica as the balancer sees it. `key` is `job_id/replica`, unique across the deployment's jobs."""

    key: str
    http_url: str
    grpc_url: str
    outstanding: int = 0
    served: int = 0
    failures: int = 0
    refusals: int = 0  # requests it refused because its queue was full (not a failure: it is healthy)
    benched_until: float = 0.0
    last_pick: int = 0  # the balancer's pick count when it last chose this replica
    draining: bool = False  # its job is stopping: requests in flight finish, new ones go elsewhere
    workflow: str = ENGINE  # its TensorRT-LLM workflow: which model generates, asked how (hpc/serving/model_io.py)
    decoupled: bool = True  # its generation model streams; False: asked for one whole response (model_io.py)
    llmapi_model: str = ""  # llmapi: hpc-serve's model or the image's, which takes fewer inputs (model_io.py)
    #: KV-cache blocks of its requests' prompts found in its engine's cache, and not (the llmapi model's perf
    #: metrics, counted by the gateway: hpc/gateway/metrics.py): how well prefix affinity keeps a prefix's requests
    #: where its cache is
    kv_reused_blocks: int = 0
    kv_missed_blocks: int = 0
    #: how many times its job restarted it (replica_policy restart; its endpoint record's count)
    restarts: int = 0
    #: prompt tokens to prefill of its requests still waiting for their first token (a `Route`'s count)
    prefill_queued: int = 0
    #: warm-ups under way: it joined and is being sent the hottest prefixes (hpc/serving/warmup.py), by worker 0
    #: where a gateway has several (a count they share): no new requests meanwhile
    warming: int = 0


class Route(Protocol):
    """A prompt as cache-aware routing sees it (hpc/serving/routing.py): its size and each replica's cached part,
    in tokens (estimated where the replica's cache is known only from the prompts routed there)."""

    prompt_tokens: int
    #: the prompt's tokens to prefill where it was routed last (`routed` sets it)
    prefill: int

    def cached_tokens(self, replica: Replica, among: int) -> int:
        """The prompt's tokens counted as held by `replica`, one of `among` that may take it."""

    def assigned(self, replica: Replica) -> int:
        """How much distinct prompt text was sent to `replica` lately: where a new prefix fits best."""

    def routed(self, replica: Replica) -> None:
        """The prompt goes to `replica`: `prefill` is what it lacks, and an index of routed prompts learns it."""


class NoReplica(RuntimeError):
    """No replica is ready (or every one was tried for this request)."""


class HeldTooLong(NoReplica):
    """A request held while a job starts (`autoscale.hold_s`) found still no replica ready."""


class Saturated(NoReplica):
    """Replicas are ready, but each one is at `max_outstanding` (or refused the request: its queue is full)."""


def prefix_key(prompt: str, chars: int = PREFIX_CHARS) -> str | None:
    """The affinity key of a prompt: its first `chars` characters; None when shorter (or `chars` is 0: off)."""
    return prompt[:chars] if chars > 0 and len(prompt) >= chars else None


def _rank(key: str, replica: Replica) -> bytes:
    """Rendezvous score of `replica` for `key` (stable across processes, unlike `hash`)."""
    return rank(key, replica.key)


class Balancer:
    """Which replica gets the next request. Not thread-safe: the gateway uses it from one event loop."""

    def __init__(
        self,
        cooldown_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_outstanding: int | None = None,
        load_factor: float = LOAD_FACTOR,
        load_slack: int = LOAD_SLACK,
        round_robin: bool = False,
        counts: ReplicaCounts | None = None,
    ) -> None:
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be at least 1 (a bound below the mean load), not {load_factor}")
        self.cooldown_s = cooldown_s
        self.max_outstanding = max_outstanding
        self.load_factor = load_factor
        self.load_slack = load_slack
        #: without an affinity, the replica chosen longest ago (not the least loaded): for comparisons only
        self.round_robin = round_robin
        self._clock = clock
        #: where the per-replica counts live (hpc/serving/replica_counts.py): here, or shared by worker processes
        self.counts: ReplicaCounts = counts or LocalCounts()
        self._replicas: dict[str, Replica] = {}
        self._picks = 0
        #: how picks went: "least" (no prefix key), "home" (the prefix's first replica), "spilled" (a later one);
        #: with a `Route`: "cached" (the replica holding most of the prompt), "least" (none holds any of it),
        #: "spilled" (the one holding most was too busy, or another's first token comes sooner)
        self.outcomes: Counter[str] = Counter()
        #: each prefix's home replica (prefix_homes.py)
        self.homes = PrefixHomes(load_factor)

    @property
    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def update(self, found: Iterable[Replica]) -> None:
        """Make the set of replicas `found` (discovery's latest view); counters of those kept survive, their
        `draining` flag is the new view's."""
        fresh = {r.key: r for r in found}
        for key, replica in fresh.items():
            old = self._replicas.get(key)
            if old is not None and (old.http_url, old.grpc_url) == (replica.http_url, replica.grpc_url):
                old.draining = replica.draining
                fresh[key] = old
        self._replicas = fresh

    def set_draining(self, key: str, draining: bool = True) -> None:
        """Mark a replica draining (no new requests) or not; unknown keys are ignored (already gone)."""
        if key in self._replicas:
            self._replicas[key].draining = draining

    def healthy(self) -> list[Replica]:
        """Replicas not benched (draining ones included: they still serve what they have)."""
        now = self._clock()
        return [r for r in self._replicas.values() if r.benched_until <= now]

    def available(self) -> list[Replica]:
        """Replicas that take new requests: healthy, not draining, not warming (full ones included)."""
        return [r for r in self.healthy() if not r.draining and not r.warming]

    def takers(self, exclude: Iterable[str] = ()) -> list[Replica]:
        """The replicas outside `exclude` that a new request may go to: the available ones, or when none is, the
        benched or warming ones that are not draining (see the module docstring). What readiness answers by, too."""
        skip = set(exclude)
        self.counts.load(self._replicas.values())  # every worker's counts: one warming in another is out too
        open_ = [r for r in self.available() if r.key not in skip]
        return open_ or [r for r in self._replicas.values() if not r.draining and r.key not in skip]

    def pick(self, exclude: Iterable[str] = (), prefix_key: str | None = None, route: Route | None = None) -> Replica:
        """The replica for the next request. Without `prefix_key`: the one with the fewest requests in flight,
        ties to the one chosen longest ago (round robin among equals, so a replica that just joined gets its
        share at once). With one: the first replica in the key's rendezvous order whose load after this request
        stays within the bound (`load_factor` × the mean, or `load_slack` above it); with a `route`, the replica
        within that bound holding most of the prompt (`_by_route`). Benched replicas only when no other is
        left (`takers`). Raises
        NoReplica when none takes new requests outside `exclude`, and Saturated when those left are all at
        `max_outstanding`."""
        open_ = self.takers(exclude)
        if not open_:
            if not exclude:  # nothing serving (not: every replica tried failed): the autoscaling controller's cue
                self.nothing_serving()
            raise NoReplica("no replica is ready")
        bound = self.max_outstanding
        candidates = [r for r in open_ if bound is None or r.outstanding < bound]
        if not candidates:
            raise Saturated(f"every ready replica has {bound} requests in flight")
        if route is not None:
            chosen = self._by_route(candidates, route)
            route.routed(chosen)
        elif prefix_key is None:
            order = (
                (lambda r: (r.last_pick, r.key))
                if self.round_robin
                else (lambda r: (r.outstanding, r.last_pick, r.key))
            )
            chosen = min(candidates, key=order)
            self.outcomes["least"] += 1
        else:
            home = self.homes.home(prefix_key, self.available() or open_)
            chosen = self._by_prefix(candidates, prefix_key, home)
            self.outcomes["home" if chosen is home else "spilled"] += 1
        self._picks += 1
        chosen.last_pick = self._picks
        return chosen

    def _by_prefix(self, candidates: list[Replica], key: str, home: Replica) -> Replica:
        """Bounded loads over `candidates`: the first of `home`, then the others in the key's rendezvous order,
        whose load after this request is within the bound (one always is: the least loaded is at most the mean)."""
        cap = self._cap(candidates)
        ranked = sorted(candidates, key=lambda r: (r is home, _rank(key, r)), reverse=True)
        return next((r for r in ranked if r.outstanding + 1 <= cap), ranked[0])

    def _cap(self, candidates: list[Replica]) -> int:
        """The bound on a replica's load after this request (module docstring)."""
        mean = (sum(r.outstanding for r in candidates) + 1) / len(candidates)  # this request included
        return math.ceil(max(self.load_factor * mean, mean + self.load_slack))

    def _by_route(self, candidates: list[Replica], route: Route) -> Replica:
        """Among `candidates` within the bound: when some hold more of the prompt than others, the one with the
        fewest of its tokens to compute, ties to the least prefill queued; when none does (a new prefix), the one
        sent the least distinct text lately, so that each cache gets its share of the working set (SGLang's
        "smallest tree"), then the least queued; then the fewest in flight, the one chosen longest ago."""
        cap = self._cap(candidates)
        within = [r for r in candidates if r.outstanding + 1 <= cap] or candidates
        cached = {r.key: min(route.cached_tokens(r, len(candidates)), route.prompt_tokens) for r in candidates}
        most = max(cached.values())
        if most == min(cached.values()):
            chosen = min(within, key=lambda r: (route.assigned(r), r.prefill_queued, r.outstanding, r.last_pick, r.key))
            self.outcomes["least"] += 1
            return chosen
        chosen = min(
            within,
            key=lambda r: (route.prompt_tokens - cached[r.key], r.prefill_queued, r.outstanding, r.last_pick, r.key),
        )
        self.outcomes["cached" if cached[chosen.key] == most else "spilled"] += 1
        return chosen

    def nothing_serving(self) -> None:
        """Count a request that found no replica taking requests: the pick outcome "none", and the gateway-wide
        total the autoscaling controller reads (every worker's, where the counts are shared)."""
        self.outcomes["none"] += 1
        self.counts.add_totals(nothing_serving=1)

    def mark_failed(self, replica: Replica) -> None:
        """The replica failed before the first byte: no new requests until the cooldown has passed."""
        self.counts.add(replica, failures=1)
        replica.benched_until = self._clock() + self.cooldown_s

    def mark_refused(self, replica: Replica) -> None:
        """The replica refused the request, its queue full: try another, but it is not benched (it is healthy)."""
        self.counts.add(replica, refusals=1)

    @contextmanager
    def track(self, replica: Replica, prefill: int = 0) -> Iterator[Callable[[], None]]:
        """Count a request as outstanding on `replica` while the block runs, and its `prefill` tokens as queued
        until the block calls what it is given (its first token came) or ends (this process's requests only:
        the queued prefill is not among the counts worker processes share)."""
        self.counts.add(replica, outstanding=1)
        replica.prefill_queued += prefill
        queued = [prefill]

        def first_token() -> None:
            replica.prefill_queued -= queued[0]
            queued[0] = 0

        try:
            yield first_token
        finally:
            first_token()
            self.counts.add(replica, outstanding=-1, served=1)
