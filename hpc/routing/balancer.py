"""Least-outstanding-requests over the READY replicas: pure logic, no I/O, so it is unit-tested on its own.

Why least outstanding and not round-robin: generation requests differ in length by orders of magnitude, so
the replica with the fewest requests in flight is the best cheap guess at the least busy one. A replica that
failed a request before any byte reached the client is benched for `cooldown_s` (the request is retried
elsewhere), and discovery's health check brings it back, or drops it, when it refreshes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Replica:
    """One replica as the balancer sees it. `key` is `job_id/replica`, unique across the deployment's jobs."""

    key: str
    http_url: str
    grpc_url: str
    outstanding: int = 0
    served: int = 0
    failures: int = 0
    benched_until: float = 0.0
    last_pick: int = 0  # the balancer's pick count when it last chose this replica


class NoReplica(RuntimeError):
    """No replica is ready (or every one was tried for this request)."""


class Balancer:
    """Which replica gets the next request. Not thread-safe: the gateway uses it from one event loop."""

    def __init__(self, cooldown_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._replicas: dict[str, Replica] = {}
        self._picks = 0

    @property
    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def update(self, found: Iterable[Replica]) -> None:
        """Make the set of replicas `found` (discovery's latest view); counters of those kept survive."""
        fresh = {r.key: r for r in found}
        for key, replica in fresh.items():
            old = self._replicas.get(key)
            if old is not None and (old.http_url, old.grpc_url) == (replica.http_url, replica.grpc_url):
                fresh[key] = old
        self._replicas = fresh

    def healthy(self) -> list[Replica]:
        now = self._clock()
        return [r for r in self._replicas.values() if r.benched_until <= now]

    def pick(self, exclude: Iterable[str] = ()) -> Replica:
        """The healthy replica with the fewest requests in flight; ties go to the one chosen longest ago (round
        robin among equals: a replica that just joined gets its share, not every request until it caught up)."""
        skip = set(exclude)
        candidates = [r for r in self.healthy() if r.key not in skip]
        if not candidates:
            raise NoReplica("no replica is ready")
        chosen = min(candidates, key=lambda r: (r.outstanding, r.last_pick, r.key))
        self._picks += 1
        chosen.last_pick = self._picks
        return chosen

    def mark_failed(self, replica: Replica) -> None:
        """The replica failed before the first byte: no new requests until the cooldown has passed."""
        replica.failures += 1
        replica.benched_until = self._clock() + self.cooldown_s

    @contextmanager
    def track(self, replica: Replica) -> Iterator[Replica]:
        """Count a request as outstanding on `replica` while the block runs."""
        replica.outstanding += 1
        try:
            yield replica
        finally:
            replica.outstanding -= 1
            replica.served += 1
