"""What `hpc-serve status` says of a job (`JobStatus`), and why a serving job failed: the rank records that name
the cause, or, when Slurm ended the job before any rank could write one, the ranks without a record.

The state itself is read, and summed up, by the job's kind (hpc/jobs/kinds.py); `hpc.jobs.track.job_status` adds
its cluster and its deployment's gateway. Nothing here is parsed from log text: a log's last lines are only shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from hpc.jobs.executors import SlurmExecutor, executor_of
from hpc.scheduler import slurm
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import TERMINAL, SlurmError, on_cluster
from launcher.contracts.job_index import entry_name
from launcher.contracts.job_states import JobState
from launcher.contracts.records import RESTARTING, EndpointRecord, RankExitRecord, ReplicaRestart, StartupRecord

if TYPE_CHECKING:
    from hpc.serving.gateway_record import GatewayLine  # imported when a gateway is asked for: `status` stays light


#: each job kind's account of a status of its kind (hpc/jobs/kinds.py `JobKind.summary`), by `JobStatus.kind`. A kind
#: enters its own as it is defined: a status is made by its kind, so what it says is its kind's, and no list of
#: kinds is kept here.
SUMMARIES: dict[str, Callable[[JobStatus], str]] = {}


@dataclass
class JobStatus:
    """What `hpc-serve status` shows and `--json` prints."""

    job_id: str
    #: a `JobState` (launcher/contracts/job_states.py; a Slurm word it does not know is kept as it is)
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
    #: replica_policy restart: each restarted replica's latest ReplicaRestart, and the failure that ended its last
    #: run (or the one that ended it now, while the `.sub` has not taken it up yet)
    replica_restarts: dict[int, ReplicaRestart] = field(default_factory=dict)
    restart_causes: dict[int, RankExitRecord] = field(default_factory=dict)
    #: ... the replicas down now that are (or will be) started again
    restarting: list[int] = field(default_factory=list)
    #: the job's kind (hpc/jobs/kinds.py `JobKind.kind`): "serving", "gateway" (READY once its record answers) or
    #: "build" (its steps)
    kind: str = "serving"
    #: STARTING: what the replicas not ready yet wait for (their leaders' startup records: loading, warming up)
    starting: list[StartupRecord] = field(default_factory=list)
    #: a gateway job's URL while READY
    url: str | None = None
    #: the deployment's gateway, when asked for (`job_status(ref, with_gateway=True)`, `hpc.jobs.track.cancel`)
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
        """What `hpc-serve status` prints: the job's kind's account of it (hpc/jobs/kinds.py `JobKind.summary`)."""
        return SUMMARIES[self.kind](self)

    def restart_lines(self) -> list[str]:
        """`replica 1 READY (restarts: 1 of 3; last: rank 2 on node2 exited with signal SIGKILL at 12:03:04)`: one
        line for each replica that replica_policy restart restarted or is restarting."""
        ready, now, lines = {e.replica for e in self.endpoints}, time.time(), []
        for replica in sorted(set(self.replica_restarts) | set(self.restarting)):
            record = self.replica_restarts.get(replica)
            if replica in ready:
                state = JobState.READY.value
            elif record is not None and record.outcome != RESTARTING:
                state = f"not restarted ({record.outcome})"
            elif record is not None and replica in self.restarting and record.restart_at > now:
                state = f"restarting in {record.restart_at - now:.0f} s"
            else:
                state = "restarting"
            count = f"restarts: {record.restarts} of {record.max_restarts}" if record is not None else "restarts: 0"
            cause = self.restart_causes.get(replica)
            last = f"; last: {short_failure(cause)}" if cause is not None else ""
            lines.append(f"replica {replica} {state} ({count}{last})")
        return lines

    @property
    def label(self) -> str:
        """The job id, with its cluster (`33@twin`) when that is not the one this process talks to."""
        return entry_name(self.job_id, self.cluster if self.other_cluster else None)

    def to_json(self) -> dict[str, Any]:
        """The records as they are on disk (launcher/contracts/records.py to_dict)."""
        data = asdict(self)
        data["endpoints"] = [e.to_dict() for e in self.endpoints]
        data["failed_rank"] = self.failed_rank.to_dict() if self.failed_rank else None
        data["starting"] = [r.to_dict() for r in self.starting]
        data["dead_replicas"] = {str(k): r.to_dict() for k, r in sorted(self.dead_replicas.items())}
        data["replica_restarts"] = {str(k): r.to_dict() for k, r in sorted(self.replica_restarts.items())}
        data["restart_causes"] = {str(k): r.to_dict() for k, r in sorted(self.restart_causes.items())}
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


def short_failure(record: RankExitRecord) -> str:
    """`rank 2 on node2 exited with signal SIGKILL (the python backend stub ... killed by SIGABRT) at 12:03:04`."""
    how = f"signal {record.signal}" if record.signal else f"exit code {record.exit_code}"
    where = f" on {record.host}" if record.host and record.host != "?" else ""
    why = f" ({record.error.split(';')[0]})" if record.error else ""
    at = f" at {time.strftime('%H:%M:%S', time.localtime(record.ended_at))}" if record.ended_at else ""
    return f"rank {record.rank}{where} exited with {how}{why}{at}"


def failure_without_record(ref: JobRef, ranks: list[RankExitRecord], world: int) -> RankExitRecord | None:
    """The scheduler says FAILED and no rank recorded a failure: Slurm ended the step before a launcher could
    write its record (a launcher SIGKILLed with its tritonserver: the OOM killer, PMIx aborting the step). The
    fact left is which ranks of the job (``world`` of them) wrote no record; the first of them is named, with
    the last lines of its log as text to read (nothing is parsed from them: a record's absence says which rank
    died without depending on slurmstepd's wording, docs/decisions.md "No state from log text")."""
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
    executor = executor_of(ref)
    if not isinstance(executor, SlurmExecutor):
        return ""
    argv = ["sacct", *on_cluster(executor.other_cluster(ref)), "-n", "-P", "-j", ref.job_id]
    try:
        out = slurm.default.run([*argv, "-o", "JobID,State,ExitCode,NodeList"]).stdout
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
