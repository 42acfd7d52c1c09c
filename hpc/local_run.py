"""Supervisor of one local job: the per-rank script under `mpirun -n WORLD` (or directly for one rank).

The local executor gives laptops and CI the same job folder as Slurm: per-rank logs named
`<job>_<rank>_log.out|err`, endpoint and rank records from the launcher, and a `local.json` that plays
the part of `sacct` (state, exit code). It runs detached (its own session) so the submitting shell can go.
Usage (by hpc/local.py): python -m hpc.local_run DEPLOY_DIR JOB_ID [gateway|build]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# The folder's names from launcher/layout.py (stdlib, cheap), not from hpc/render.py: that import pulls in
# pydantic, jinja2 and the spec (~0.14 s), all on the critical path between a local job's start and its ranks'.
from launcher.layout import Deployment, JobPaths, rank_log_name

# Each rank's output goes to its own files, named as under Slurm (`srun --output=%j_%t_log.out`): $1 the job
# folder, $2 the job id, the rank from mpirun.
_RANK = "${OMPI_COMM_WORLD_RANK}"
_RANK_WRAPPER = (
    f'exec bash "$0" >"$1/{rank_log_name("${2}", _RANK, "out")}" 2>"$1/{rank_log_name("${2}", _RANK, "err")}"'
)


def write_state(job_dir: Path, **fields: object) -> None:
    """Atomically update local.json (read by hpc/local.py local_state, the local executor's sacct)."""
    path = JobPaths.of_folder(job_dir).local_state
    state = json.loads(path.read_text()) if path.exists() else {}
    state.update(fields)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def rank_command(deploy_dir: Path, job_dir: Path, job_id: str, world: int) -> list[str]:
    """The command that starts every rank of the job on this machine."""
    script = str(Deployment(deploy_dir).sh)
    if world == 1:
        wrapper = _RANK_WRAPPER.replace(_RANK, "0")
        return ["bash", "-c", wrapper, script, str(job_dir), job_id]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise SystemExit(f"the job needs {world} ranks but mpirun is not on PATH (apt-get install openmpi-bin)")
    return [mpirun, "--oversubscribe", "-n", str(world), "bash", "-c", _RANK_WRAPPER, script, str(job_dir), job_id]


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
    drain and release their followers, launcher/stop.py). One rank runs without mpirun (``exec`` chain: the
    child is the launcher); before mpirun has started its ranks, mpirun itself."""
    if world == 1:
        return [child_pid]
    return children(child_pid) or [child_pid]


def main(argv: list[str]) -> int:
    deploy_dir, job_id = Path(argv[0]), argv[1]
    job_dir = JobPaths(deploy_dir, job_id).folder
    script = {"gateway": Deployment(deploy_dir).gateway_sub, "build": Deployment(deploy_dir).build_sub}
    if argv[2:3] and argv[2] in script:  # the gateway or build script: one process (the gateway's execs it)
        world, command = 1, ["bash", str(script[argv[2]])]
    else:
        plan = json.loads(Deployment(deploy_dir).launch.read_text())
        world = int(plan["world_size_per_replica"]) * int(plan["replicas"])
        command = rank_command(deploy_dir, job_dir, job_id, world)
    env = dict(os.environ, HPC_SERVE_JOB_ID=job_id, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    child = subprocess.Popen(command, env=env)
    write_state(
        job_dir, state="RUNNING", pid=os.getpid(), child_pid=child.pid, world_size=world, started_at=time.time()
    )
    cancelled = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal cancelled
        cancelled = True
        for pid in stop_targets(child.pid, world):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = child.wait()
    state = "CANCELLED" if cancelled else ("COMPLETED" if code == 0 else "FAILED")
    write_state(job_dir, state=state, exit_code=code, ended_at=time.time())
    return 0 if state != "FAILED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
