"""Where a job runs: a Slurm cluster or this machine, one class each.

Why classes: what differs between the two (how a job is submitted, where its scheduler state comes from, how
it is stopped) would otherwise be `job_id.startswith("local-")` tests scattered over the tree. dask-jobqueue's `Job` /
`LocalJob` is the model: one interface, and a local class that does here what the other asks Slurm to do.
`executor_of(job)` is the one place that tells a job's executor from its id.

The Slurm side talks to Slurm only through the gateway (`hpc.scheduler.slurm`) and reads states through the process's
shared watcher (`hpc.scheduler.watch`); the local side is `hpc.jobs.local` (a detached supervisor and its local.json).

A Slurm job belongs to the cluster it was submitted to (recorded in its folder and index entry: clusters may
share $HOME). A job of another cluster than SLURM_CONF's is asked about and cancelled with `-M <its cluster>`;
when that cluster cannot be asked (not in this slurmdbd, its controller away), it reads UNKNOWN with a reason
that says so (`elsewhere`), never the state of the job of the same id here.
"""

from __future__ import annotations

import os
import shutil
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from hpc.jobs.local import JOB_ID_PREFIX, cancel_local, local_state, submit_local
from hpc.scheduler import slurm
from hpc.scheduler.index import JobRef, register
from hpc.scheduler.watch import watcher
from launcher.contracts.job_states import JobState
from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.records import read_rank_records
from launcher.contracts.stop_records import stop_acknowledged

if TYPE_CHECKING:
    from hpc.jobs.kinds import JobKind  # which imports this module: what a kind is, not how it runs

#: variables of the submitting process that are its own, never a job's (sbatch --export=ALL hands a job the
#: submitter's environment): prometheus_client's folder of a gateway worker's metrics (hpc/gateway/metrics.py
#: MULTIPROC_DIR_VAR), which the autoscaling controller in worker 0 would hand each job it submits
NOT_EXPORTED = ("PROMETHEUS_MULTIPROC_DIR",)

#: how often a cancel looks for the ranks' exit records (files; the scheduler is asked at the watcher's pace)
CANCEL_POLL_S = 0.25


class Executor(ABC):
    """Submits a rendered deployment folder and stops its jobs; says what its scheduler knows of them."""

    name: ClassVar[str]
    #: its jobs wait in Slurm's queue for a partition's nodes (the partition's limits apply: hpc/doctor/preflight.py)
    queues: ClassVar[bool]

    @abstractmethod
    def submit(self, job_kind: type[JobKind], deploy_dir: Path, after: JobRef | None = None) -> JobRef:
        """Start a job of `job_kind` from the deployment folder (its script, hpc/jobs/kinds.py), once job `after`
        completed if given; return once it has an id and a job folder marked as that kind's, indexed."""

    @abstractmethod
    def scheduler_state(self, ref: JobRef) -> tuple[str, str | None]:
        """(raw state, reason): Slurm's words (PENDING, RUNNING, COMPLETING, CANCELLED …) or local.json's."""

    @abstractmethod
    def cancel(self, ref: JobRef, grace_s: float, stoppable: bool) -> None:
        """Ordered stop of every rank if `stoppable` (its ranks run), at most `grace_s`, then end the job."""

    def other_cluster(self, ref: JobRef) -> str | None:
        """The cluster the job belongs to when that is not the one this process talks to, else None."""
        return None


def job_environment() -> dict[str, str]:
    """What a submitted job gets of this process's environment: all of it but NOT_EXPORTED."""
    return {name: value for name, value in os.environ.items() if name not in NOT_EXPORTED}


class SlurmExecutor(Executor):
    name = "slurm"
    queues = True

    def submit(self, job_kind: type[JobKind], deploy_dir: Path, after: JobRef | None = None) -> JobRef:
        """sbatch the kind's script as it is (raises hpc.scheduler.slurm.SlurmError with sbatch's words), mark and index the
        job. After a build job: only once it completed, and cancelled by Slurm if it did not (instead of pending
        forever)."""
        chain = [f"--dependency=afterok:{after.job_id}", "--kill-on-invalid-dep=yes"] if after is not None else []
        job_id = slurm.default.sbatch(Deployment(deploy_dir).root / job_kind.script, chain, env=job_environment())
        paths = JobPaths(deploy_dir, job_id).create()
        job_kind.mark(paths)  # `status` knows its kind while it is still pending
        return self._indexed(job_id, paths.folder)

    @staticmethod
    def _indexed(job_id: str, job_dir: Path) -> JobRef:
        """A job sbatch just queued on the cluster SLURM_CONF names: its cluster recorded, indexed, watched."""
        cluster = slurm.default.cluster_name()
        register(job_id, job_dir, cluster)
        watcher().arm(job_id)
        return JobRef(job_id, job_dir, cluster)

    def other_cluster(self, ref: JobRef) -> str | None:
        """The job's recorded cluster when it is not SLURM_CONF's, else None. A job without a record is the current
        cluster's (DEVELOPERS.md "The job index"), and so is every job while Slurm cannot say which cluster that is
        (scontrol show config failed): taken for another cluster's, each would be asked with `-M` of a controller that
        is likely away too, read UNKNOWN and unreachable, and `wait` would return at once."""
        cluster = ref.cluster
        if cluster is None:
            return None
        current = slurm.default.cluster_name()
        return cluster if current is not None and cluster != current else None

    def scheduler_state(self, ref: JobRef) -> tuple[str, str | None]:
        cluster = self.other_cluster(ref)
        raw, reason = watcher().state(ref.job_id, cluster)
        if cluster is not None and raw == JobState.UNKNOWN:
            return raw, elsewhere(ref.job_id, cluster)
        return raw, reason

    def cancel(self, ref: JobRef, grace_s: float, stoppable: bool) -> None:
        """The ranks' launchers see the cancel marker and stop in order by themselves (no signal: Slurm's
        reaches every process of the steps, tritonserver too, before its model drained; launcher/node/stop.py
        LeaderDrain); a launcher that did not start its stop within `STOP_ACK_S` (written before the launchers
        watched the marker) gets `scancel --signal=TERM`, as Slurm's time limit does. Once every rank has written
        its exit record (or `grace_s` passed, or the job ended), plain `scancel` ends what is left. Each signal
        re-arms the watcher, so the end is seen within seconds."""
        cluster = self.other_cluster(ref)  # never the job of the same id on the cluster SLURM_CONF names
        if stoppable:
            deadline = time.monotonic() + grace_s
            if not stop_acknowledged(ref.paths, poll_s=CANCEL_POLL_S):
                slurm.default.scancel(ref.job_id, signal="TERM", cluster=cluster)
            watcher().arm(ref.job_id, cluster)
            while time.monotonic() < deadline:
                if len(read_rank_records(ref.paths)) >= ref.world_size:
                    break
                if slurm.ended(self.scheduler_state(ref)[0]):
                    break
                time.sleep(CANCEL_POLL_S)
        slurm.default.scancel(ref.job_id, cluster=cluster)
        watcher().arm(ref.job_id, cluster)


class LocalExecutor(Executor):
    """This machine: the job runs under a detached supervisor (`hpc.jobs.local_run`), its id `local-<hex>`."""

    name = "local"
    queues = False

    def submit(self, job_kind: type[JobKind], deploy_dir: Path, after: JobRef | None = None) -> JobRef:
        """`after` must have completed already: local jobs cannot wait for each other (hpc/jobs/build.py waits)."""
        return submit_local(deploy_dir, job_kind)

    def scheduler_state(self, ref: JobRef) -> tuple[str, str | None]:
        return local_state(ref.job_dir)

    def cancel(self, ref: JobRef, grace_s: float, stoppable: bool) -> None:
        cancel_local(ref, grace_s)


EXECUTORS: dict[str, type[Executor]] = {"slurm": SlurmExecutor, "local": LocalExecutor}


def default_executor() -> str:
    """Slurm where there is a Slurm, else this machine."""
    return "slurm" if shutil.which("sbatch") else "local"


def executor_named(name: str | None) -> Executor:
    """`--executor NAME` (None: the default); ValueError naming the choices for anything else."""
    name = name or default_executor()
    if name not in EXECUTORS:
        raise ValueError(f"--executor {name!r}: use {' or '.join(EXECUTORS)}")
    return EXECUTORS[name]()


def executor_of(ref: JobRef) -> Executor:
    """The executor that runs a job: local jobs are the ones whose id the local executor gave out."""
    return LocalExecutor() if ref.job_id.startswith(JOB_ID_PREFIX) else SlurmExecutor()


def watch(refs: list[JobRef]) -> None:
    """Tell the Slurm watcher about every Slurm job of a listing before the first status is asked, so one
    sacct (and one squeue) covers them all, per cluster."""
    for ref in refs:
        executor = executor_of(ref)
        if isinstance(executor, SlurmExecutor):
            watcher().watch(ref.job_id, cluster=executor.other_cluster(ref))


def unreachable(ref: JobRef) -> str | None:
    """Why a job of another cluster cannot be asked about (nor told anything) from here: UNKNOWN there, in
    `elsewhere`'s words; None for any other job. The scheduler's answer only (the watcher's): no record read, no
    gateway probed."""
    executor = executor_of(ref)
    if executor.other_cluster(ref) is None:
        return None
    raw, reason = executor.scheduler_state(ref)
    return reason if raw == JobState.UNKNOWN else None


def elsewhere(job_id: str, cluster: str) -> str:
    """Why a job of another cluster has no state here: which cluster it is of, which one this is, and what
    went wrong asking its own (or that its own does not know it)."""
    current = slurm.default.cluster_name()
    conf = os.environ.get("SLURM_CONF")
    here = f"this is '{current}'" if current else "Slurm here does not say which cluster it is"
    here += f" (SLURM_CONF={conf})" if conf else " (SLURM_CONF unset: Slurm's default slurm.conf)"
    why = watcher().unreachable(cluster)
    tail = f"cluster '{cluster}' cannot be asked from here: {why}" if why else f"'{cluster}' does not know the job"
    return f"job {job_id} belongs to cluster '{cluster}'; {here}; {tail}"
