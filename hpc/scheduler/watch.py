"""What Slurm says about the jobs this process looks at, asked politely: batched, throttled, cached.

Modelled on submitit's `SlurmInfoWatcher` (one per process, one `sacct` for every job it watches, calls at
0, 2, 4, 8 … s after the newest job, then at most every `max_delay_s`, ended jobs cached and never asked about
again), without its two problems for hpc-serve: its "finished" test counts any state outside a short list as
final (SUSPENDED, CONFIGURING, REQUEUE_HOLD would be cached for good), and it runs sacct with no timeout. Here
a job is final only in a state it cannot leave (`hpc.scheduler.slurm.ended`) once squeue no longer shows it COMPLETING,
and every command goes through the gateway (`hpc.scheduler.slurm`).

Per refresh: one `sacct` for every watched job that has not ended; one `squeue` for those that sacct does not
know yet, that are PENDING (for Slurm's reason) or that sacct says have ended (their processes may still be
being killed: COMPLETING); `scontrol` only for what neither knows (accounting off, no squeue). Something
the user did to a job (submit, cancel) calls `arm(job)`: the schedule restarts at 2 s, so the change is seen
soon without polling fast for ever.

Jobs are watched per cluster (None: the one SLURM_CONF names; else a job of another cluster, asked with `-M`):
job ids are unique per cluster only. A refresh makes its calls once per cluster with jobs to ask about, and
keeps what went wrong asking another cluster (`unreachable`), which says why its jobs read UNKNOWN.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hpc.scheduler import slurm
from hpc.scheduler.slurm import MAX_DELAY_S, SlurmError, SlurmNotInstalled, ended
from launcher.contracts.job_states import JobState

MIN_DELAY_S = 2.0
#: a watched job: (its cluster, None for the current one; its id)
Key = tuple[str | None, str]


@dataclass
class _Job:
    armed_at: float
    sacct: str | None = None  # the last state sacct gave, None while it has none
    state: tuple[str, str | None] = (JobState.UNKNOWN, None)
    answered: bool = False  # a refresh has covered it (its first question waits for none)
    final: bool = False


class SlurmWatcher:
    """The Slurm state of every job this process asks about, refreshed at most as often as the schedule says."""

    def __init__(
        self,
        gateway: slurm.Slurm | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        min_delay_s: float = MIN_DELAY_S,
        max_delay_s: float = MAX_DELAY_S,
    ):
        self._gateway = gateway
        self.clock, self.min_delay_s, self.max_delay_s = clock, min_delay_s, max_delay_s
        self._jobs: dict[Key, _Job] = {}
        self._errors: dict[str, str] = {}  # another cluster → why the last refresh could not ask it
        self._last_refresh = float("-inf")
        self._lock = threading.RLock()  # API users may wait on several jobs from threads: still one refresh

    @property
    def gateway(self) -> slurm.Slurm:
        return self._gateway or slurm.default

    def watch(self, *job_ids: str, cluster: str | None = None) -> None:
        """Add jobs (of `cluster`, when another's) to the next refresh, which the first question about any of them
        makes at once: register every job of a listing before asking, and one sacct covers them all."""
        with self._lock:
            for job_id in job_ids:
                self._jobs.setdefault((cluster, job_id), _Job(armed_at=self.clock()))

    def arm(self, job_id: str, cluster: str | None = None) -> None:
        """Something happened to the job (submitted, signalled): ask about it now, then at 2, 4, 8 … s."""
        with self._lock:
            job = self._jobs.setdefault((cluster, job_id), _Job(armed_at=self.clock()))
            job.armed_at, job.final = self.clock(), False
            self._last_refresh = float("-inf")

    def state(self, job_id: str, cluster: str | None = None) -> tuple[str, str | None]:
        """(raw Slurm state, reason) as of the last refresh, refreshing first if one is due."""
        with self._lock:
            self.watch(job_id, cluster=cluster)
            if not self._jobs[(cluster, job_id)].answered or self.due():
                self.refresh()
            return self._jobs[(cluster, job_id)].state

    def unreachable(self, cluster: str) -> str | None:
        """Why the last refresh could not ask another cluster about its jobs (a command's error), or None."""
        with self._lock:
            return self._errors.get(cluster)

    def delay_s(self) -> float:
        """How long answers are good for: half the age of the newest armed job, within [min, max]."""
        active = [job.armed_at for job in self._jobs.values() if not job.final]
        if not active:
            return float("inf")
        return min(self.max_delay_s, max(self.min_delay_s, (self.clock() - max(active)) / 2))

    def due(self) -> bool:
        return self.clock() - self._last_refresh > self.delay_s()

    def refresh(self) -> None:
        """Ask Slurm about every watched job that has not ended: one sacct, at most one squeue and scontrol, per
        cluster with such jobs."""
        self._last_refresh = self.clock()
        by_cluster: dict[str | None, dict[str, _Job]] = {}
        for (cluster, job_id), job in self._jobs.items():
            if not job.final:
                by_cluster.setdefault(cluster, {})[job_id] = job
        for cluster, todo in by_cluster.items():
            self._refresh(cluster, todo)

    def _refresh(self, cluster: str | None, todo: dict[str, _Job]) -> None:
        """One cluster's jobs: sacct first, squeue for what it does not settle, scontrol for what neither knows."""
        gateway = self.gateway

        def ask(command: Callable[..., dict]) -> Callable[[list[str]], dict]:
            return functools.partial(command, cluster=cluster) if cluster else command

        if cluster:
            self._errors.pop(cluster, None)
        try:
            states = ask(gateway.sacct_states)(list(todo))
        except SlurmError as exc:
            states = {}  # no accounting (or it is away): squeue and scontrol still know live jobs
            self._failed(cluster, exc)
        for job_id, job in todo.items():
            job.sacct = states.get(job_id, job.sacct)
        wanted = [
            job_id for job_id, job in todo.items() if job.sacct in (None, JobState.PENDING) or ended(job.sacct or "")
        ]
        queue = self._ask(ask(gateway.squeue), wanted, cluster)
        unknown = [job_id for job_id, job in todo.items() if job.sacct is None and job_id not in (queue or {})]
        control = self._ask(ask(gateway.scontrol_jobs), unknown, cluster) if unknown else {}
        for job_id, job in todo.items():
            listed = None if queue is None else queue.get(job_id)
            job.state = self._resolve(job, listed, queue is None, (control or {}).get(job_id))
            job.final, job.answered = ended(job.state[0]), True

    def _failed(self, cluster: str | None, exc: SlurmError) -> None:
        """Keep the first error of a refresh asking another cluster: its stderr's first line (Slurm's words)."""
        if cluster and cluster not in self._errors:
            self._errors[cluster] = (exc.stderr.splitlines() or [str(exc)])[0]

    def _ask(self, command: Callable[[list[str]], dict], job_ids: list[str], cluster: str | None) -> dict | None:
        """A batched query: {} when there is nothing to ask or the command is not installed, None when it
        failed (after the gateway's retries) and the next refresh should try again."""
        if not job_ids:
            return {}
        try:
            return command(job_ids)
        except SlurmNotInstalled:
            return {}
        except SlurmError as exc:
            self._failed(cluster, exc)
            return None

    @staticmethod
    def _resolve(
        job: _Job, listed: tuple[str, str | None] | None, squeue_failed: bool, control: dict[str, str] | None
    ) -> tuple[str, str | None]:
        """sacct first (it survives the job's end); squeue's state and reason for a job sacct does not know or
        calls PENDING, and for one sacct says has ended while squeue still shows it COMPLETING (sacct records
        the end as soon as a job starts ending); scontrol for a job neither knows. When squeue was needed and
        failed for now, the last answer stands (better than UNKNOWN, or an end cached too early)."""
        state, reason = job.sacct or JobState.UNKNOWN, None
        if listed is not None and not (ended(state) and ended(listed[0])):
            state, reason = listed
        if state == JobState.UNKNOWN and control:
            state, reason = control.get("JobState", JobState.UNKNOWN), control.get("Reason")
        elif (
            squeue_failed
            and (job.sacct in (None, JobState.PENDING) or ended(state))
            and job.state[0] != JobState.UNKNOWN
        ):
            return job.state
        return state, (None if reason in (None, "None", "(null)") else reason)


#: the process's watcher, shared by every job status this process computes (tests put their own here)
shared = SlurmWatcher()


def watcher() -> SlurmWatcher:
    """The process's shared watcher."""
    return shared
