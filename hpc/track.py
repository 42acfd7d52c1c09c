"""A job's state, from the scheduler and the job folder, in one state machine.

    PENDING (Slurm's reason) → STARTING → READY → COMPLETED | FAILED | CANCELLED | TIMEOUT
                                   ↘ CANCELLING (hpc-serve cancel) → CANCELLED
                                   ↘ STOPPING (Slurm's COMPLETING: ending, processes still there) → end state

Where each transition is observed:
- PENDING, and the end states: the job's executor (hpc/executors.py): Slurm through the process's shared,
  throttled watcher (hpc/slurm_watch.py: sacct, with squeue/scontrol when sacct has nothing yet or is not
  there); the local executor's local.json.
- STARTING → READY: every replica's leader has published `endpoints/replica-<k>.json`, which it does only once
  its `/v2/health/ready` answered 200 and one real request (a token through the ensemble) came back
  (launcher/ready.py). Until then its startup record (`endpoints/replica-<k>.starting`) says what it waits
  for: loading the models, or warming up; `status` shows it. A warm-up that fails is a rank failure (below).
- FAILED, and why: the rank exit records (`ranks/rank-<r>.json`); the earliest non-zero exit is the cause,
  the later ones are ranks that stopped with it (their record names the cause: `cause_rank`, launcher/watch.py)
  or that srun's --kill-on-bad-exit took down. A rank that failed makes the job FAILED at once, even while
  Slurm still says RUNNING (the step is being torn down). With `replica_policy: keep-serving` a failed rank
  ends only its replica: the job stays READY (or STARTING) on the others, listing the dead replicas, and is
  FAILED once every replica is dead.
- Restarts: a job Slurm requeued runs again under its id; the `.sub` writes `$SLURM_RESTART_COUNT`
  (`restart_count`) and puts the last run's records aside, so only this run's are read.
- CANCELLING: the user asked for the stop (the cancel marker) and ranks are still stopping (draining, releasing
  their followers). CANCELLED only once the scheduler says the job has ended *and* no longer lists it as
  COMPLETING, i.e. no rank process of it is left (Slurm reports a job's end state while its processes are
  still being killed; squeue shows those jobs as COMPLETING).

No state, and no failed rank, is ever read from log text: states come from the scheduler and the records; log
tails are only shown. A job the scheduler calls FAILED whose ranks left no record (Slurm killed the step before
any launcher could write one) names the ranks without a record (`failure_without_record`).

A job of another Slurm cluster than SLURM_CONF's (clusters may share $HOME, and so the job index) is asked about
on its own cluster (`sacct`/`squeue -M`, hpc/executors.py); when that cluster cannot be asked it is UNKNOWN,
`unreachable`, and the reason says which cluster it belongs to and which this is: never the state of the job of
the same id here. `wait` returns at once on it (there is nothing to wait for from here).

A deployment's gateway job (a spec's `gateway:` section) has no ranks: it reads STARTING while it runs and
READY once its address record names it and answers (hpc/gateway/job.py `gateway_job_state`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from hpc.executors import executor_of
from hpc.jobs import JobRef
from hpc.slurm import TERMINAL, state_class
from launcher.job_index import entry_name
from launcher.records import (
    EndpointRecord,
    RankExitRecord,
    StartupRecord,
    read_endpoints,
    read_rank_records,
    read_startups,
)

if TYPE_CHECKING:
    from hpc.gateway.record import GatewayLine  # imported when a gateway is asked for: `status` stays light

ACTIVE = ("PENDING", "STARTING", "READY", "CANCELLING", "STOPPING")
UNKNOWN_GIVE_UP_S = 120.0
#: `wait`'s back-off: 1 s after a change, growing with the time since (an eighth of it) up to 5 s. Only the
#: job folder is read that often; the scheduler is asked at the watcher's own pace (hpc/slurm_watch.py).
MIN_POLL_S, MAX_POLL_S = 1.0, 5.0


@dataclass
class JobStatus:
    """What `hpc-serve status` shows and `--json` prints."""

    job_id: str
    state: str
    reason: str | None = None
    scheduler_state: str | None = None
    job_dir: str | None = None
    endpoints: list[EndpointRecord] = field(default_factory=list)
    replicas: int = 1
    failed_rank: RankExitRecord | None = None
    #: keep-serving: the replicas that died while the others serve (replica → the rank record that ended it)
    dead_replicas: dict[int, RankExitRecord] = field(default_factory=dict)
    #: how many times Slurm requeued and restarted the job ($SLURM_RESTART_COUNT of the run going on)
    restarts: int = 0
    #: "serving", or "gateway" for the deployment's gateway job (its state: READY once its record answers)
    kind: str = "serving"
    #: STARTING: what the replicas not ready yet wait for (their leaders' startup records: loading, warming up)
    starting: list[StartupRecord] = field(default_factory=list)
    #: a gateway job's URL while READY
    url: str | None = None
    #: the deployment's gateway, when asked for (`job_status(ref, with_gateway=True)`, `hpc.submit.cancel`)
    gateway: GatewayLine | None = None
    #: the Slurm cluster the job belongs to (its folder's record; None: a local job, or no record: the current one)
    cluster: str | None = None
    #: the job is of another cluster than this process talks to (asked with `-M`)
    other_cluster: bool = False
    #: ... which could not tell its state (not reachable from here, or it does not know the job): UNKNOWN, and
    #: `reason` says whose the job is and why
    unreachable: bool = False

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    def summary(self) -> str:
        text = self._summary()
        return text + (f"\n{self.gateway.summary()}" if self.gateway is not None and self.kind != "gateway" else "")

    def _summary(self) -> str:
        if self.unreachable:
            return f"{self.label} {self.state} ({self.reason})"
        if self.kind == "build":  # hpc/engine_build/run.py build_status: Slurm's reason, the step, the engine
            if self.state == "PENDING":
                return f"{self.label} PENDING (build" + (f"; {self.reason})" if self.reason else ")")
            return f"{self.label} {self.state} (build)" + (f" {self.reason}" if self.reason else "")
        if self.kind == "gateway":
            text = f"{self.label} {self.state} (gateway)" + (f" {self.url}" if self.url else "")
            return text + (f" ({self.reason})" if self.reason and self.state in ("PENDING", "FAILED") else "")
        text = f"{self.label} {self.state}"
        if self.state == "PENDING" and self.reason:
            text += f" ({self.reason})"
        elif self.state == "STARTING":
            now = time.time()
            waiting = "".join(f"; {record.describe(now)}" for record in self.starting)
            text += f" ({len(self.endpoints)}/{self.replicas} replicas ready{waiting})"
        elif self.state == "CANCELLING":
            text += " (ranks stopping: in-flight requests drain, then the leaders release their followers)"
        elif self.state == "STOPPING":
            text += " (the job is ending; Slurm is stopping its processes)"
        elif self.state == "READY":
            text += " " + ", ".join(e.http_url for e in self.endpoints)
        if self.restarts:
            text += f" (restarts: {self.restarts})"
        if self.dead_replicas and not self.failed_rank:
            alive = self.replicas - len(self.dead_replicas)
            text += f" ({alive}/{self.replicas} replicas serving)"
            for replica, record in sorted(self.dead_replicas.items()):
                text += f"\nreplica {replica} dead: " + describe_failure(record)
        if self.failed_rank:
            text += "\n" + describe_failure(self.failed_rank)
        elif self.reason and self.state in TERMINAL:
            text += f" ({self.reason})"
        return text

    @property
    def label(self) -> str:
        """The job id, with its cluster (`33@twin`) when that is not the one this process talks to."""
        return entry_name(self.job_id, self.cluster if self.other_cluster else None)

    def to_json(self) -> dict[str, Any]:
        """The records as they are on disk (launcher/records.py to_dict)."""
        data = asdict(self)
        data["endpoints"] = [e.to_dict() for e in self.endpoints]
        data["failed_rank"] = self.failed_rank.to_dict() if self.failed_rank else None
        data["starting"] = [r.to_dict() for r in self.starting]
        data["dead_replicas"] = {str(k): r.to_dict() for k, r in sorted(self.dead_replicas.items())}
        data["gateway"] = self.gateway.to_json() if self.gateway else None
        return data


def describe_failure(record: RankExitRecord) -> str:
    """`rank 1 on node2 exited with SIGKILL` plus its last log lines: the first thing a user needs."""
    if record.signal:
        how = f"signal {record.signal}"
    elif record.exit_code is not None:
        how = f"exit code {record.exit_code}"
    else:
        how = "an unknown status"
    where = f" on {record.host}" if record.host and record.host != "?" else ""
    lines = [
        f"rank {record.rank}{where} exited with {how}" + (f": {record.error}" if record.error else "") + "; last lines:"
    ]
    lines += [f"  | {line}" for line in record.log_tail]
    return "\n".join(lines)


def failure_without_record(ref: JobRef, ranks: list[RankExitRecord], world: int) -> RankExitRecord | None:
    """The scheduler says FAILED and no rank recorded a failure: Slurm ended the step before a launcher could
    write its record (a launcher SIGKILLed with its tritonserver: the OOM killer, PMIx aborting the step). The
    fact left is which ranks of the job (``world`` of them) wrote no record; the first of them is named, with
    the last lines of its log as text to read (nothing is parsed from them). Once slurmstepd's PMIx error
    named the dead rank and was parsed here; a record's absence says it without depending on its wording."""
    recorded = {r.rank for r in ranks}
    # a rank with no log never started (the batch script failed before srun): nothing to name
    missing = [r for r in range(max(world, 1)) if r not in recorded and ref.paths.rank_log(r, "err").exists()]
    if not missing:
        return None
    first = missing[0]
    tail: list[str] = []
    try:
        lines = ref.paths.rank_log(first, "err").read_text(errors="replace").splitlines()
        tail = [line for line in lines if line.strip() and not line.startswith(("|", "+-"))][-12:]
    except OSError:
        pass
    others = (
        f" (nor did rank{'s' if len(missing) > 2 else ''} {', '.join(map(str, missing[1:]))})" if missing[1:] else ""
    )
    steps = failed_steps(ref)
    return RankExitRecord(
        rank=first,
        log_tail=tail,
        error=f"no exit record: the job failed before this rank's launcher could write one{others}"
        + (f"; Slurm: {steps}" if steps else ""),
    )


def failed_steps(ref: JobRef) -> str:
    """Slurm's own account of a job's steps that did not complete (`step 676.0 FAILED (exit 0:9) on node[1-2]`),
    one sacct call; "" for a local job, or when accounting cannot say. Asked only for a FAILED job whose ranks
    left no record, so it costs nothing on the way to READY."""
    from hpc.executors import SlurmExecutor
    from hpc.slurm import SlurmError, default, on_cluster

    executor = executor_of(ref)
    if not isinstance(executor, SlurmExecutor):
        return ""
    argv = ["sacct", *on_cluster(executor.other_cluster(ref)), "-n", "-P", "-j", ref.job_id]
    try:
        out = default.run([*argv, "-o", "JobID,State,ExitCode,NodeList"]).stdout
    except SlurmError:
        return ""
    found = []
    for line in out.splitlines():
        step_id, state, code, nodes = (line.strip().split("|") + ["", "", "", ""])[:4]
        step = step_id.partition(".")[2]
        if step and step not in ("batch", "extern") and state and not state.startswith("COMPLETED"):
            found.append(f"step {step_id} {state.split()[0]} (exit {code}) on {nodes}")
    return "; ".join(found)


def first_failure(ranks: list[RankExitRecord]) -> RankExitRecord | None:
    """The earliest non-zero exit of a rank that failed by itself: the cause; the others are ranks that stopped
    with it (`cause_rank`) or that srun's --kill-on-bad-exit took down."""
    failed = [r for r in ranks if r.failed]
    causes = [r for r in failed if r.cause_rank is None] or failed
    return min(causes, key=lambda r: r.ended_at) if causes else None


def dead_replicas(ranks: list[RankExitRecord], ranks_per_replica: int) -> dict[int, RankExitRecord]:
    """Replica → the failure that ended it, for every replica with a failed rank."""
    by_replica: dict[int, list[RankExitRecord]] = {}
    for record in ranks:
        by_replica.setdefault(record.rank // max(1, ranks_per_replica), []).append(record)
    found = {replica: first_failure(records) for replica, records in by_replica.items()}
    return {replica: record for replica, record in found.items() if record is not None}


def _restarts(ref: JobRef) -> int:
    try:
        return int(ref.paths.restart_count.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def job_status(ref: JobRef, with_gateway: bool = False) -> JobStatus:
    """The job's state now; `with_gateway`: and the deployment's gateway (one more record read and probe)."""
    status = _status(ref)
    other = executor_of(ref).other_cluster(ref)
    status.cluster, status.other_cluster = ref.cluster, other is not None
    status.unreachable = other is not None and status.scheduler_state == "UNKNOWN"
    if status.unreachable:
        return status  # nothing of it is known here: no gateway line either
    if with_gateway:
        from hpc.gateway.job import deployment_gateway
        from hpc.routing.deployment import target_of_folder
        from hpc.spec import SpecError

        try:
            status.gateway = deployment_gateway(target_of_folder(ref.deploy_dir))
        except (SpecError, OSError):
            pass  # a folder without a readable spec.yaml (rendered by hand): the job's own status stands
    return status


def _status(ref: JobRef) -> JobStatus:
    if ref.is_gateway:
        from hpc.gateway.job import gateway_job_state

        state, reason, url, raw = gateway_job_state(ref)
        return JobStatus(ref.job_id, state, reason, raw, str(ref.job_dir), kind="gateway", url=url)
    # an engine build job (hpc/engine_build/run.py): its steps' state, what it built or where it failed
    if ref.is_build:
        from hpc.engine_build.run import build_status

        state, reason, raw = build_status(ref)
        return JobStatus(ref.job_id, state, reason, raw, str(ref.job_dir), kind="build")
    return _serving_status(ref)


def _serving_status(ref: JobRef) -> JobStatus:
    raw, reason = executor_of(ref).scheduler_state(ref)
    state = state_class(raw)
    try:
        plan = ref.launch_plan()
        replicas, per_replica = int(plan["replicas"]), int(plan["world_size_per_replica"])
        keep_serving = plan.get("replica_policy") == "keep-serving"
    except (OSError, ValueError, KeyError):
        replicas, per_replica, keep_serving = 1, 1, False
    running = state == "RUNNING"
    endpoints = read_endpoints(ref.paths) if running else []
    starting = read_startups(ref.paths) if running else []
    ranks = read_rank_records(ref.paths)
    failure = first_failure(ranks)
    dead = dead_replicas(ranks, per_replica) if keep_serving else {}
    if keep_serving and running and len(dead) < replicas:
        failure = None  # the others serve on (`dead_replicas` says which died, and why)
        endpoints = [e for e in endpoints if e.replica not in dead]
    if running:
        if failure is not None:
            state = "FAILED"
        else:
            state = "READY" if len(endpoints) >= replicas - len(dead) else "STARTING"
    elif state in ("COMPLETED", "CANCELLED", "TIMEOUT"):
        failure = failure if state == "COMPLETED" else None
        if failure is not None:
            state = "FAILED"
    cancelled = ref.cancel_marker.exists()  # the user stopped it (hpc.submit.cancel); ranks exiting is expected
    if cancelled and running:
        state, failure, endpoints = "CANCELLING", None, []
    elif raw == "COMPLETING" and state in ("STARTING", "READY"):
        state, endpoints = "STOPPING", []  # the job is ending (time limit, scancel): no endpoint to offer
    elif cancelled and state in ("COMPLETED", "FAILED"):
        state, failure = "CANCELLED", None
    if state == "FAILED" and failure is None:
        failure = failure_without_record(ref, ranks, replicas * per_replica)
    ready = {e.replica for e in endpoints}
    starting = [r for r in starting if r.replica not in ready and r.replica not in dead]
    return JobStatus(
        job_id=ref.job_id,
        state=state,
        reason=reason,
        scheduler_state=raw,
        job_dir=str(ref.job_dir),
        endpoints=endpoints,
        replicas=replicas,
        failed_rank=failure if state == "FAILED" else None,
        dead_replicas=dead if state in ACTIVE else {},
        starting=starting if state == "STARTING" else [],
        restarts=_restarts(ref),
    )


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
