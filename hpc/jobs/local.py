"""The local executor: run a rendered deployment on this machine, with the job folder Slurm would give it.

For laptops, CI and a login-node smoke test of the embedded default. The job runs under a detached
supervisor (`hpc.jobs.local_run`); its id is `local-<hex>`, so every other command tells it from a Slurm job.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hpc.jobs.local_slurm import job_processes
from hpc.scheduler.index import JobRef, register
from launcher.contracts.config import CANCEL_GRACE_S
from launcher.contracts.job_index import index_dir
from launcher.contracts.layout import JobPaths, with_source_root

if TYPE_CHECKING:
    from hpc.jobs.kinds import JobKind

#: every local job id starts with it: how `hpc.jobs.executors.executor_of` tells a local job from a Slurm one
JOB_ID_PREFIX = "local-"


def new_job_id() -> str:
    while True:
        job_id = f"{JOB_ID_PREFIX}{secrets.token_hex(3)}"
        if not (index_dir() / job_id).exists():
            return job_id


def submit_local(deploy_dir: Path, job_kind: type[JobKind]) -> JobRef:
    """Start a job of `job_kind` in the background: the deployment's ranks (a kind whose ranks stop in order), else
    the kind's script as one process (the gateway's, a build's); return at once."""
    job_id = new_job_id()
    paths = JobPaths(deploy_dir, job_id).create()
    job_dir = paths.folder
    job_kind.mark(paths)
    register(job_id, job_dir)
    log = open(paths.deployment.sbatch_log("out", job_id), "ab")
    script = [] if job_kind.stoppable else [job_kind.script]
    subprocess.Popen(
        [sys.executable, "-m", "hpc.jobs.local_run", str(deploy_dir), job_id, *script],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=deploy_dir,
        env=dict(os.environ, PYTHONPATH=with_source_root(os.environ.get("PYTHONPATH"))),
    )
    log.close()
    # The supervisor writes local.json as its first act; wait for it so `status` never sees a gap.
    deadline = time.monotonic() + 10
    while not paths.local_state.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return JobRef(job_id, job_dir)


def local_state(job_dir: Path) -> tuple[str, str | None]:
    """(state, reason) of a local job from its supervisor's local.json: what sacct is to a Slurm job."""
    from hpc.jobs.local_run import LocalState

    record = LocalState.of(job_dir)
    if record is None:
        return "UNKNOWN", "the local supervisor never started"
    if record.state == "RUNNING" and not _alive(record.pid):
        return "FAILED", "the local supervisor died"
    failed = record.state == "FAILED" and record.exit_code is not None
    return record.state, f"exit code {record.exit_code}" if failed else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live (not zombie) processes whose command line contains `text`, with that command line: how tests and
    benchmarks prove a deployment folder left no tritonserver, stub or launcher behind."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(") ")[-1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found


def _running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie waiting for its parent to reap it has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cancel_local(ref: JobRef, grace_s: float = CANCEL_GRACE_S) -> None:
    """SIGTERM the supervisor (it passes it to the job's script, whose trap stops the ranks in order, as scancel's
    does under Slurm; the launchers also see the cancel marker), wait for the ranks to go, then SIGKILL whatever is
    left."""
    from hpc.jobs.local_run import LocalState, write_state

    state = LocalState.of(ref.job_dir)
    if state is None or state.pid is None:
        return  # no supervisor ever ran: nothing to stop
    supervisor = state.pid
    try:
        os.kill(supervisor, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    # the supervisor too: it is not marked like the processes it starts, and it exits just after them (a cancel
    # that returned before it did left `hpc.jobs.local_run` running for a moment after CANCELLED)
    while (job_processes(ref.job_id) or _running(supervisor)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in [*job_processes(ref.job_id), *([supervisor] if _running(supervisor) else [])]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    state = LocalState.of(ref.job_dir)
    if state is not None and state.state == "RUNNING":
        write_state(ref.job_dir, state="CANCELLED", ended_at=time.time())
