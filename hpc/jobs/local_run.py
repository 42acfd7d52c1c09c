"""Supervisor of one local job: it runs the job's own rendered script, the serving job's `.sub` with `srun` and
`scancel` played on this machine (hpc/jobs/local_slurm.py), so a local job starts, ends, cleans up after and
restarts its replicas exactly as a Slurm job does: each replica's step an `mpirun -n TP×PP` of its own (or the
rank itself for one), TensorRT-LLM's leader mode taking MPI_COMM_WORLD as the model's world.

The local executor gives laptops and CI the same job folder as Slurm: per-rank logs named
`<job>_<rank>_log.out|err`, endpoint and rank records from the launcher, and a `local.json` that plays
the part of `sacct` (state, exit code). It runs detached (its own session) so the submitting shell can go.
Usage (by hpc/jobs/local.py): python -m hpc.jobs.local_run DEPLOY_DIR JOB_ID [SCRIPT]: the serving job's `.sub`, or
SCRIPT of the deployment folder (a gateway's or a build's: hpc/jobs/kinds.py `script`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# The folder's names from launcher/contracts/layout.py (stdlib, cheap), not from hpc/render/jobfiles.py: that import pulls in
# pydantic, jinja2 and the spec (~0.14 s), all on the critical path between a local job's start and its ranks'.
from hpc.jobs.local_slurm import write_standins
from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.rank import JOB_ID_ENV
from launcher.contracts.records import VERSION, Record

#: the folder, in the job's, of its `srun` and `scancel` stand-ins
STANDINS_NAME = ".local_bin"


@dataclass(frozen=True, kw_only=True)
class LocalState(Record):
    """`jobs/<id>/local.json`: a local job's state, what sacct is to a Slurm job. Written by its supervisor
    (this module, `hpc.jobs.local_run`) and by `cancel_local`; read by hpc/jobs/local.py `local_state`."""

    version: int = VERSION
    #: RUNNING, then COMPLETED, FAILED or CANCELLED (Slurm's words: hpc/jobs/status.py reads them so)
    state: str = "UNKNOWN"
    pid: int | None = None  # the supervisor's
    child_pids: list[int] = field(default_factory=list)  # the bash that runs the job's script
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


def _step_env(job_dir: Path, job_id: str) -> dict[str, str]:
    """The environment of the job's script: no Slurm variables (a local job started inside an allocation is not
    that allocation's), the job's id where the `.sub` looks for it without Slurm, and the stand-ins of `srun` and
    `scancel` first on PATH (hpc/jobs/local_slurm.py)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    standins = write_standins(job_dir / STANDINS_NAME)
    return {
        **env,
        JOB_ID_ENV: job_id,
        "PATH": f"{standins}{os.pathsep}{env.get('PATH', os.defpath)}",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }


def main(argv: list[str]) -> int:
    deploy_dir, job_id = Path(argv[0]), argv[1]
    job_dir = JobPaths(deploy_dir, job_id).folder
    env = _step_env(job_dir, job_id)
    if argv[2:3]:  # the gateway or build script: one process (the gateway's execs it)
        world, script = 1, Deployment(deploy_dir).root / argv[2]
    else:  # the serving job's own `.sub`: its replicas, their ends and restarts, as under Slurm
        plan = LaunchPlan.read(deploy_dir)
        world, script = plan.replicas * plan.world_size_per_replica, Deployment(deploy_dir).sub
    job = subprocess.Popen(["bash", str(script)], env=env)
    write_state(
        job_dir, state="RUNNING", pid=os.getpid(), child_pids=[job.pid], world_size=world, started_at=time.time()
    )
    cancelled = False

    def on_signal(signum: int, _frame: object) -> None:
        """What `scancel` is to a Slurm job: the script's trap stops its ranks in order."""
        nonlocal cancelled
        cancelled = True
        try:
            job.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = job.wait()
    state = "CANCELLED" if cancelled else ("COMPLETED" if code == 0 else "FAILED")
    write_state(job_dir, state=state, exit_code=code, ended_at=time.time())
    return 0 if state != "FAILED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
