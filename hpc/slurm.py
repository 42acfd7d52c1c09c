"""The one way hpc-serve runs a Slurm command: sbatch, scancel, squeue, sacct, scontrol.

Why one module: each call site used to handle timeouts and return codes its own way (one had no timeout, one
dropped scancel's errors, one turned every failure into an empty answer). Here every call has a timeout; a
failure raises `SlurmError` carrying the command, its exit code and its stderr; and transient controller
trouble (a busy slurmctld answers "Socket timed out", "Unable to contact slurm controller", `slurm_load_jobs
error`) is retried with a back-off, only where repeating the command is safe: a timed-out `sbatch` may have
queued the job, so sbatch is retried only when the controller was never reached.

`Slurm.calls` counts the commands run, per command name: the watcher's politeness is measured with it.
Also here: what Slurm's job states mean to hpc-serve (`STATE_CLASS`, `ended`), and which cluster the commands
talk to (`cluster_name`: SLURM_CONF's ClusterName). A job of another cluster (clusters may share $HOME, and so
the job index) is asked about and cancelled with `-M <its cluster>` (`cluster=`), through slurmdbd, never under
its bare id, which names another job here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 30.0
ATTEMPTS = 3
BACKOFF_S = 1.0
#: the longest an answer of Slurm's is reused: the watcher's slowest refresh (hpc/slurm_watch.py), and how long a
#: failed ClusterName lookup stands before `cluster_name` asks again
MAX_DELAY_S = 30.0

#: Slurm's raw job states, as the state hpc-serve reads them as (RUNNING is refined by the job folder).
STATE_CLASS = {
    "PENDING": "PENDING",
    "CONFIGURING": "PENDING",
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "SUSPENDED": "PENDING",
    "RUNNING": "RUNNING",
    "COMPLETING": "RUNNING",
    "STAGE_OUT": "RUNNING",
    "SIGNALING": "RUNNING",
    "RESIZING": "RUNNING",
    "COMPLETED": "COMPLETED",
    "FAILED": "FAILED",
    "NODE_FAIL": "FAILED",
    "OUT_OF_MEMORY": "FAILED",
    "BOOT_FAIL": "FAILED",
    "CANCELLED": "CANCELLED",
    "PREEMPTED": "CANCELLED",
    "REVOKED": "CANCELLED",
    "TIMEOUT": "TIMEOUT",
    "DEADLINE": "TIMEOUT",
}
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

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


def ended(raw_state: str) -> bool:
    """Whether a raw Slurm state is one a job does not leave (COMPLETED, CANCELLED by 0, NODE_FAIL …)."""
    return STATE_CLASS.get(raw_state.split()[0] if raw_state else "") in ENDED


def on_cluster(cluster: str | None) -> list[str]:
    """`-M <cluster>` for a command about a job of another cluster (None: the one SLURM_CONF names)."""
    return ["-M", cluster] if cluster else []


@dataclass(frozen=True)
class Result:
    """What a command left: exit code, stdout, stderr."""

    returncode: int
    stdout: str
    stderr: str


#: runs argv with a timeout (seconds); raises FileNotFoundError when the command is missing,
#: subprocess.TimeoutExpired when it ran too long. Tests pass a fake one.
Runner = Callable[[Sequence[str], float], Result]


def run_subprocess(argv: Sequence[str], timeout: float) -> Result:
    """The real runner. `shutil.which` first, so a command missing from PATH is told apart from a failing one."""
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError(argv[0])
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
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
        clock: Callable[[], float] = time.monotonic,
        attempts: int = ATTEMPTS,
        backoff_s: float = BACKOFF_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        self.runner, self.sleep, self.clock = runner, sleep, clock
        self.attempts, self.backoff_s, self.timeout_s = attempts, backoff_s, timeout_s
        self.calls: Counter[str] = Counter()
        # by SLURM_CONF (the file names the cluster): (ClusterName or None, until when: None for good)
        self._cluster_names: dict[str | None, tuple[str | None, float | None]] = {}

    def run(self, argv: Sequence[str], *, timeout_s: float | None = None, repeatable: bool = True) -> Result:
        """Run until it succeeds, fails for good, or `attempts` transient failures in a row (1 s, 2 s apart).
        `repeatable=False` (sbatch): retry only failures that never reached the controller, and never a
        timeout."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        for attempt in range(1, self.attempts + 1):
            self.calls[argv[0]] += 1
            try:
                result = self.runner(argv, timeout)
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

    # -----------------------------------------------------------------------------------------------------
    # the commands hpc-serve uses, parsed

    def cluster_name(self) -> str | None:
        """The cluster the commands talk to: `scontrol show config`'s ClusterName, asked once per SLURM_CONF
        (another file may name another cluster). None when Slurm cannot say: no ClusterName, or the question
        failed; a failure stands for MAX_DELAY_S, so that `list` over many jobs asks once (with its retries), not
        once per job, and a long-lived process asks again later."""
        conf = os.environ.get("SLURM_CONF")
        known = self._cluster_names.get(conf)
        if known is not None and (known[1] is None or self.clock() < known[1]):
            return known[0]
        until: float | None = None
        try:
            out = self.run(["scontrol", "show", "config"]).stdout
        except SlurmNotInstalled:
            out = ""
        except SlurmError:
            out, until = "", self.clock() + MAX_DELAY_S
        match = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.MULTILINE)
        self._cluster_names[conf] = (match.group(1) if match else None, until)
        return self._cluster_names[conf][0]

    def sbatch(self, script: Path, options: Sequence[str] = ()) -> str:
        """Submit a script as it is (`options`: sbatch's own, before it, e.g. a --dependency); its job id."""
        out = self.run(["sbatch", "--parsable", *options, str(script)], repeatable=False).stdout
        return out.strip().split(";")[0]

    def scancel(self, job_id: str, signal: str | None = None, cluster: str | None = None) -> bool:
        """Signal (`signal="TERM"`) or cancel a job (of `cluster`, when another's). False when Slurm no longer
        knows it (it has ended)."""
        argv = ["scancel", *on_cluster(cluster), *([f"--signal={signal}"] if signal else []), job_id]
        try:
            self.run(argv)
        except SlurmError as exc:
            if GONE.search(exc.stderr):
                return False
            raise
        return True

    def squeue(self, job_ids: Sequence[str], cluster: str | None = None) -> dict[str, tuple[str, str | None]]:
        """{job id: (state, reason)} of those the controller (of `cluster`) still lists; one call for all."""
        if not job_ids:
            return {}
        try:
            out = self.run(["squeue", *on_cluster(cluster), "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r"]).stdout
        except SlurmError as exc:
            if GONE.search(exc.stderr):  # every id unknown: squeue's way of saying "none of them"
                return {}
            raise
        found: dict[str, tuple[str, str | None]] = {}
        for line in out.splitlines():
            parts = line.strip().split("|", 2)
            if len(parts) == 3:
                found[parts[0]] = (parts[1], None if parts[2] in ("None", "(null)", "") else parts[2])
        return found

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
        try:
            out = self.run(argv).stdout
        except SlurmError as exc:
            if GONE.search(exc.stderr):
                return {}
            raise
        jobs: dict[str, dict[str, str]] = {}
        for line in out.splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            if fields.get("JobId") in job_ids:
                jobs[fields["JobId"]] = fields
        return jobs


#: the process's gateway; call sites use `slurm.default`, so tests can replace it.
default = Slurm()
