"""A deployment and its published replicas: every job of it (same spec `name` in the same workdir), read
from the endpoint records its leaders publish (launcher/records.py). Synchronous and without network I/O, so
the gateway (which adds health checks, hpc/gateway/discovery.py) and the Python client share it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from hpc.routing.balancer import Replica
from launcher.layout import SPEC_NAME, Deployment, JobPaths
from launcher.records import EndpointRecord, read_endpoints


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
