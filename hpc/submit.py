"""Submit a spec: render it into a fresh deployment folder, then hand it to an executor (hpc/executors.py:
exactly that `.sub` to sbatch, or the local executor). Also `cancel`, the other end of a job's life."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from hpc.executors import executor_named, executor_of, unreachable
from hpc.gateway.job import after_cancel, ensure_gateway
from hpc.job_kinds import ServingJob, job_class_of
from hpc.job_status import JobStatus
from hpc.jobs import JobRef
from hpc.model_init import ensure_model
from hpc.render import render
from hpc.slurm import SlurmError, on_cluster
from hpc.spec import Spec
from hpc.spec.site import profile_summary
from hpc.track import job_status, wait
from launcher.config import CANCEL_GRACE_S


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


def submit(
    spec: Spec,
    executor: str | None = None,
    deploy_dir: Path | None = None,
    note: Callable[[str], object] = lambda _: None,
) -> JobRef:
    """Create the model `model.init` asks for (the explicit step render leaves out), render, then submit.
    Nothing is submitted if either fails. With a `build:` section the build job makes the model and the engine
    instead, and the serving job runs after it (hpc/engine_build/run.py); `note` hears which site profile the
    spec was merged with (the scripts hold its values) and what the build does."""
    runner = executor_named(executor)  # ValueError for an unknown name, before anything is written
    note(profile_summary(spec, explained=True))
    prepared = None
    if spec.build is not None:
        from hpc.engine_build.run import prepare

        prepared = prepare(spec)
        spec = prepared.served
    else:
        ensure_model(spec)
    rendered = render(spec, deploy_dir or new_deployment_dir(spec))
    gateway = build = None
    try:
        if prepared is not None:  # first: nothing is served from an engine that will not be there
            from hpc.engine_build.run import start

            build = start(prepared, runner, rendered.deploy_dir, note)
        if rendered.gateway_sub is not None:  # first: a gateway job sbatch refuses leaves no serving job behind
            gateway = ensure_gateway(rendered.deploy_dir, runner)
        return runner.submit(ServingJob, rendered.deploy_dir, after=build)
    except SlurmError as exc:
        if gateway is not None and gateway.job is not None:  # made for this submission only
            runner.cancel(gateway.job, 0, stoppable=False)
        if build is not None and build.deploy_dir == rendered.deploy_dir:
            runner.cancel(build, 0, stoppable=False)
        if deploy_dir is None:  # a folder made for this submission only: nothing half-done is left behind
            shutil.rmtree(rendered.deploy_dir, ignore_errors=True)
        raise SubmitError(str(exc)) from exc


def cancel(ref: JobRef, grace_s: float = CANCEL_GRACE_S) -> JobStatus:
    """Ordered stop first, then scancel for whatever is left, then wait until the job has ended (at most
    `grace_s` + 60 s); the job's last status. The CLI's `cancel` and `hpc.api.Job.cancel` are this.

    The job's executor sends the stop (hpc/executors.py): each leader's tritonserver stops taking requests,
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
    ref.cancel_marker.write_text(json.dumps({"at": time.time()}))
    executor_of(ref).cancel(ref, grace_s, stoppable)
    status = wait(ref, until=(), timeout=grace_s + 60)
    status.gateway = after_cancel(ref, grace_s)  # the gateway goes with the deployment's last job (hpc/gateway/job.py)
    return status
