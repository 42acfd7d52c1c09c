"""A job's state as every command shows it (`job_status`), waiting for one (`wait`), and stopping one (`cancel`).

The state machine is the job's kind's (hpc/jobs/kinds.py: serving, gateway and build jobs, one family); here it is
completed with what concerns any job: the Slurm cluster it belongs to, and, when asked, its deployment's gateway.
Here, above the kinds, the executors and the deployment's gateway (hpc/jobs/gateway.py), because stopping a job
asks all three: its kind whether its ranks stop in order, its executor to stop it, and the gateway whether it
goes with the deployment's last job. The deployment's gateway (hpc/jobs/gateway.py, and through it the spec's
modules) is imported only where a gateway is asked about, so that `status` of a job stays light.

A job of another Slurm cluster than SLURM_CONF's (clusters may share $HOME, and so the job index) is asked about
on its own cluster (`sacct`/`squeue -M`, hpc/jobs/executors.py); when that cluster cannot be asked it is UNKNOWN,
`unreachable`, and the reason says which cluster it belongs to and which this is: never the state of the job of
the same id here. `wait` returns at once on it (there is nothing to wait for from here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hpc.jobs.executors import executor_of, unreachable, watch
from hpc.jobs.kinds import GatewayJob, job_class_of, job_of
from hpc.jobs.status import JobStatus
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import SlurmError, on_cluster
from launcher.contracts.config import CANCEL_GRACE_S
from launcher.contracts.job_states import JobState
from launcher.contracts.stop_records import BY_CANCEL, StopRequest

if TYPE_CHECKING:
    from hpc.serving.gateway_record import GatewayLine

UNKNOWN_GIVE_UP_S = 120.0
#: `wait`'s back-off: 1 s after a change, growing with the time since (an eighth of it) up to 5 s. Only the
#: job folder is read that often; the scheduler is asked at the watcher's own pace (hpc/scheduler/watch.py).
MIN_POLL_S, MAX_POLL_S = 1.0, 5.0


def job_status(ref: JobRef, with_gateway: bool = False) -> JobStatus:
    """The job's state now; `with_gateway`: and the deployment's gateway (one more record read and probe)."""
    status = job_of(ref).status()
    other = executor_of(ref).other_cluster(ref)
    status.cluster, status.other_cluster = ref.cluster, other is not None
    status.unreachable = other is not None and status.scheduler_state == JobState.UNKNOWN
    if status.unreachable:
        return status  # nothing of it is known here: no gateway line either
    if with_gateway:
        from hpc.jobs.gateway import deployment_gateway
        from hpc.serving.deployment import target_of_folder
        from hpc.spec import SpecError

        try:
            status.gateway = deployment_gateway(target_of_folder(ref.deploy_dir))
        except (SpecError, OSError):
            pass  # a folder without a readable spec.yaml (rendered by hand): the job's own status stands
    return status


def wait(
    ref: JobRef,
    *,
    until: tuple[str, ...] = (JobState.READY,),
    timeout: float | None = None,
    on_change: Callable[[JobStatus], object] | None = None,
    poll_s: float | None = None,
) -> JobStatus:
    """Poll until the job reaches one of `until` or ends, backing off while nothing changes (a fixed `poll_s`
    if given). Never waits forever on UNKNOWN: a job the scheduler has not heard of for UNKNOWN_GIVE_UP_S is
    reported as it is."""
    start = changed_at = time.monotonic()
    unknown_since: float | None = None
    last = None
    while True:
        status = job_status(ref)
        key = (status.state, status.reason, len(status.endpoints), tuple((r.replica, r.phase) for r in status.starting))
        if key != last:
            changed_at = time.monotonic()
            if on_change is not None:
                on_change(status)
        last = key
        if status.state in until or status.done or status.unreachable:
            return status
        now = time.monotonic()
        if status.state == JobState.UNKNOWN:
            unknown_since = unknown_since or now
            if now - unknown_since > UNKNOWN_GIVE_UP_S:
                return status
        else:
            unknown_since = None
        if timeout is not None and now - start > timeout:
            return status
        time.sleep(poll_s if poll_s is not None else min(MAX_POLL_S, max(MIN_POLL_S, (now - changed_at) / 8)))


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
    stoppable = job_class_of(ref.job_dir).stoppable and job_status(ref).state in (
        JobState.STARTING,
        JobState.READY,
        JobState.CANCELLING,
    )
    StopRequest(at=time.time(), by=BY_CANCEL).write(ref.cancel_marker)
    executor_of(ref).cancel(ref, grace_s, stoppable)
    status = wait(ref, until=(), timeout=grace_s + 60)
    status.gateway = after_cancel(ref, grace_s)  # the gateway goes with the deployment's last job
    return status


def after_cancel(ref: JobRef, grace_s: float) -> GatewayLine | None:
    """What cancelling `ref` means for the deployment's gateway (hpc/jobs/gateway.py); the gateway's line
    afterwards (None: none).

    A gateway job: the record it may have left (killed before it could remove it) goes. A serving job: the
    gateway jobs are cancelled too when no other serving job of the deployment is still under way."""
    from hpc.jobs.gateway import UNDER_WAY, deployment_gateway, gateway_jobs_to_stop, job_line, serving_jobs
    from hpc.serving.deployment import target_of_folder
    from hpc.serving.gateway_record import GatewayLine, withdraw_job

    target = target_of_folder(ref.deploy_dir)
    if job_class_of(ref.job_dir) is GatewayJob:
        withdraw_job(target, ref.job_id)
        return job_line(ref, target)
    others = [job for job in serving_jobs(target) if job.job_id != ref.job_id]
    watch(others)  # one sacct for all of them
    if any(job_status(job).state in UNDER_WAY for job in others):
        return deployment_gateway(target)
    ended = [cancel(job, grace_s) for job in gateway_jobs_to_stop(target)]  # which come back here for the record
    if ended:  # what became of the gateway this cancel stopped (not an older one that ended before)
        return GatewayLine(ended[-1].state, job_id=ended[-1].job_id, reason=ended[-1].reason)
    return deployment_gateway(target)
