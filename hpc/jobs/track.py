"""A job's state as every command shows it (`job_status`), and waiting for one (`wait`).

The state machine is the job's kind's (hpc/jobs/kinds.py: serving, gateway and build jobs, one family); here it is
completed with what concerns any job: the Slurm cluster it belongs to, and, when asked, its deployment's gateway.

A job of another Slurm cluster than SLURM_CONF's (clusters may share $HOME, and so the job index) is asked about
on its own cluster (`sacct`/`squeue -M`, hpc/jobs/executors.py); when that cluster cannot be asked it is UNKNOWN,
`unreachable`, and the reason says which cluster it belongs to and which this is: never the state of the job of
the same id here. `wait` returns at once on it (there is nothing to wait for from here).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hpc.jobs.executors import executor_of
from hpc.jobs.kinds import job_of
from hpc.jobs.status import JobStatus
from hpc.scheduler.index import JobRef

UNKNOWN_GIVE_UP_S = 120.0
#: `wait`'s back-off: 1 s after a change, growing with the time since (an eighth of it) up to 5 s. Only the
#: job folder is read that often; the scheduler is asked at the watcher's own pace (hpc/scheduler/watch.py).
MIN_POLL_S, MAX_POLL_S = 1.0, 5.0


def job_status(ref: JobRef, with_gateway: bool = False) -> JobStatus:
    """The job's state now; `with_gateway`: and the deployment's gateway (one more record read and probe)."""
    status = job_of(ref).status()
    other = executor_of(ref).other_cluster(ref)
    status.cluster, status.other_cluster = ref.cluster, other is not None
    status.unreachable = other is not None and status.scheduler_state == "UNKNOWN"
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
    until: tuple[str, ...] = ("READY",),
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
        if status.state == "UNKNOWN":
            unknown_since = unknown_since or now
            if now - unknown_since > UNKNOWN_GIVE_UP_S:
                return status
        else:
            unknown_since = None
        if timeout is not None and now - start > timeout:
            return status
        time.sleep(poll_s if poll_s is not None else min(MAX_POLL_S, max(MIN_POLL_S, (now - changed_at) / 8)))
