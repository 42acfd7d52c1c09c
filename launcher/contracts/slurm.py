"""The one way hpc-serve runs a Slurm command (sbatch, scancel, squeue, sacct, scontrol) and reads its job states.

Standard library only: both sides build on it. The renewer (launcher/jobscript/renew.py) runs inside a job, from the copy
render put in ``D/python``, where hpc-serve may not be installed; the login side (`hpc.scheduler.slurm`) adds what only it
needs (the cluster's name, cached) and the watcher (`hpc.scheduler.watch`) over it.

Why one module: so that no call site handles timeouts and return codes its own way (docs/decisions.md "One
way to run a Slurm command"). Here every call has a timeout; a failure raises `SlurmError` carrying the command,
its exit code and its stderr; and transient controller trouble (a busy slurmctld answers "Socket timed out",
"Unable to contact slurm controller", `slurm_load_jobs error`) is retried with a back-off, only where repeating
the command is safe: a timed-out `sbatch` may have queued the job, so sbatch is retried only when the
controller was never reached. A job Slurm no longer knows (`GONE`) is an answer, not a failure.

`Slurm.calls` counts the commands run, per command name: the watcher's politeness is measured with it.
Also here: what Slurm's job states mean to hpc-serve (`STATE_CLASS`, `TERMINAL`, `ended`): every reader of a
state asks these, so a state is final in one place only. A job of another cluster (clusters may share $HOME,
and so the job index) is asked about and cancelled with `-M <its cluster>` (`cluster=`), through slurmdbd,
never under its bare id, which names another job here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from launcher.contracts.job_states import TERMINAL, JobState

DEFAULT_TIMEOUT_S = 30.0
ATTEMPTS = 3
BACKOFF_S = 1.0

#: Slurm's raw job states, as the state hpc-serve reads them as (RUNNING is refined by the job folder): every
#: state name of Slurm's that hpc-serve knows. A word not here (UNKNOWN: nothing could tell) is shown as it is.
STATE_CLASS: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "SUSPENDED": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
}
#: Slurm's own words for those (NODE_FAIL, PREEMPTED, REVOKED, DEADLINE …)
TERMINAL_RAW = frozenset(raw for raw, state in STATE_CLASS.items() if state in TERMINAL)

#: stderr of a failure worth repeating: the controller (or slurmdbd) was busy or away for a moment.
TRANSIENT = re.compile(
    r"Socket timed out|Unable to contact slurm controller|slurm_load_jobs error: (?!Invalid job id)"
    r"|Zero Bytes were transmitted|Connection refused|Resource temporarily unavailable"
    r"|temporarily unable"
)
#: stderr proving the request never reached the controller: the only failures after which sbatch is repeated.
UNREACHED = re.compile(r"Unable to contact slurm controller|Connection refused")
#: the job is not (or no longer) known to the controller: an answer, not a failure.
GONE = re.compile(r"Invalid job id specified|already completing or completed")


#: what a PENDING job's reason (squeue %r, Slurm's words) means for a spec, and whether the job can still start
#: as it is; `status` prints it after the reason (hpc/jobs/kinds.py). Reasons not listed (Priority, Resources,
#: Dependency: the usual wait) are shown as Slurm says them
PENDING_REASONS: dict[str, tuple[str, bool]] = {
    "ReqNodeNotAvail": ("a node it needs is down, drained or reserved", True),
    "JobHeldUser": ("held: `scontrol release <id>` lets it start", True),
    "JobHeldAdmin": ("held by an admin", True),
    "PartitionDown": ("its partition is down: slurm.partition names another, or ask your admins", True),
    "PartitionTimeLimit": (
        "slurm.time is past the partition's MaxTime: it never starts; cancel it, lower slurm.time",
        False,
    ),
    "PartitionNodeLimit": ("slurm.nodes is past the partition's node limit: it never starts; cancel it", False),
    "QOSMaxWallDurationPerJobLimit": ("slurm.time is past the QOS's limit: it never starts; cancel it", False),
    "AssocMaxWallDurationPerJobLimit": ("slurm.time is past the account's limit: it never starts; cancel it", False),
    "InvalidAccount": ("slurm.account is not one of yours: it never starts; cancel it", False),
    "InvalidQOS": ("slurm.qos is not allowed: it never starts; cancel it", False),
    "BadConstraints": ("no node has what it asks (gres, memory, constraint): it never starts; cancel it", False),
}


def pending_reason(reason: str) -> str:
    """Slurm's reason with what it means (`PartitionTimeLimit: slurm.time is past …`), or as Slurm says it."""
    meaning = PENDING_REASONS.get(reason.strip())
    return f"{reason}: {meaning[0]}" if meaning else reason


def state_class(raw: str) -> str:
    """The state hpc-serve reads a raw Slurm state as (sacct's `CANCELLED by 0` is CANCELLED); a word Slurm does
    not define (UNKNOWN) as it is."""
    words = raw.split()
    return STATE_CLASS.get(words[0], raw) if words else raw


def ended(raw_state: str) -> bool:
    """Whether a raw Slurm state is one a job does not leave (COMPLETED, CANCELLED by 0, NODE_FAIL, REVOKED …)."""
    words = raw_state.split()
    return bool(words) and words[0] in TERMINAL_RAW


def on_cluster(cluster: str | None) -> list[str]:
    """`-M <cluster>` for a command about a job of another cluster (None: the one SLURM_CONF names)."""
    return ["-M", cluster] if cluster else []


def parse_sbatch(stdout: str) -> str:
    """The job id `sbatch --parsable` printed (`33`, or `33;cluster` on a multi-cluster site); "" for none."""
    return stdout.strip().split(";")[0].strip()


def parse_slurm_time(text: str) -> float | None:
    """Epoch seconds of a time as squeue prints it (`2026-11-23T02:28:59`, the cluster's local time); None for
    what is no time (`N/A`, `Unknown`, `NONE`: not started, or no limit)."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Result:
    """What a command left: exit code, stdout, stderr."""

    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs argv with a timeout (seconds), in `env` and `cwd` when given; raises FileNotFoundError when the
    command is missing, subprocess.TimeoutExpired when it ran too long. Tests pass a fake one."""

    def __call__(
        self, argv: Sequence[str], timeout: float, *, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> Result: ...


def run_subprocess(
    argv: Sequence[str], timeout: float, *, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> Result:
    """The real runner. `shutil.which` first, so a command missing from PATH is told apart from a failing one."""
    if shutil.which(argv[0], path=None if env is None else env.get("PATH")) is None:
        raise FileNotFoundError(argv[0])
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


class SlurmError(RuntimeError):
    """A Slurm command failed; the message names the command and quotes its stderr."""

    def __init__(self, argv: Sequence[str], why: str, *, returncode: int | None = None, stderr: str = ""):
        self.argv, self.returncode, self.stderr = tuple(argv), returncode, stderr.strip()
        super().__init__(f"`{' '.join(self.argv)}` {why}" + (f": {self.stderr}" if self.stderr else ""))


class SlurmNotInstalled(SlurmError):
    """The command is not on PATH (no Slurm here, or not this one of its commands)."""


class SlurmTimeout(SlurmError):
    """The command did not answer within its timeout."""


class Slurm:
    """Runs Slurm commands: timeouts, errors with the command and stderr, retries of transient failures."""

    def __init__(
        self,
        runner: Runner = run_subprocess,
        *,
        sleep: Callable[[float], None] = time.sleep,
        attempts: int = ATTEMPTS,
        backoff_s: float = BACKOFF_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        self.runner, self.sleep = runner, sleep
        self.attempts, self.backoff_s, self.timeout_s = attempts, backoff_s, timeout_s
        self.calls: Counter[str] = Counter()

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        repeatable: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Result:
        """Run until it succeeds, fails for good, or `attempts` transient failures in a row (1 s, 2 s apart).
        `repeatable=False` (sbatch): retry only failures that never reached the controller, and never a
        timeout."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        for attempt in range(1, self.attempts + 1):
            self.calls[argv[0]] += 1
            try:
                result = self.runner(argv, timeout, env=env, cwd=cwd)
            except FileNotFoundError:
                raise SlurmNotInstalled(argv, "failed: not found on PATH") from None
            except subprocess.TimeoutExpired as exc:
                stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
                error: SlurmError = SlurmTimeout(argv, f"did not answer within {timeout:g} s", stderr=stderr)
                retry = repeatable
            else:
                if result.returncode == 0:
                    return result
                error = SlurmError(
                    argv, f"exited with {result.returncode}", returncode=result.returncode, stderr=result.stderr
                )
                retry = bool((TRANSIENT if repeatable else UNREACHED).search(result.stderr))
            if not retry or attempt == self.attempts:
                raise error
            self.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    def _answer(self, argv: Sequence[str]) -> str | None:
        """stdout of a query about jobs; None when Slurm no longer knows them (`GONE`: the job has ended)."""
        try:
            return self.run(argv).stdout
        except SlurmError as exc:
            if GONE.search(exc.stderr):
                return None
            raise

    # -----------------------------------------------------------------------------------------------------
    # the commands hpc-serve uses, parsed

    def sbatch(
        self,
        script: Path,
        options: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
    ) -> str:
        """Submit a script as it is (`options`: sbatch's own, before it, e.g. a --dependency; `env`: what it
        runs with, which sbatch's --export=ALL hands the job); its job id."""
        argv = ["sbatch", "--parsable", *options, str(script)]
        result = self.run(argv, repeatable=False, env=env, cwd=cwd, timeout_s=timeout_s)
        job_id = parse_sbatch(result.stdout)
        if not job_id:
            raise SlurmError(argv, "printed no job id", returncode=0, stderr=result.stderr)
        return job_id

    def scancel(self, job_id: str, signal: str | None = None, cluster: str | None = None) -> bool:
        """Signal (`signal="TERM"`) or cancel a job (of `cluster`, when another's). False when Slurm no longer
        knows it (it has ended)."""
        argv = ["scancel", *on_cluster(cluster), *([f"--signal={signal}"] if signal else []), job_id]
        return self._answer(argv) is not None

    def squeue(self, job_ids: Sequence[str], cluster: str | None = None) -> dict[str, tuple[str, str | None]]:
        """{job id: (state, reason)} of those the controller (of `cluster`) still lists; one call for all."""
        if not job_ids:
            return {}
        out = self._answer(["squeue", *on_cluster(cluster), "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r"])
        found: dict[str, tuple[str, str | None]] = {}
        for line in (out or "").splitlines():  # None: every id unknown, squeue's way of saying "none of them"
            parts = line.strip().split("|", 2)
            if len(parts) == 3:
                found[parts[0]] = (parts[1], None if parts[2] in ("None", "(null)", "") else parts[2])
        return found

    def job_times(self, job_id: str) -> tuple[float | None, float | None]:
        """(start, end) of a job the controller still lists, as it says now (an admin may move the end); None for
        what it cannot tell (not started, no limit, or the job is gone)."""
        out = self._answer(["squeue", "-h", "-j", job_id, "-o", "%S|%e"]) or ""
        parts = out.strip().splitlines()[0].split("|") if out.strip() else []
        if len(parts) != 2:
            return None, None
        return parse_slurm_time(parts[0]), parse_slurm_time(parts[1])

    def sacct(self, job_ids: Sequence[str], fields: Sequence[str], cluster: str | None = None) -> list[dict[str, str]]:
        """One row per job allocation (no steps), `fields` as sacct names them; one call for all the ids."""
        if not job_ids:
            return []
        argv = ["sacct", *on_cluster(cluster), "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", ",".join(fields)]
        out = self.run(argv).stdout
        # the last field keeps any "|" of its own (a SubmitLine may have one)
        return [
            dict(zip(fields, line.split("|", len(fields) - 1), strict=False))
            for line in out.splitlines()
            if line.strip()
        ]

    def sacct_states(self, job_ids: Sequence[str], cluster: str | None = None) -> dict[str, str]:
        """{job id: raw state word} of the jobs accounting knows (`CANCELLED by 0` → `CANCELLED`)."""
        rows = self.sacct(job_ids, ["JobID", "State"], cluster)
        return {row["JobID"]: (row["State"].split() or ["UNKNOWN"])[0] for row in rows if row.get("JobID")}

    def scontrol_jobs(self, job_ids: Sequence[str], cluster: str | None = None) -> dict[str, dict[str, str]]:
        """{job id: scontrol's Key=Value fields} of those the controller knows: per id for one job, one listing
        of every job for several."""
        argv = ["scontrol", *on_cluster(cluster), "-o", "show", "job", *(job_ids if len(job_ids) == 1 else [])]
        jobs: dict[str, dict[str, str]] = {}
        for line in (self._answer(argv) or "").splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            if fields.get("JobId") in job_ids:
                jobs[fields["JobId"]] = fields
        return jobs
