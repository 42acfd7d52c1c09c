"""The local executor runs the `.sub` itself (hpc/jobs/local_slurm.py), so what the `.sub` does after a replica ended
happens on a laptop too: `replica_policy: restart` brings a killed replica back inside the same job, and a
replica's end withdraws its endpoint."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml

from hpc.jobs.local import job_processes
from launcher.contracts.layout import JobPaths
from launcher.contracts.records import read_endpoints
from tests.e2e import cli, kill_quietly, processes_under, status, submit, wait_for, write_spec

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]


def _tritonservers(job: str) -> list[int]:
    return [pid for pid in job_processes(job) if Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"]


def test_a_killed_replica_restarts_inside_the_local_job(tmp_path: Path, tiny_gpt2, hpc_home, tritonserver) -> None:
    spec = write_spec(tmp_path, "localrs", tiny_gpt2, auth="none")
    data = yaml.safe_load(spec.read_text())
    data.update(replica_policy="restart", restart={"max_restarts": 2, "backoff": "1s", "max_backoff": "1s"})
    spec.write_text(yaml.safe_dump(data))
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    deploy_dir = job_dir.parent.parent
    paths = JobPaths.of_folder(job_dir)
    try:
        (first,) = read_endpoints(paths)
        (server,) = _tritonservers(job)
        os.kill(server, signal.SIGKILL)
        back = wait_for(
            lambda: (s := status(job)).get("state") == "READY" and s["endpoints"][0]["restarts"] == 1 and s,
            180,
            "the replica READY again, its restart counted",
        )
        assert back["restart_causes"]["0"]["signal"] == "SIGKILL", back
        (again,) = read_endpoints(paths)
        assert again.restarts == 1 and (again.http_port, again.pid) != (first.http_port, first.pid)
        assert (paths.folder / "replica_restarts" / "replica-0" / "1").is_dir()
        assert cli("generate", job, "Hello", "--max-tokens", "4").returncode == 0
        out = cli("cancel", job, timeout=120).stdout
        assert out.startswith(f"{job} CANCELLED"), out
        assert read_endpoints(paths) == []  # the .sub withdrew it as the replica ended
        assert job_processes(job) == []
    finally:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(deploy_dir))
