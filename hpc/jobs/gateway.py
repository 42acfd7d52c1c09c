"""The gateway as a job of its own (a spec's `gateway:` section): submitted once per deployment, tracked like
the serving jobs, and ended with the deployment's last job.

Why a job apart from the serving jobs and not a step inside them: the gateway's address must outlive any one
job (a renewed successor, a second job for more capacity), so its life cannot be tied to one of them. Hence:
- `submit` reuses the deployment's gateway when one answers (started by hand or as a job) or a gateway job is
  still pending or starting, and submits a new one only otherwise;
- `cancel` of a serving job (hpc/jobs/track.py) leaves the gateway alone while another job of the deployment is pending or
  running (it still serves those), and cancels the gateway job with the deployment's last job (nothing left
  to serve: it would only hold a node until its time limit). A gateway started by hand (`hpc-serve gateway` on
  a login node) is never stopped by hpc-serve: it is the user's own process.
Web-stack free: `status` and `submit` import this.
"""

from __future__ import annotations

import dataclasses
import fcntl
from dataclasses import dataclass
from pathlib import Path

from hpc.jobs.executors import Executor
from hpc.jobs.kinds import GatewayJob, job_class_of
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import TERMINAL
from hpc.serving.deployment import Target, job_folders, target_of_folder
from hpc.serving.gateway_record import IDLE, IDLE_REASON, GatewayLine, health, live_gateway, record_path
from launcher.contracts.job_states import JobState
from launcher.contracts.layout import Deployment, gateway_lock
from launcher.contracts.records import read_gateway

#: job states in which a gateway job serves or will serve (hpc/jobs/kinds.py's words)
UNDER_WAY = (JobState.PENDING, JobState.STARTING, JobState.READY)


def gateway_jobs(target: Target) -> list[JobRef]:
    """The deployment's gateway jobs, oldest first: by their marker (made at submit, again when the job starts),
    since job ids do not sort by time (local ids are random, Slurm's compare as text)."""
    marked = [p.folder for p in job_folders(target) if job_class_of(p.folder) is GatewayJob]
    return [JobRef(folder.name, folder) for folder in sorted(marked, key=GatewayJob.marked_at)]


def serving_jobs(target: Target) -> list[JobRef]:
    """The deployment's jobs other than its gateway's, oldest first: its serving jobs, and the engine builds
    submitted from its folders (`cancel` of the deployment stops those too)."""
    return [JobRef(p.job_id, p.folder) for p in job_folders(target) if job_class_of(p.folder) is not GatewayJob]


def job_line(ref: JobRef, target: Target) -> GatewayLine:
    """A gateway job as `status` shows it."""
    status = GatewayJob(ref, target).status()
    return GatewayLine(status.state, job_id=ref.job_id, url=status.url or "", reason=status.reason)


def deployment_gateway(target: Target) -> GatewayLine | None:
    """The deployment's gateway as `status` shows it: the one that answers at the recorded address (a job or
    a process started by hand), else its newest gateway job still under way, else how the job that left the
    record ended, else a record nothing answers at (UNREACHABLE: a gateway started by hand and killed outright),
    else how its newest gateway job ended. None: it never had one."""
    record = read_gateway(record_path(target))
    body = health(record, target) if record is not None else None
    if record is not None and body is not None:
        idle = not record.job_id and body.get("replicas_ready") == 0  # a gateway job ends with its jobs
        state, reason = (IDLE, IDLE_REASON) if idle else (JobState.READY, None)
        return GatewayLine(state, job_id=record.job_id, url=record.url, host=record.host, pid=record.pid, reason=reason)
    newest: tuple[JobRef, GatewayLine] | None = None
    for ref in reversed(gateway_jobs(target)):
        line = job_line(ref, target)
        if line.state in UNDER_WAY or line.state == JobState.CANCELLING:
            return line
        newest = newest or (ref, line)
    if record is not None and newest is not None and newest[1].job_id == record.job_id and newest[1].state in TERMINAL:
        return _ended_with_its_record_left(*newest)
    if record is not None:
        return GatewayLine(
            "UNREACHABLE",
            job_id=record.job_id,
            url=record.url,
            host=record.host,
            pid=record.pid,
            reason=f"nothing answers there; a stale record {record_path(target)}",
        )
    return newest[1] if newest is not None else None


def _ended_with_its_record_left(ref: JobRef, line: GatewayLine) -> GatewayLine:
    """A gateway job that ended without removing its record (its gateway killed outright more often than the job
    starts it again, or the job itself killed): how it ended, and how to start another, rather than UNREACHABLE."""
    restart = f"`sbatch {Deployment(ref.deploy_dir).gateway_sub}` starts another"
    return dataclasses.replace(line, reason="; ".join(filter(None, (line.reason, restart))))


@dataclass(frozen=True)
class GatewayStart:
    """What `submit` did about the gateway: reused the one that runs (or is on its way), or submitted `job`."""

    line: GatewayLine
    job: JobRef | None = None

    @property
    def submitted(self) -> bool:
        return self.job is not None


def ensure_gateway(deploy_dir: Path, runner: Executor) -> GatewayStart:
    """Reuse the deployment's gateway if one runs or is under way, else submit `D/gateway.sub` (render wrote it).
    Under the deployment's gateway lock (an flock: released by the kernel if this process dies), so that of two
    submits at once the second sees the first's gateway job instead of submitting its own."""
    target = target_of_folder(deploy_dir)
    lock = gateway_lock(target.workdir, target.name)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return _ensure_gateway(deploy_dir, runner, target)


def _ensure_gateway(deploy_dir: Path, runner: Executor, target: Target) -> GatewayStart:
    live = live_gateway(target)
    if live is not None:
        return GatewayStart(GatewayLine(JobState.READY, job_id=live.job_id, url=live.url, host=live.host, pid=live.pid))
    for ref in reversed(gateway_jobs(target)):
        line = job_line(ref, target)
        if line.state in UNDER_WAY:
            return GatewayStart(line)
    job = runner.submit(GatewayJob, deploy_dir)
    return GatewayStart(GatewayLine(JobState.PENDING, job_id=job.job_id), job)


def gateway_jobs_to_stop(target: Target) -> list[JobRef]:
    """The deployment's gateway jobs that a cancel of the deployment (or of its last serving job) stops: those
    under way, and those whose cancel is (CANCELLING: cancelling again waits for its end)."""
    return [
        job
        for job in gateway_jobs(target)
        if GatewayJob(job, target).status().state in (*UNDER_WAY, JobState.CANCELLING)
    ]
