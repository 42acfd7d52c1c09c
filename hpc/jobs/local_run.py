"""Supervisor of one local job: the per-rank script once per replica, each under an `mpirun -n TP×PP` of its own
(or directly for one rank), as the `.sub` runs one `srun` step per replica (hpc/spec/placement.py): TensorRT-LLM's
leader mode takes MPI_COMM_WORLD as the model's world, so a replica must be an MPI world of its own.

The local executor gives laptops and CI the same job folder as Slurm: per-rank logs named
`<job>_<rank>_log.out|err`, endpoint and rank records from the launcher, and a `local.json` that plays
the part of `sacct` (state, exit code). It runs detached (its own session) so the submitting shell can go.
Usage (by hpc/jobs/local.py): python -m hpc.jobs.local_run DEPLOY_DIR JOB_ID [SCRIPT]: the ranks, or SCRIPT of the
deployment folder as one process (a gateway's or a build's: hpc/jobs/kinds.py `script`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# The folder's names from launcher/contracts/layout.py (stdlib, cheap), not from hpc/render/jobfiles.py: that import pulls in
# pydantic, jinja2 and the spec (~0.14 s), all on the critical path between a local job's start and its ranks'.
from launcher.contracts.layout import Deployment, JobPaths, rank_log_name
from launcher.contracts.plan import FAIL_JOB, RESTART, LaunchPlan
from launcher.contracts.rank import JOB_ID_ENV, STEP_REPLICA_ENV
from launcher.contracts.records import VERSION, Record

# Each rank's output goes to its own files, named by its rank in the job as under Slurm: $1 the job folder, $2 the
# job id, $3 the replica's first rank in the job; the rank in the replica from mpirun (0 without one).
_RANK = "${R}"
_RANK_WRAPPER = "R=$(($3 + ${OMPI_COMM_WORLD_RANK:-0})); " + (
    f'exec bash "$0" >"$1/{rank_log_name("${2}", _RANK, "out")}" 2>"$1/{rank_log_name("${2}", _RANK, "err")}"'
)


@dataclass(frozen=True, kw_only=True)
class LocalState(Record):
    """`jobs/<id>/local.json`: a local job's state, what sacct is to a Slurm job. Written by its supervisor
    (this module, `hpc.jobs.local_run`) and by `cancel_local`; read by hpc/jobs/local.py `local_state`."""

    version: int = VERSION
    #: RUNNING, then COMPLETED, FAILED or CANCELLED (Slurm's words: hpc/jobs/status.py reads them so)
    state: str = "UNKNOWN"
    pid: int | None = None  # the supervisor's
    child_pids: list[int] = field(default_factory=list)  # each replica's step
    world_size: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None

    @classmethod
    def of(cls, job_dir: Path) -> LocalState | None:
        """The job's state, None before its supervisor wrote one."""
        return cls.read(JobPaths.of_folder(job_dir).local_state)


def write_state(job_dir: Path, **fields: Any) -> None:
    """Update local.json whole (a reader sees the old state or the new one)."""
    state = replace(LocalState.of(job_dir) or LocalState(), **fields)
    state.write(JobPaths.of_folder(job_dir).local_state)


def rank_command(deploy_dir: Path, job_dir: Path, job_id: str, world: int, first_rank: int = 0) -> list[str]:
    """The command that starts the `world` ranks of one replica (its first rank in the job: `first_rank`)."""
    script = str(Deployment(deploy_dir).sh)
    args = [script, str(job_dir), job_id, str(first_rank)]
    if world == 1:
        return ["bash", "-c", _RANK_WRAPPER, *args]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise SystemExit(f"the job needs {world} ranks but mpirun is not on PATH (apt-get install openmpi-bin)")
    return [mpirun, "--oversubscribe", "-n", str(world), "bash", "-c", _RANK_WRAPPER, *args]


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc): under ``mpirun`` on one machine, one per rank."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def stop_targets(child_pid: int, world: int) -> list[int]:
    """Whom a stop signal goes to: every rank's launcher, not mpirun. Open MPI's mpirun treats SIGTERM as
    "abort the job" and SIGKILLs the ranks a moment later, which would cut the ordered stop short (leaders
    drain and release their followers, launcher/node/stop.py). One rank runs without mpirun (``exec`` chain: the
    child is the launcher); before mpirun has started its ranks, mpirun itself."""
    if world == 1:
        return [child_pid]
    return children(child_pid) or [child_pid]


def main(argv: list[str]) -> int:
    deploy_dir, job_id = Path(argv[0]), argv[1]
    job_dir = JobPaths(deploy_dir, job_id).folder
    env = {**os.environ, JOB_ID_ENV: job_id, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    fail_job = True
    if argv[2:3]:  # the gateway or build script: one process (the gateway's execs it)
        world, steps = 1, [subprocess.Popen(["bash", str(Deployment(deploy_dir).root / argv[2])], env=env)]
    else:  # one step per replica, started together (the .sub's start_replica)
        plan = LaunchPlan.read(deploy_dir)
        world = plan.world_size_per_replica
        # restart is the Slurm script's (tensorrt_llm_triton.sub): a local job ends as fail-job ends it
        fail_job = plan.replica_policy in (FAIL_JOB, RESTART)
        steps = [
            subprocess.Popen(
                rank_command(deploy_dir, job_dir, job_id, world, k * world), env={**env, STEP_REPLICA_ENV: str(k)}
            )
            for k in range(plan.replicas)
        ]
    write_state(
        job_dir,
        state="RUNNING",
        pid=os.getpid(),
        child_pids=[step.pid for step in steps],
        world_size=world * len(steps),
        started_at=time.time(),
    )
    cancelled = False

    def stop(signum: int, of: list[subprocess.Popen]) -> None:
        for step in of:
            for pid in stop_targets(step.pid, world):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal cancelled
        cancelled = True
        stop(signum, steps)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    failed = 0  # the first replica's non-zero exit: the job's (the .sub's FAILED)
    while any(step.poll() is None for step in steps):
        ended = [step.returncode for step in steps if step.returncode is not None]
        if not failed and any(ended):
            failed = next(code for code in ended if code)
            if fail_job and not cancelled:  # replica_policy fail-job: the others stop in order
                stop(signal.SIGTERM, [step for step in steps if step.returncode is None])
        time.sleep(0.2)
    code = failed or next((step.returncode for step in steps if step.returncode), 0)
    state = "CANCELLED" if cancelled else ("COMPLETED" if code == 0 else "FAILED")
    write_state(job_dir, state=state, exit_code=code, ended_at=time.time())
    return 0 if state != "FAILED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
