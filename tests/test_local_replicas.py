"""The local executor runs a job's replicas with the `.sub` itself (hpc/jobs/local_slurm.py): one step per replica,
started together, each its own MPI world (`mpirun -n TP×PP`), because TensorRT-LLM's leader mode takes
MPI_COMM_WORLD as the model's world (hpc/spec/placement.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launcher.contracts.layout import JobPaths
from launcher.contracts.records import read_endpoints
from tests.e2e import cli, kill_quietly, processes_under, rank_records, status, submit, write_spec

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        pid = _parent(pid)
        chain.append(pid)
    return chain


def test_each_replica_is_an_mpi_world_of_its_own(tmp_path: Path, tiny_gpt2, hpc_home, tritonserver) -> None:
    from hpc.jobs.local import job_processes

    spec = write_spec(tmp_path, "localrep", tiny_gpt2, tp=2, ntasks_per_node=4)
    spec.write_text(yaml.safe_dump({**yaml.safe_load(spec.read_text()), "replicas": 2}))
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    deploy_dir = job_dir.parent.parent
    try:
        paths = JobPaths.of_folder(job_dir)
        assert [e.replica for e in read_endpoints(paths)] == [0, 1]
        (script,) = json.loads(paths.local_state.read_text())["child_pids"]  # the job's own .sub
        assert Path(f"/proc/{script}/cmdline").read_bytes().split(b"\0")[1].endswith(b".sub")
        steps = [pid for pid in job_processes(job) if Path(f"/proc/{pid}/comm").read_text().strip() == "mpirun"]
        assert len(steps) == 2, steps  # one mpirun per replica, each a step of the .sub
        assert all(script in _ancestors(step) for step in steps)
        for step in steps:
            argv = Path(f"/proc/{step}/cmdline").read_bytes().split(b"\0")
            assert argv[argv.index(b"-n") + 1] == b"2", argv  # a world of tp 2, not 4
        # each replica's tritonservers (leader and follower) run under that replica's own mpirun
        servers = [pid for pid in job_processes(job) if Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"]
        under = {step: [pid for pid in servers if step in _ancestors(pid)] for step in steps}
        assert sorted(len(pids) for pids in under.values()) == [2, 2], under
        # every rank names its logs by its rank in the job, as under Slurm
        assert sorted(p.name for p in paths.rank_logs("err")) == [f"{job}_{r}_log.err" for r in range(4)]
        assert cli("generate", job, "Hello", "--max-tokens", "4").returncode == 0
        out = cli("cancel", job, timeout=120).stdout
        assert out.startswith(f"{job} CANCELLED"), out
        assert status(job)["state"] == "CANCELLED"
        assert {r: rec.exit_code for r, rec in rank_records(job_dir).items()} == {0: 0, 1: 0, 2: 0, 3: 0}
    finally:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(deploy_dir))
