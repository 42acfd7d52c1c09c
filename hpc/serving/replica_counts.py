"""Where the balancer's per-replica counts live: on the Replica objects of one process (`LocalCounts`, the
default), or in shared memory for a gateway of several worker processes (`SharedCounts`), so that each worker
balances on every worker's requests in flight and the metrics count every worker's requests. Beside them, the
gateway-wide TOTALS the autoscaling controller reads (hpc/jobs/autoscale.py `balancer_load`): run in worker 0, it
sees every worker's requests that found nothing serving and every worker's times to first token.

Why shared memory and not a counts server or a lock file: a request changes its replica's counts twice (picked,
ended), on the hot path of every worker; an add in an array under a process-shared lock costs a microsecond or
two, a round trip to another process a hundred times that. Why keyed by the replica's key (`job_id/replica`)
and not by the balancer's slots: each worker runs its own discovery, so two workers may list the same replicas in
another order, or one may not have seen a new job yet.
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing
from collections.abc import Iterable
from typing import Protocol

#: the counted fields of a Replica (hpc/serving/balancer.py), in their column order
FIELDS = ("outstanding", "served", "failures", "refusals", "kv_reused_blocks", "kv_missed_blocks", "warming")
_COLUMN = {name: i for i, name in enumerate(FIELDS)}
#: the gateway-wide totals: requests that found nothing serving (the controller's cue to start a job), and the sum
#: and count of the times to first token (their mean over a look: the controller's TTFT)
TOTALS = ("nothing_serving", "ttft_sum_s", "ttft_count")
_TOTAL = {name: i for i, name in enumerate(TOTALS)}
#: replicas a SharedCounts holds at once: far more than a deployment has; when every slot is taken (a gateway
#: that outlived a thousand jobs), the slot of a replica with nothing in flight is taken over (its counters
#: start again from zero, a reset Prometheus' rate() reads as such)
SLOTS = 1024


class Counted(Protocol):
    """What a count is kept for: a Replica (its key and the FIELDS as attributes)."""

    key: str


class ReplicaCounts(Protocol):
    """Where the counts are: `add` changes a replica's counts (and its attributes); `load` sets the replicas'
    attributes to the counts as they are now (the other workers' requests included); `add_totals` adds to the
    gateway-wide TOTALS, `totals` reads them (every worker's)."""

    def add(self, replica: Counted, **deltas: int) -> None: ...

    def load(self, replicas: Iterable[Counted]) -> None: ...

    def add_totals(self, **deltas: float) -> None: ...

    def totals(self) -> dict[str, float]: ...


class LocalCounts:
    """The counts on the Replica objects themselves, the totals in this object: one process's balancer."""

    def __init__(self) -> None:
        self._totals = dict.fromkeys(TOTALS, 0.0)

    def add_totals(self, **deltas: float) -> None:
        for name, delta in deltas.items():
            self._totals[name] += delta

    def totals(self) -> dict[str, float]:
        return dict(self._totals)

    def add(self, replica: Counted, **deltas: int) -> None:
        for name, delta in deltas.items():
            setattr(replica, name, getattr(replica, name) + delta)

    def load(self, replicas: Iterable[Counted]) -> None:
        pass


def _hash(key: str) -> int:
    """A replica key's slot tag: 64 bits, never 0 (an empty slot's)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") | 1


class SharedCounts:
    """The counts in shared memory, for processes forked after it was made (module docstring): a table of SLOTS
    rows, each a replica key's tag and its FIELDS, and the TOTALS, under one process-shared lock."""

    def __init__(self, slots: int = SLOTS) -> None:
        context = multiprocessing.get_context("fork")
        self._lock = context.Lock()
        self._tags = context.RawArray(ctypes.c_uint64, slots)
        self._values = context.RawArray(ctypes.c_int64, slots * len(FIELDS))
        self._totals = context.RawArray(ctypes.c_double, len(TOTALS))
        self._slots: dict[str, int] = {}  # this process's cache of each key's slot, checked against its tag

    def _slot(self, key: str) -> int | None:
        """The slot of `key`, taken (from zero) when it has none; None when every slot holds a replica with
        requests in flight. The caller holds the lock."""
        tag, tags = _hash(key), self._tags
        cached = self._slots.get(key)
        if cached is not None and tags[cached] == tag:
            return cached
        width = len(FIELDS)
        found = next((i for i in range(len(tags)) if tags[i] == tag), None)
        if found is None:
            found = next((i for i in range(len(tags)) if tags[i] == 0), None)
        if found is None:  # full: a replica with nothing in flight and no warm-up under way gives its slot
            warming = _COLUMN["warming"]
            found = next(
                (
                    i
                    for i in range(len(tags))
                    if self._values[i * width] == 0 and self._values[i * width + warming] == 0
                ),
                None,
            )
        if found is None:
            return None
        if tags[found] != tag:
            tags[found] = tag
            self._values[found * width : (found + 1) * width] = [0] * width
        self._slots[key] = found
        return found

    def add(self, replica: Counted, **deltas: int) -> None:
        width = len(FIELDS)
        with self._lock:
            slot = self._slot(replica.key)
            if slot is None:
                raise RuntimeError(
                    f"{len(self._tags)} replicas with requests in flight: no slot left for {replica.key}"
                )
            base = slot * width
            for name, delta in deltas.items():
                column = base + _COLUMN[name]
                # a count never goes below zero (a slot taken over under a request's or warm-up's feet)
                self._values[column] = max(0, self._values[column] + delta)
            row = self._values[base : base + width]
        for name, value in zip(FIELDS, row, strict=True):
            setattr(replica, name, value)

    def load(self, replicas: Iterable[Counted]) -> None:
        """A replica without a slot (nothing counted yet, or its slot given up) is given one, from zero, so that the
        next load finds it in this process's cache, not by a scan of the table (at every pick); with none left
        to give, its counts are zero."""
        width = len(FIELDS)
        with self._lock:
            slots = [(r, self._slot(r.key)) for r in replicas]
            rows = [(r, self._values[s * width : (s + 1) * width] if s is not None else [0] * width) for r, s in slots]
        for replica, row in rows:
            for name, value in zip(FIELDS, row, strict=True):
                setattr(replica, name, value)

    def add_totals(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._totals[_TOTAL[name]] += delta

    def totals(self) -> dict[str, float]:
        with self._lock:
            values = self._totals[:]
        return dict(zip(TOTALS, values, strict=True))
