"""Which replicas serve the deployment now: every job of it (same spec `name` in the same workdir), read from
the endpoint records its leaders publish (launcher/contracts/records.py), each confirmed by its `/v2/health/ready`.

Why re-read periodically instead of once: jobs end and new ones start (a renewed successor, a second job for
more capacity) while the gateway keeps its address; a refresh every few seconds picks them up without a
restart. Why the health check on top of the records: a job killed outright (SIGKILL, a node lost) leaves its
record behind, and only asking the server tells a live replica from a stale record.

Draining: a job whose renewer handed over to its successor (`jobs/<id>/draining`, launcher/jobscript/renew.py) gets no new
requests, those in flight finish; only while another replica takes new ones, though: a draining replica is better
than none (a successor whose health check failed once must not leave the deployment with nothing to send to).
A job that ends for good drains even alone: its ordered stop has begun (a leader's `rank-<r>.stopping`: a request
sent now would only wait for the stop), or its renewer marked it `final` shortly before its stop (no successor
serves yet), so that what it has in flight can finish before the stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import httpx

from hpc.serving.auth import Tokens, read_tokens
from hpc.serving.balancer import Balancer, Replica
from hpc.serving.deployment import Target, as_replica, deployment_folders, job_folders, job_of_key, published
from launcher.contracts.config import DISCOVERY_REFRESH_S
from launcher.contracts.job_index import entry_name_of
from launcher.contracts.records import read_endpoints
from launcher.contracts.stop_records import is_final
from launcher.contracts.urls import READY_PATH

log = logging.getLogger("hpc_serve.gateway")

HEALTH_TIMEOUT_S = 2.0
#: the headers of every HTTP request to a replica: its connection closes after the answer. Why: an idle
#: keep-alive connection makes the replica's tritonserver, at its ordered stop, wait for it to close ("Found 1 HTTP
#: service connections") until its exit timeout expires, and then exit 1: a failed job instead of a completed one
#: (the health checks' and the Triton passthrough's connections alike: docs/decisions.md "Ordered stop")
CLOSED_AFTER: Mapping[str, str] = MappingProxyType({"Connection": "close"})
#: how many health checks in a row may time out before a replica in use is dropped
SLOW_CHECKS_KEPT = 2


def draining_jobs(target: Target) -> dict[str, bool]:
    """Jobs of the deployment that take no new requests (by entry name, `33@twin`, as replica keys name them: job
    ids are per cluster), and replicas (by key, `33@twin/1`) whose leader began its ordered stop → whether even
    when no other replica serves (ending for good: stopping, or a renewer's `final` mark) or only while another
    does (handed over to a successor). A stopping leader drains its own replica only: one replica of a job may
    end (replica_policy keep-serving, restart) while the others serve on."""
    found: dict[str, bool] = {}
    for paths in job_folders(target):
        entry = entry_name_of(paths)
        if is_final(paths.draining):
            found[entry] = True
        elif paths.draining.exists():
            found[entry] = False
        stopping = {mark.name.split(".")[0] for mark in paths.stopping_marks()}  # rank-<leader's rank>
        for record in read_endpoints(paths) if stopping else []:
            if f"rank-{record.rank}" in stopping:
                found[f"{entry}/{record.replica}"] = True
    return found


def mark_draining(replicas: list[Replica], draining: Mapping[str, bool]) -> None:
    """Set each replica's `draining` from its own or its job's (see `draining_jobs`)."""
    state = {r.key: draining.get(r.key, draining.get(job_of_key(r.key))) for r in replicas}
    open_ = any(state[r.key] is None for r in replicas)
    for replica in replicas:
        replica.draining = state[replica.key] is not None and (open_ or bool(state[replica.key]))


@dataclass
class Discovery:
    """Keeps `balancer` and `tokens` up to date with the deployment's jobs."""

    target: Target
    balancer: Balancer
    http: httpx.AsyncClient
    refresh_s: float = DISCOVERY_REFRESH_S
    tokens: set[str] = field(default_factory=set)
    #: what each job's tritonserver requires (auth: token), sent with every request to its replicas
    replica_tokens: Tokens = field(default_factory=Tokens)
    #: called with the replicas in use after each refresh (the engine closes channels of those gone)
    on_update: Callable[[list[Replica]], Awaitable[None]] | None = None
    #: consecutive health checks that timed out, per replica in use (see `refresh`)
    slow_checks: dict[str, int] = field(default_factory=dict)

    async def _ready(self, replica: Replica) -> bool | None:
        """`/v2/health/ready`, on a connection closed after it (`CLOSED_AFTER`)."""
        try:
            response = await self.http.get(
                replica.http_url + READY_PATH, timeout=HEALTH_TIMEOUT_S, headers=CLOSED_AFTER
            )
        except httpx.TimeoutException:
            return None  # no answer in time: busy or gone, told apart by the next checks
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def refresh(self) -> None:
        """One look at the records and one health check per replica; replicas that fail it are dropped."""
        folders, records, draining = await asyncio.to_thread(
            lambda: (deployment_folders(self.target), list(published(self.target)), draining_jobs(self.target))
        )
        candidates = [as_replica(r) for r in records]
        checks = await asyncio.gather(*(self._ready(r) for r in candidates))
        ready = [r for r, ok in zip(candidates, checks, strict=True) if self._keep(r, ok)]
        mark_draining(ready, draining)
        before = {r.key for r in self.balancer.replicas}
        was_draining = {r.key for r in self.balancer.replicas if r.draining}
        self.balancer.update(ready)
        if {r.key for r in ready} != before:
            log.info("replicas ready: %s", ", ".join(f"{r.key} {r.http_url}" for r in ready) or "none")
        if {r.key for r in ready if r.draining} - was_draining:
            log.info("replicas draining: %s", ", ".join(r.key for r in ready if r.draining))
        self.tokens, self.replica_tokens = await asyncio.to_thread(
            lambda: (read_tokens(folders), Tokens.of_folders(folders))
        )
        if self.on_update is not None:
            await self.on_update(ready)

    def _keep(self, replica: Replica, ok: bool | None) -> bool:
        """A replica in use whose check timed out stays for up to SLOW_CHECKS_KEPT refreshes: a server busy with
        generation (or a loaded node) answers health late, and dropping it would turn its load into 503s. A
        refused connection or a non-200 drops it at once, and a request that fails benches it anyway."""
        if ok is not None or replica.key not in {r.key for r in self.balancer.replicas}:
            self.slow_checks.pop(replica.key, None)
            return bool(ok)
        self.slow_checks[replica.key] = self.slow_checks.get(replica.key, 0) + 1
        return self.slow_checks[replica.key] <= SLOW_CHECKS_KEPT

    def token_for(self, replica: Replica) -> str | None:
        """The token `replica`'s tritonserver requires: its job folder's (keys are `<job>/<replica>`, the job as
        its index entry names it: hpc.serving.deployment `replica_key`)."""
        return self.replica_tokens.for_job(job_of_key(replica.key))

    async def run(self) -> None:
        """Refresh forever (cancelled at shutdown); a failed refresh keeps the previous view."""
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - one bad look must not end discovery
                log.exception("discovery refresh failed")

    @contextlib.asynccontextmanager
    async def running(self):
        """Refresh now, then in the background while the block runs."""
        await self.refresh()
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
