"""Which replicas serve the deployment now: every job of it (same spec `name` in the same workdir), read from
the endpoint records its leaders publish (launcher/records.py), each confirmed by its `/v2/health/ready`.

Why re-read periodically instead of once: jobs end and new ones start (a renewed successor, a second job for
more capacity) while the gateway keeps its address; a refresh every few seconds picks them up without a
restart. Why the health check on top of the records: a job killed outright (SIGKILL, a node lost) leaves its
record behind, and only asking the server tells a live replica from a stale record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from hpc.gateway.auth import read_tokens
from hpc.gateway.balancer import Balancer, Replica
from launcher.layout import SPEC_NAME, Deployment, JobPaths
from launcher.records import EndpointRecord, read_endpoints
from launcher.urls import READY_PATH

log = logging.getLogger("hpc_serve.gateway")

REFRESH_S = 5.0
HEALTH_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Target:
    """A deployment: every folder under `workdir` rendered from a spec called `name`."""

    workdir: Path
    name: str
    tokenizer_dir: Path


def _spec_name(folder: Path) -> str | None:
    try:
        data = yaml.safe_load((folder / SPEC_NAME).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data.get("name") if isinstance(data, dict) else None


def resolve_target(target: str) -> Target:
    """A spec file or a job id (or job folder) → the deployment it names. Raises SpecError / JobNotFound."""
    from hpc.spec import load_spec

    path = Path(target).expanduser()
    if path.is_file():
        spec = load_spec(path)
        return Target(spec.workdir.resolve(), spec.name, Path(spec.model.tokenizer))
    from hpc.jobs import find_job

    deploy_dir = find_job(target).deploy_dir
    spec = load_spec(Deployment(deploy_dir).spec)  # the resolved spec render wrote: absolute paths
    return Target(deploy_dir.parent.resolve(), spec.name, Path(spec.model.tokenizer))


def deployment_folders(target: Target) -> list[Path]:
    """Every deployment folder of the target, oldest first (render names them `<name>-<time>[-n]`)."""
    if not target.workdir.is_dir():
        return []
    found = [
        d
        for d in target.workdir.iterdir()
        if d.name.startswith(f"{target.name}-") and d.is_dir() and _spec_name(d) == target.name
    ]
    return sorted(found, key=lambda d: d.name)


def published(target: Target) -> Iterator[EndpointRecord]:
    """The endpoint records of every job of the deployment that was not cancelled."""
    for folder in deployment_folders(target):
        jobs_dir = Deployment(folder).jobs_dir
        for job_dir in sorted(jobs_dir.iterdir()) if jobs_dir.is_dir() else []:
            paths = JobPaths(folder, job_dir.name)
            if not paths.cancel_marker.exists():
                yield from read_endpoints(paths)


def as_replica(record: EndpointRecord) -> Replica:
    return Replica(key=f"{record.job_id}/{record.replica}", http_url=record.http_url, grpc_url=record.grpc_url)


@dataclass
class Discovery:
    """Keeps `balancer` and `tokens` up to date with the deployment's jobs."""

    target: Target
    balancer: Balancer
    http: httpx.AsyncClient
    refresh_s: float = REFRESH_S
    tokens: set[str] = field(default_factory=set)
    #: called with the replicas in use after each refresh (the engine closes channels of those gone)
    on_update: Callable[[list[Replica]], Awaitable[None]] | None = None

    async def _ready(self, replica: Replica) -> bool:
        try:
            response = await self.http.get(replica.http_url + READY_PATH, timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def refresh(self) -> None:
        """One look at the records and one health check per replica; replicas that fail it are dropped."""
        folders, records = await asyncio.to_thread(
            lambda: (deployment_folders(self.target), list(published(self.target)))
        )
        candidates = [as_replica(r) for r in records]
        checks = await asyncio.gather(*(self._ready(r) for r in candidates))
        ready = [r for r, ok in zip(candidates, checks, strict=True) if ok]
        before = {r.key for r in self.balancer.replicas}
        self.balancer.update(ready)
        if {r.key for r in ready} != before:
            log.info("replicas ready: %s", ", ".join(f"{r.key} {r.http_url}" for r in ready) or "none")
        self.tokens = await asyncio.to_thread(read_tokens, folders)
        if self.on_update is not None:
            await self.on_update(ready)

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
