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
kind overrides only what its records say (`observe`, `explain`) and its own words for it (`describe`, what
`JobStatus.summary` prints). `job_class_of(job_dir)` is the one place that tells a job folder's kind.

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

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hpc.jobs.executors import executor_of
from hpc.jobs.status import (
    SUMMARIES,
    JobStatus,
    dead_replicas,
    describe_failure,
    failure_without_record,
    first_failure,
)
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import TERMINAL, state_class
from launcher.contracts.build_records import BuildRequest, BuildStep, read_record
from launcher.contracts.config import START_CRASH_RESTARTS
from launcher.contracts.job_states import COMPLETING, JobState
from launcher.contracts.layout import (
    BUILD_JOB_MARKER_NAME,
    BUILD_SUB_NAME,
    GATEWAY_JOB_MARKER_NAME,
    GATEWAY_SUB_NAME,
    PROBE_SUB_NAME,
    SUB_NAME,
    Deployment,
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
from launcher.contracts.slurm import pending_reason

if TYPE_CHECKING:
    from hpc.serving.deployment import Target

#: a job's states while it is under way (a keep-serving job lists its dead replicas only then)
ACTIVE = (
    JobState.PENDING,
    JobState.STARTING,
    JobState.READY,
    JobState.BUILDING,
    JobState.CANCELLING,
    JobState.STOPPING,
)
#: lines of a failed build's output that `status` shows
TAIL_LINES = 12


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
    #: scancel stops it
    stoppable: ClassVar[bool]
    #: it runs after the deployment's engine builds: `status` lists them while it is not READY
    after_builds: ClassVar[bool] = False
    #: what it reads while it runs undisturbed: Slurm's COMPLETING turns these into STOPPING
    live: ClassVar[tuple[JobState, ...]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Each kind's account of its status is what a status of that kind says (hpc/jobs/status.py SUMMARIES)."""
        super().__init_subclass__(**kwargs)
        SUMMARIES[cls.kind] = cls.summary

    def __init__(self, ref: JobRef) -> None:
        self.ref = ref

    @classmethod
    def list_label(cls, status: JobStatus) -> str:
        """The job as `hpc-serve list` names it: its id (`33@twin` for another cluster's) and its kind."""
        return f"{status.label} ({cls.kind})"

    @classmethod
    def summary(cls, status: JobStatus) -> str:
        """What `hpc-serve status` prints of a job of this kind: the kind's own account (`describe`; for a job of
        another cluster that cannot be asked, only why), then the deployment's gateway when it was asked for."""
        text = f"{status.label} {status.state} ({status.reason})" if status.unreachable else cls.describe(status)
        return text + cls._gateway_line(status)

    @classmethod
    def describe(cls, status: JobStatus) -> str:
        """The job's state and what the kind says of it."""
        return f"{status.label} {status.state}"

    @classmethod
    def _gateway_line(cls, status: JobStatus) -> str:
        return f"\n{status.gateway.summary()}" if status.gateway is not None else ""

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
        running = status.state == JobState.RUNNING
        self.observe(status)
        self._settle(status, running)
        self.explain(status)
        return status

    def observe(self, status: JobStatus) -> None:
        """Refine the scheduler's RUNNING (and, where the records know better, an end) from the job folder."""

    def explain(self, status: JobStatus) -> None:
        """Fill in what `status` says of the state the job came to (a reason, what failed)."""

    def _settle(self, status: JobStatus, running: bool) -> None:
        """A stop the user asked for (the cancel marker, `hpc.jobs.track.cancel`): CANCELLING while the scheduler runs the
        job, CANCELLED once it ended however its processes exited. Slurm's COMPLETING without it: STOPPING. A job
        that stops offers nothing (no endpoint, no URL), and only a FAILED job names a failed rank."""
        cancelled = self.ref.cancel_marker.exists()
        if cancelled and running:
            status.state = JobState.CANCELLING
        elif status.scheduler_state == COMPLETING and status.state in self.live:
            status.state = JobState.STOPPING  # the job is ending (time limit, scancel): nothing to offer
        elif cancelled and status.state in (JobState.COMPLETED, JobState.FAILED):
            status.state = JobState.CANCELLED
        if status.state in (JobState.CANCELLING, JobState.STOPPING):
            status.endpoints, status.url = [], None
        if status.state != JobState.FAILED:
            status.failed_rank = None


class ServingJob(JobKind):
    """The deployment's ranks (tensorrt_llm_triton.sub): one tritonserver per rank, one srun step per replica."""

    kind = "serving"
    script = SUB_NAME
    marker = None
    stoppable = True
    after_builds = True

    @classmethod
    def list_label(cls, status: JobStatus) -> str:
        """A serving job is named by its id alone: most jobs in the list serve."""
        return status.label

    live = (JobState.STARTING, JobState.READY)

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
        running = status.state == JobState.RUNNING
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
                status.state = JobState.FAILED
            else:
                ready = len(endpoints) >= replicas - len(dead) - len(down) and (endpoints or not down)
                status.state = JobState.READY if ready else JobState.STARTING
        elif status.state in (JobState.COMPLETED, JobState.CANCELLED, JobState.TIMEOUT):
            failure = (
                failure if status.state == JobState.COMPLETED else None
            )  # ranks killed by scancel or the time limit
            if failure is not None:
                status.state = JobState.FAILED
        status.endpoints, status.replicas, status.failed_rank = endpoints, replicas, failure
        status.dead_replicas, status.restarts = dead, self._restarts()
        self._ranks, self._world = ranks, replicas * per_replica
        self._starting = read_startups(ref.paths) if running else []

    def _without_plan(self, status: JobStatus, error: PlanError) -> None:
        """A job whose launch.json cannot be read (the error names the file and the key): never taken as "1 replica
        of 1 rank". Its ranks refuse the same plan (the launcher exits 2), so a job that runs is FAILED for that
        reason; a pending or ended one keeps the scheduler's state, the error added to its reason."""
        if status.state == JobState.RUNNING:
            status.state = JobState.FAILED
        status.reason = "; ".join(filter(None, (status.reason, str(error))))
        status.restarts = self._restarts()
        self._plan_error, self._ranks, self._world, self._starting = error, [], 0, []

    def explain(self, status: JobStatus) -> None:
        """FAILED names a rank (else the ranks without a record; none when the plan that says how many there are
        cannot be read); STARTING what the replicas not ready wait for."""
        if status.state == JobState.FAILED and status.failed_rank is None and self._plan_error is None:
            status.failed_rank = failure_without_record(self.ref, self._ranks, self._world)
        if status.state not in ACTIVE:
            status.dead_replicas = {}
        if status.state == JobState.STARTING:
            ready = {e.replica for e in status.endpoints}
            status.starting = [
                r for r in self._starting if r.replica not in ready and r.replica not in status.dead_replicas
            ]

    @classmethod
    def describe(cls, status: JobStatus) -> str:
        """The state; while PENDING Slurm's reason, STARTING what the replicas wait for, READY their addresses;
        restarts, dead replicas and the failed rank (with its last log lines) below."""
        text = f"{status.label} {status.state}"
        state = status.state
        if state == JobState.PENDING and status.reason:
            text += f" ({pending_reason(status.reason)})"
        elif state == JobState.STARTING:
            now = time.time()
            waiting = "".join(f"; {record.describe(now)}" for record in status.starting)
            text += f" ({len(status.endpoints)}/{status.replicas} replicas ready{waiting})"
        elif state == JobState.CANCELLING:
            text += " (ranks stopping: in-flight requests drain, then the leaders release their followers)"
        elif state == JobState.STOPPING:
            text += " (the job is ending; Slurm is stopping its processes)"
        elif state == JobState.READY:
            text += " " + ", ".join(e.http_url for e in status.endpoints)
        if status.restarts:
            text += f" (restarts: {status.restarts})"
        text += "".join(f"\n{line}" for line in status.restart_lines())
        if status.dead_replicas and not status.failed_rank:
            alive = status.replicas - len(status.dead_replicas)
            text += f" ({alive}/{status.replicas} replicas serving)"
            for replica, record in sorted(status.dead_replicas.items()):
                text += f"\nreplica {replica} dead: " + describe_failure(record)
        if status.failed_rank:
            text += "\n" + describe_failure(status.failed_rank)
        elif status.reason and state in TERMINAL:
            text += f" ({status.reason})"
        return text

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
    live = (JobState.STARTING, JobState.READY)

    def __init__(self, ref: JobRef, target: Target | None = None) -> None:
        super().__init__(ref)
        self.target = target  # the deployment it serves, when the caller knows it already

    def observe(self, status: JobStatus) -> None:
        """READY once the deployment's address record names this job and answers there; STARTING until then."""
        if status.state != JobState.RUNNING:
            return
        from hpc.serving.deployment import target_of_folder
        from hpc.serving.gateway_record import answers, record_path

        target = self.target or target_of_folder(self.ref.deploy_dir)
        record = read_gateway(record_path(target))
        if record is not None and record.job_id == self.ref.job_id and answers(record, target):
            status.state, status.url = JobState.READY, record.url
        else:
            status.state = JobState.STARTING

    def explain(self, status: JobStatus) -> None:
        if status.state == JobState.FAILED:
            status.reason = self._log_reason() or status.reason

    @classmethod
    def describe(cls, status: JobStatus) -> str:
        """The state, its URL while READY, and why while PENDING or once FAILED."""
        text = f"{status.label} {status.state} (gateway)" + (f" {status.url}" if status.url else "")
        return text + (
            f" ({status.reason})" if status.reason and status.state in (JobState.PENDING, JobState.FAILED) else ""
        )

    @classmethod
    def _gateway_line(cls, status: JobStatus) -> str:
        """A gateway job is the deployment's gateway: no second line for it."""
        return ""

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
    live = (JobState.BUILDING,)

    def observe(self, status: JobStatus) -> None:
        """FAILED as soon as the script recorded a failed step (before Slurm has seen the job end); BUILDING while
        it runs."""
        if self.ref.paths.build_failure.exists():
            status.state = JobState.FAILED
        elif status.state == JobState.RUNNING:
            status.state = JobState.BUILDING

    def explain(self, status: JobStatus) -> None:
        """What `status` says beside the state: the step it is at (or that a stop interrupts), the engine it built,
        the step that failed with its command and its output's last lines, or Slurm's reason."""
        state, paths = status.state, self.ref.paths
        if state == JobState.FAILED and paths.build_failure.exists():
            status.reason = self.describe_failure()
        elif state in (JobState.BUILDING, JobState.CANCELLING, JobState.STOPPING):
            status.reason = self._current_step()
        elif state == JobState.COMPLETED:
            status.reason = self._built()
        elif state in TERMINAL:
            status.reason = (status.reason or "") + self._tail_text()

    @classmethod
    def describe(cls, status: JobStatus) -> str:
        """Slurm's reason while PENDING, else the step or the engine (`explain`)."""
        if status.state == JobState.PENDING:
            return f"{status.label} PENDING (build" + (f"; {status.reason})" if status.reason else ")")
        return f"{status.label} {status.state} (build)" + (f" {status.reason}" if status.reason else "")

    def describe_failure(self) -> str:
        """`step 1 (trtllm-build) failed with exit status 1: <command>` and the last lines of the steps' output."""
        failure = BuildStep.read(self.ref.paths.build_failure)
        if failure is None:  # there, but no record of a step (written by hand?): its output may say more
            return "a step failed" + self._tail_text()
        command = self._request().command(failure.step)
        text = f"{failure.describe()} failed with exit status {failure.exit_code}"
        return text + (f": {command}" if command else "") + self._tail_text()

    def _request(self) -> BuildRequest:
        return BuildRequest.read(Deployment(self.ref.deploy_dir).build_request) or BuildRequest()

    def _built(self) -> str | None:
        engine = self._request().engine_dir
        if not engine:
            return None
        record = read_record(Path(engine))
        took = record.took_s if record is not None else None
        return f"engine {engine}" + (f" (built in {took:.0f} s)" if took is not None else "")

    def _current_step(self) -> str | None:
        """`step 1 (trtllm-build): <its command>`: the step the job's script runs now, from its record (never from
        the log's text: launcher/contracts/build_records.py); None before the first."""
        step = BuildStep.read(self.ref.paths.build_step)
        if step is None:
            return None
        command = self._request().command(step.step)
        return step.describe() + (f": {command}" if command else "")

    def _tail_text(self) -> str:
        try:
            lines = self.ref.paths.build_log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        except OSError:
            lines = []
        return ("; last lines:\n" + "\n".join(f"  | {line}" for line in lines)) if lines else ""


class DoctorProbeJob(JobKind):
    """`hpc-serve doctor --probe`'s job (hpc/doctor/probe.py): a few checks on one node, then its end. Its folder is
    the probe's, outside any deployment (no marker, not in KINDS); its state is the scheduler's, read like every
    kind's through the process's throttled watcher, never polled on its own."""

    kind = "probe"
    script = PROBE_SUB_NAME  # in the probe folder (hpc/render/probe.py renders it)
    marker = None
    stoppable = False  # scancel ends it
    live = ()


#: every kind; the marked ones first: a folder without a marker is a serving job's
KINDS: tuple[type[JobKind], ...] = (GatewayJob, BuildJob, ServingJob)


def job_class_of(job_dir: Path) -> type[JobKind]:
    """The kind of the job whose folder this is, from its marker: the one place a folder's kind is told."""
    return next(kind for kind in KINDS if kind.marker is None or (job_dir / kind.marker).exists())


def job_of(ref: JobRef) -> JobKind:
    """The job as its kind reads it."""
    return job_class_of(ref.job_dir)(ref)
