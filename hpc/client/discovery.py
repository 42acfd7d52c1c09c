"""Where a client's requests go: TARGET → the deployment (hpc.serving.deployment), one pinned replica, and the
access token the gateway is sent (hpc.serving.auth; each replica's comes from the gateway's Discovery).

Why files only and no network here: resolving happens once, in the caller's thread, when a client is made (a
wrong TARGET fails at once, naming what was tried); whether the gateway answers and which replicas are ready is
asked later, on the client's event loop (hpc/client/aio.py), and asked again as jobs come and go.
"""

from __future__ import annotations

from pathlib import Path

from hpc.client.errors import NotReady, TargetError
from hpc.scheduler.index import JobRef, find_job
from hpc.serving.auth import Tokens, read_token
from hpc.serving.balancer import Replica
from hpc.serving.deployment import Target, as_replica, deployment_folders, resolve_target, target_of_folder
from launcher.contracts.records import EndpointRecord, read_endpoints


def resolve(target: str | Path | JobRef | Target) -> Target:
    """A spec file, a deployment folder, a deployment's name, a job id or job folder (hpc.serving.deployment's
    TARGET, as every command reads it) → the deployment. Raises TargetError with what was tried; a spec file
    with problems raises hpc.spec.SpecError."""
    if isinstance(target, Target):
        return target
    try:
        if isinstance(target, JobRef):
            return target_of_folder(target.deploy_dir)
        return resolve_target(str(target))
    except LookupError as exc:  # the routing's TargetError, hpc.scheduler.index.JobNotFound
        raise TargetError(str(exc)) from None


def job_endpoints(job: str | JobRef) -> list[EndpointRecord]:
    """Every published replica endpoint of a job (an id, a job folder, or the JobRef already looked up), by
    replica number."""
    ref = job if isinstance(job, JobRef) else find_job(job)
    return read_endpoints(ref.paths)


def job_replica(job: str | JobRef, replica: int) -> tuple[Replica, str | None]:
    """One replica of one job (and its folder's token): a client pinned to it, with no balancing."""
    ref = job if isinstance(job, JobRef) else find_job(job)
    chosen = [e for e in job_endpoints(ref) if e.replica == replica]
    if not chosen:
        raise NotReady(
            f"job {ref.job_id} has no ready endpoint for replica {replica}; see `hpc-serve status {ref.job_id}`"
        )
    return as_replica(chosen[0]), read_token(ref.deploy_dir)


def newest_token(target: Target) -> str | None:
    """What the gateway is sent: the newest folder's token (it accepts any of the deployment's)."""
    return Tokens.of_folders(deployment_folders(target)).newest
