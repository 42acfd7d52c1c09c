"""Submit a spec: plan its jobs, render them into a fresh deployment folder, then hand them to an executor
(hpc/jobs/executors.py: exactly their scripts to sbatch, or the local executor) in dependency order. Also `cancel`, the
other end of a job's life.

A submission is up to three jobs, one of each kind (hpc/jobs/kinds.py): the engine build (a `build:` section whose
engine is not built yet), the deployment's gateway (an enabled `gateway:` section), and the serving job, which
runs after the build. Each of the first two may turn out not to need a job of this submission: an engine built
already, or being built by another submission, is served or waited for; a gateway that runs or is on its way
is reused.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from hpc.jobs.executors import Executor, executor_named, executor_of, unreachable
from hpc.jobs.gateway import after_cancel, ensure_gateway
from hpc.jobs.kinds import ServingJob, job_class_of
from hpc.jobs.model_init import ensure_model
from hpc.jobs.status import JobStatus
from hpc.jobs.track import job_status, wait
from hpc.render.jobfiles import render
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import SlurmError, on_cluster
from hpc.spec import Spec
from hpc.spec.site import profile_summary
from launcher.contracts.config import CANCEL_GRACE_S
from launcher.contracts.stop_records import BY_CANCEL, StopRequest

if TYPE_CHECKING:
    from hpc.jobs.build import PreparedBuild


class SubmitError(RuntimeError):
    """sbatch refused the job; the message names the command and quotes sbatch's own words."""


def new_deployment_dir(spec: Spec) -> Path:
    """`<workdir>/<name>-<time>`: a new folder per submission, so a job never runs from files that a later
    submission rewrote."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = spec.workdir / f"{spec.name}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


@dataclass(frozen=True)
class JobsPlan:
    """What one submission of a spec runs: the spec the serving job serves, and the jobs before it."""

    served: Spec  # a build's engine in place of the spec's `build:` section (hpc/jobs/build_plan.py served_spec)
    build: PreparedBuild | None = None  # the engine to build first (BuildJob); None: no `build:` section
    gateway: bool = False  # the deployment's gateway job (GatewayJob), unless one runs or is on its way


def plan_jobs(spec: Spec) -> JobsPlan:
    """The jobs `spec` needs. Also creates the model `model.init` asks for (the explicit step render leaves out),
    the one input of the serving job that no job makes: with a `build:` section the build job creates it."""
    gateway = spec.gateway is not None and spec.gateway.enabled
    if spec.build is None:
        ensure_model(spec)
        return JobsPlan(spec, gateway=gateway)
    from hpc.jobs.build import prepare

    prepared = prepare(spec)
    return JobsPlan(prepared.served, prepared, gateway)


def submit_jobs(
    jobs: JobsPlan, deploy_dir: Path, runner: Executor, started: list[JobRef], note: Callable[[str], object]
) -> JobRef:
    """Each job in dependency order: the build first (nothing is served from an engine that will not be there), the
    gateway next (a gateway job sbatch refuses leaves no serving job behind), the serving job last, after the build.
    A build job renders its script as it is submitted (hpc/jobs/build.py `start`: none when the engine is
    cached or another submission builds it). `started` gets each job made for this submission; the serving job is
    returned."""
    after = None
    if jobs.build is not None:
        from hpc.jobs.build import start

        after = start(jobs.build, runner, deploy_dir, note)
        if after is not None and after.deploy_dir == deploy_dir:  # not another submission's build
            started.append(after)
    if jobs.gateway:
        gateway = ensure_gateway(deploy_dir, runner)
        if gateway.job is not None:
            started.append(gateway.job)
    return runner.submit(ServingJob, deploy_dir, after=after)


def submit(
    spec: Spec,
    executor: str | None = None,
    deploy_dir: Path | None = None,
    note: Callable[[str], object] = lambda _: None,
) -> JobRef:
    """Plan the spec's jobs, render them, submit them; the serving job. Nothing is submitted if planning or
    rendering fails, and what a refused sbatch interrupts is undone: the jobs made for this submission are
    cancelled and a folder made for it removed. `note` hears which site profile the spec was merged with (the
    scripts hold its values) and what the build does."""
    runner = executor_named(executor)  # ValueError for an unknown name, before anything is written
    note(profile_summary(spec, explained=True))
    jobs = plan_jobs(spec)
    # the serving job's scripts, launch.json and model repository, and the gateway's script: one folder
    folder = render(jobs.served, deploy_dir or new_deployment_dir(jobs.served)).deploy_dir
    started: list[JobRef] = []
    try:
        return submit_jobs(jobs, folder, runner, started, note)
    except SlurmError as exc:
        undo(started, runner)
        if deploy_dir is None:  # a folder made for this submission only: nothing half-done is left behind
            shutil.rmtree(folder, ignore_errors=True)
        raise SubmitError(str(exc)) from exc


def undo(started: list[JobRef], runner: Executor) -> None:
    """Cancel the jobs a submission made before sbatch refused one (the last first), and wait for their end: one
    that had started would otherwise write into its folder (its script makes its job folder) after that folder
    was removed."""
    for ref in reversed(started):
        runner.cancel(ref, 0, stoppable=False)
    for ref in started:
        wait(ref, until=(), timeout=CANCEL_GRACE_S)


def cancel(ref: JobRef, grace_s: float = CANCEL_GRACE_S) -> JobStatus:
    """Ordered stop first, then scancel for whatever is left, then wait until the job has ended (at most
    `grace_s` + 60 s); the job's last status. The CLI's `cancel` and `hpc.api.Job.cancel` are this.

    The job's executor sends the stop (hpc/jobs/executors.py): each leader's tritonserver stops taking requests,
    drains those in flight (launch.json drain_s) and unloads, which releases its followers; followers wait for
    that release (bounded) instead of leaving first. The marker records that the user asked for this: the job
    reads CANCELLING until no rank process is left, then CANCELLED (not COMPLETED or FAILED, however its ranks
    ended)."""
    why = unreachable(ref)
    if why is not None:  # of another cluster that cannot be asked: nor can it be told (nothing is written)
        raise SlurmError(["scancel", *on_cluster(ref.cluster), ref.job_id], f"not sent: {why}")
    # before the marker changes it; a job without ranks (a gateway's, a build's) stops on scancel's SIGTERM, and its
    # state is not asked (a gateway's probes the gateway)
    stoppable = job_class_of(ref.job_dir).stoppable and job_status(ref).state in ("STARTING", "READY", "CANCELLING")
    StopRequest(at=time.time(), by=BY_CANCEL).write(ref.cancel_marker)
    executor_of(ref).cancel(ref, grace_s, stoppable)
    status = wait(ref, until=(), timeout=grace_s + 60)
    status.gateway = after_cancel(ref, grace_s)  # the gateway goes with the deployment's last job (hpc/jobs/gateway.py)
    return status
