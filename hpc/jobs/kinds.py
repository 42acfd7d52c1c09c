"""The kinds of job hpc-serve submits, as one family: what each kind is, and how its state is read.

    PENDING (Slurm's reason) → STARTING → READY → COMPLETED | FAILED | CANCELLED | TIMEOUT   serving, gateway
    PENDING (Slurm's reason) → BUILDING → COMPLETED | FAILED | CANCELLED | TIMEOUT           build
                         running ↘ CANCELLING (hpc-serve cancel) → CANCELLED
                                 ↘ STOPPING (Slurm's COMPLETING: ending, processes still there) → end state

Why a family: the serving job, the deployment's gateway job and the engine build job share the cancel and
COMPLETING rules, which separate marker tests, executor methods and state functions would copy. As in submitit (`Executor.job_class`) and dask-jobqueue (a `Job`
whose subclasses set `submit_command` / `cancel_command` as class attributes), what differs between kinds is
data on the class (`kind`, `script`, `marker`, `stoppable`, `live`), the state machine is the base class's
(`JobKind.status`: the scheduler's state, the kind's own records, then the rules every kind shares), and each
kind overrides only what its records say (`observe`, `explain`). `job_class_of(job_dir)` is the one place that
tells a job folder's kind.

Where each transition is observed:
- PENDING, and the end states: the job's executor (hpc/jobs/executors.py): Slurm through the process's shared,
  throttled watcher (hpc/scheduler/watch.py: sacct, with squeue/scontrol when sacct has nothing yet or is not
  there); the local executor's local.json.
- Serving, STARTING → READY: every replica's leader has published `endpoints/replica-<k>.json`, which it does only
  once its `/v2/health/ready` answered 200 and one real request (a token through the ensemble) came back
  (launcher/node/ready.py). Until then its startup record (`endpoints/replica-<k>.starting`) says what it waits
  for: loading the models, or warming up; `status` shows it. A warm-up that fails is a rank failure (below).
- Serving, FAILED, and why: the rank exit records (`ranks/rank-<r>.json`); the earliest non-zero exit is the cause,
  the later ones are ranks that stopped with it (their record names the cause: `cause_rank`, launcher/node/watch.py)
  or that srun's --kill-on-bad-exit took down. A rank that failed makes the job FAILED at once, even while
  Slurm still says RUNNING (the step is being torn down). With `replica_policy: keep-serving` a failed rank
  ends only its replica: the job stays READY (or STARTING) on the others, listing the dead replicas, and is
  FAILED once every replica is dead. A job the scheduler calls FAILED whose ranks left no record names the ranks
  without one (hpc/jobs/status.py `failure_without_record`). A launch.json that cannot be read (launcher/contracts/plan.py
  `PlanError`: the file and the key) is never read as "1 replica of 1 rank": a running job is FAILED for it, a
  pending or ended one keeps its state, the error added to its reason.
- Restarts: a job Slurm requeued runs again under its id; the `.sub` writes `$SLURM_RESTART_COUNT`
  (`restart_count`) and puts the last run's records aside, so only this run's are read.
- Gateway: no ranks; STARTING while it runs, READY once the deployment's address record names it and answers.
- Build: BUILDING while it runs (its current step, `build_step.json`), FAILED as soon as its script recorded a
  failed step (`build_failed.json`; both launcher/contracts/build_records.py `BuildStep` records), COMPLETED with the engine it
  built.
- Every kind: CANCELLING while the user's stop (the cancel marker) is under way and the scheduler still runs the
  job (squeue's COMPLETING counts as running); CANCELLED only once the scheduler says it has ended *and* no longer
  lists it as COMPLETING, i.e. no process of it is left (Slurm reports a job's end state while its processes are
  still being killed). Without the marker a COMPLETING job that was serving (or building) reads STOPPING.

No state, and no failed rank, is ever read from log text: states come from the scheduler and the records; log
tails are only shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from hpc.jobs.executors import executor_of
from hpc.jobs.status import JobStatus, dead_replicas, failure_without_record, first_failure
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import state_class
from launcher.contracts.config import START_CRASH_RESTARTS
from launcher.contracts.layout import (
    BUILD_JOB_MARKER_NAME,
    BUILD_SUB_NAME,
    GATEWAY_JOB_MARKER_NAME,
    GATEWAY_SUB_NAME,
    SUB_NAME,
    JobPaths,
)
from launcher.contracts.plan import KEEP_SERVING, RESTART, PlanError
from launcher.contracts.records import (
    RESTARTING,
    RankExitRecord,
    StartupRecord,
    read_ended_run,
    read_endpoints,
    read_gateway,
    read_rank_records,
    read_replica_restarts,
    read_startups,
)

if TYPE_CHECKING:
    from hpc.serving.deployment import Target

#: a job's states while it is under way (a keep-serving job lists its dead replicas only then)
ACTIVE = ("PENDING", "STARTING", "READY", "BUILDING", "CANCELLING", "STOPPING")


class JobKind:
    """One kind of job. The class says what the kind is; an instance reads one job's state (`job_of(ref).status()`)."""

    #: `JobStatus.kind`, and what `list` shows beside the id of a job that does not serve
    kind: ClassVar[str]
    #: the sbatch script of the deployment folder that runs it (launcher/contracts/layout.py; render or the build writes it)
    script: ClassVar[str]
    #: the file that marks its job folder (the executor writes it at submit, the script again when it starts, so a
    #: pending job is known too); None: the unmarked folder, a serving job's
    marker: ClassVar[str | None]
    #: `cancel` stops its ranks in order first (they watch the cancel marker, launcher/node/stop.py), else a plain
    #: scancel stops it; the local executor starts the ranks itself rather than running its script
    stoppable: ClassVar[bool]
    #: what it reads while it runs undisturbed: Slurm's COMPLETING turns these into STOPPING
    live: ClassVar[tuple[str, ...]]

    def __init__(self, ref: JobRef) -> None:
        self.ref = ref

    @classmethod
    def mark(cls, paths: JobPaths) -> None:
        """Mark a new job folder as this kind's, before anything asks its state."""
        if cls.marker is not None:
            (paths.folder / cls.marker).touch()

    @classmethod
    def marked_at(cls, job_dir: Path) -> float:
        """When the folder was last marked as this kind's (its marker's time); 0.0: it is not (or has no marker)."""
        try:
            return (job_dir / cls.marker).stat().st_mtime if cls.marker is not None else 0.0
        except OSError:
            return 0.0

    def status(self) -> JobStatus:
        """The job's state now: the scheduler's word (launcher/contracts/slurm.py `state_class`: PENDING, RUNNING, an end),
        refined by the kind's records (`observe`), then the rules every kind shares (`_settle`), then the kind's
        account of the state it came to (`explain`)."""
        raw, reason = executor_of(self.ref).scheduler_state(self.ref)
        status = JobStatus(self.ref.job_id, state_class(raw), reason, raw, str(self.ref.job_dir), kind=self.kind)
        running = status.state == "RUNNING"
        self.observe(status)
        self._settle(status, running)
        self.explain(status)
        return status

    def observe(self, status: JobStatus) -> None:
        """Refine the scheduler's RUNNING (and, where the records know better, an end) from the job folder."""

    def explain(self, status: JobStatus) -> None:
        """Fill in what `status` says of the state the job came to (a reason, what failed)."""

    def _settle(self, status: JobStatus, running: bool) -> None:
        """A stop the user asked for (the cancel marker, `hpc.jobs.submit.cancel`): CANCELLING while the scheduler runs the
        job, CANCELLED once it ended however its processes exited. Slurm's COMPLETING without it: STOPPING. A job
        that stops offers nothing (no endpoint, no URL), and only a FAILED job names a failed rank."""
        cancelled = self.ref.cancel_marker.exists()
        if cancelled and running:
            status.state = "CANCELLING"
        elif status.scheduler_state == "COMPLETING" and status.state in self.live:
            status.state = "STOPPING"  # the job is ending (time limit, scancel): nothing to offer
        elif cancelled and status.state in ("COMPLETED", "FAILED"):
            status.state = "CANCELLED"
        if status.state in ("CANCELLING", "STOPPING"):
            status.endpoints, status.url = [], None
        if status.state != "FAILED":
            status.failed_rank = None


class ServingJob(JobKind):
    """The deployment's ranks (tensorrt_llm_triton.sub): one tritonserver per rank, one srun step per replica."""

    kind = "serving"
    script = SUB_NAME
    marker = None
    stoppable = True
    live = ("STARTING", "READY")

    # what `observe` read that `explain` needs: why the plan could not be read, the rank records, the job's world
    # size, the startup records
    _plan_error: PlanError | None
    _ranks: list[RankExitRecord]
    _world: int
    _starting: list[StartupRecord]

    def observe(self, status: JobStatus) -> None:
        """Endpoint records make it READY, rank records FAILED (keep-serving: once every replica is dead)."""
        ref = self.ref
        try:
            plan = ref.launch_plan()
        except PlanError as exc:
            self._without_plan(status, exc)
            return
        self._plan_error = None
        replicas, per_replica = plan.replicas, plan.world_size_per_replica
        keep_serving, restart = plan.replica_policy == KEEP_SERVING, plan.replica_policy == RESTART
        running = status.state == "RUNNING"
        endpoints = read_endpoints(ref.paths) if running else []
        ranks = read_rank_records(ref.paths)
        failure = first_failure(ranks)
        # replicas the `.sub` starts again (restart; any policy: a start crash), not counted against READY
        serving = {e.replica for e in endpoints}
        down = self._restarts_of(status, dead_replicas(ranks, per_replica), serving, per_replica, restart)
        down = down if running else set()
        if down:  # the cause is a replica's that is not started again (the bound, or a rank that gave up for good)
            failure = first_failure([r for r in ranks if r.rank // per_replica not in down])
        kept = [r for r in ranks if r.rank // per_replica not in down]
        dead = dead_replicas(kept, per_replica) if keep_serving else {}
        if keep_serving and running and len(dead) < replicas:
            failure = None  # the others serve on (`dead_replicas` says which died, and why)
            endpoints = [e for e in endpoints if e.replica not in dead]
        endpoints = [e for e in endpoints if e.replica not in down]
        if running:
            if failure is not None:
                status.state = "FAILED"
            else:
                ready = len(endpoints) >= replicas - len(dead) - len(down) and (endpoints or not down)
                status.state = "READY" if ready else "STARTING"
        elif status.state in ("COMPLETED", "CANCELLED", "TIMEOUT"):
            failure = failure if status.state == "COMPLETED" else None  # ranks killed by scancel or the time limit
            if failure is not None:
                status.state = "FAILED"
        status.endpoints, status.replicas, status.failed_rank = endpoints, replicas, failure
        status.dead_replicas, status.restarts = dead, self._restarts()
        self._ranks, self._world = ranks, replicas * per_replica
        self._starting = read_startups(ref.paths) if running else []

    def _without_plan(self, status: JobStatus, error: PlanError) -> None:
        """A job whose launch.json cannot be read (the error names the file and the key): never taken as "1 replica
        of 1 rank". Its ranks refuse the same plan (the launcher exits 2), so a job that runs is FAILED for that
        reason; a pending or ended one keeps the scheduler's state, the error added to its reason."""
        if status.state == "RUNNING":
            status.state = "FAILED"
        status.reason = "; ".join(filter(None, (status.reason, str(error))))
        status.restarts = self._restarts()
        self._plan_error, self._ranks, self._world, self._starting = error, [], 0, []

    def explain(self, status: JobStatus) -> None:
        """FAILED names a rank (else the ranks without a record; none when the plan that says how many there are
        cannot be read); STARTING what the replicas not ready wait for."""
        if status.state == "FAILED" and status.failed_rank is None and self._plan_error is None:
            status.failed_rank = failure_without_record(self.ref, self._ranks, self._world)
        if status.state not in ACTIVE:
            status.dead_replicas = {}
        if status.state == "STARTING":
            ready = {e.replica for e in status.endpoints}
            status.starting = [
                r for r in self._starting if r.replica not in ready and r.replica not in status.dead_replicas
            ]

    def _restarts_of(
        self,
        status: JobStatus,
        dead: dict[int, RankExitRecord],
        serving: set[int],
        per_replica: int,
        restart: bool,
    ) -> set[int]:
        """What the `.sub` did about each replica that ended (its ReplicaRestart, the cause of its last run's end)
        into ``status``; the replicas that are down and start again: those it restarts that serve no endpoint yet,
        and those dead now that it has not taken up yet and will restart (replica_policy restart: unless their
        record says it gave up; any policy: a start crash, START_CRASH_RESTARTS times)."""
        paths = self.ref.paths
        records = read_replica_restarts(paths)
        status.replica_restarts = records
        for replica, record in records.items():
            if record.restarts and (cause := first_failure(read_ended_run(paths, replica, record.restarts))):
                status.restart_causes[replica] = cause
        down = {r for r, record in records.items() if record.outcome == RESTARTING and r not in serving}
        for replica, cause in dead.items():
            latest = records.get(replica)
            if restart:
                again = latest is None or latest.outcome == RESTARTING
            else:
                ranks = range(replica * per_replica, (replica + 1) * per_replica)
                crashed = any(paths.start_crash(rank).exists() for rank in ranks)
                again = crashed and (latest is None or latest.restarts < START_CRASH_RESTARTS)
            if again:
                status.restart_causes[replica] = cause
                down.add(replica)
        status.restarting = sorted(down)
        return down

    def _restarts(self) -> int:
        try:
            return int(self.ref.paths.restart_count.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0


class GatewayJob(JobKind):
    """The deployment's gateway as a job of its own (gateway.sub, hpc/jobs/gateway.py): no ranks, no replicas."""

    kind = "gateway"
    script = GATEWAY_SUB_NAME
    marker = GATEWAY_JOB_MARKER_NAME
    stoppable = False  # it stops on scancel's SIGTERM
    live = ("STARTING", "READY")

    def __init__(self, ref: JobRef, target: Target | None = None) -> None:
        super().__init__(ref)
        self.target = target  # the deployment it serves, when the caller knows it already

    def observe(self, status: JobStatus) -> None:
        """READY once the deployment's address record names this job and answers there; STARTING until then."""
        if status.state != "RUNNING":
            return
        from hpc.serving.deployment import target_of_folder
        from hpc.serving.gateway_record import answers, record_path

        target = self.target or target_of_folder(self.ref.deploy_dir)
        record = read_gateway(record_path(target))
        if record is not None and record.job_id == self.ref.job_id and answers(record, target):
            status.state, status.url = "READY", record.url
        else:
            status.state = "STARTING"

    def explain(self, status: JobStatus) -> None:
        if status.state == "FAILED":
            status.reason = self._log_reason() or status.reason

    def _log_reason(self) -> str | None:
        """Why a gateway job failed, in its own words: the last `hpc-serve: …` line of its batch log, else its last
        line that is not an access-log entry (those are JSON lines on the same stderr)."""
        deployment = self.ref.paths.deployment
        for stream in ("err", "out"):  # Slurm: -e has it; the local executor writes both streams to .out
            try:
                text = deployment.sbatch_log(stream, self.ref.job_id).read_text(errors="replace")
            except OSError:
                continue
            lines = [line for line in text.splitlines() if line.strip() and not line.startswith("{")]
            ours = [line for line in lines if line.startswith("hpc-serve:")]
            if ours or lines:
                return (ours or lines)[-1][:400]
        return None


class BuildJob(JobKind):
    """An engine build (build.sub, hpc/jobs/): its steps, one after the other, on one node."""

    kind = "build"
    script = BUILD_SUB_NAME
    marker = BUILD_JOB_MARKER_NAME
    stoppable = False  # its steps stop on scancel's SIGTERM
    live = ("BUILDING",)

    def observe(self, status: JobStatus) -> None:
        """FAILED as soon as the script recorded a failed step (before Slurm has seen the job end); BUILDING while
        it runs."""
        if self.ref.paths.build_failure.exists():
            status.state = "FAILED"
        elif status.state == "RUNNING":
            status.state = "BUILDING"

    def explain(self, status: JobStatus) -> None:
        """The step it is at, what it built, or the failed step with its command and its output's last lines."""
        from hpc.jobs.build import build_reason

        status.reason = build_reason(self.ref, status.state, status.reason)


#: every kind; the marked ones first: a folder without a marker is a serving job's
KINDS: tuple[type[JobKind], ...] = (GatewayJob, BuildJob, ServingJob)


def job_class_of(job_dir: Path) -> type[JobKind]:
    """The kind of the job whose folder this is, from its marker: the one place a folder's kind is told."""
    return next(kind for kind in KINDS if kind.marker is None or (job_dir / kind.marker).exists())


def job_of(ref: JobRef) -> JobKind:
    """The job as its kind reads it."""
    return job_class_of(ref.job_dir)(ref)
