"""The local executor end to end: the real CLI, the real tritonserver (nvidia-pytriton) and the CPU engine,
on this machine, with the job folder Slurm would give the job. TP 1, and the ordered stop of a TP 2 job under
mpirun (see tests/test_e2e_cluster.py for TP across nodes)."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
from pathlib import Path

import pytest

from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.records import read_endpoints
from tests.e2e import cli, processes_under, rank_records, status, submit, wait_for, write_spec

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]


def _submit_local(tmp_path: Path, name: str, checkpoint: Path, local_jobs) -> tuple[str, Path, Path]:
    spec = write_spec(tmp_path, name, checkpoint, tp=1)
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    deploy_dir = job_dir.parent.parent
    local_jobs.append((job, deploy_dir))
    return job, job_dir, deploy_dir


def _local_state(job_dir: Path) -> dict:
    return json.loads(JobPaths.of_folder(job_dir).local_state.read_text())


def _server_pid(job_dir: Path) -> int:
    (record,) = read_endpoints(JobPaths.of_folder(job_dir))
    cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    assert Path(cmdline[0].decode()).name == "tritonserver", cmdline
    return record.pid


def test_local_job_serves_reports_and_cancels(tmp_path, tiny_gpt2, local_jobs):
    job, job_dir, deploy_dir = _submit_local(tmp_path, "local-tp1", tiny_gpt2, local_jobs)
    assert job.startswith("local-")
    assert job_dir == JobPaths(deploy_dir, job).folder and Deployment(deploy_dir).launch.exists()
    assert (Path(os.environ["HPC_SERVE_HOME"]) / "jobs" / job).resolve() == job_dir.resolve()

    # status --json: READY, one endpoint, published by rank 0
    st = status(job)
    assert st["state"] == "READY" and st["scheduler_state"] == "RUNNING" and st["failed_rank"] is None
    (endpoint,) = st["endpoints"]
    assert endpoint["rank"] == 0 and endpoint["replica"] == 0 and endpoint["job_id"] == job
    assert _local_state(job_dir)["state"] == "RUNNING"
    assert cli("status").stdout.startswith(f"{job} READY http://"), "no job id: the newest job"

    # generate through the published endpoint
    text = cli("generate", job, "Once upon a time", "--max-tokens", "8").stdout
    assert text.strip(), "the ensemble returned no text"

    # endpoints --format env: what a client script sources; an address other machines can reach
    env = dict(line.split("=", 1) for line in cli("endpoints", job, "--format", "env").stdout.splitlines())
    assert env["TRITON_HTTP_URL"] == f"http://{endpoint['address']}:{endpoint['http_port']}"
    assert env["TRITON_GRPC_URL"] == f"{endpoint['address']}:{endpoint['grpc_port']}"
    assert env["TRITON_HTTP_URLS"] == env["TRITON_HTTP_URL"]
    host = env["TRITON_HTTP_URL"].split("//")[1].rsplit(":", 1)[0]
    assert not ipaddress.ip_address(host).is_loopback, f"{host}: clients must not be sent to 127.x"

    # logs: rank 0's stdout begins with the launcher's own line, naming the tritonserver command
    first = cli("logs", job).stdout.splitlines()[0]
    assert first.startswith("[hpc-serve] rank 0/1 on "), first
    assert "leader" in first and f"--model-repository={deploy_dir}/triton_model_repo" in first
    no_rank = cli("logs", job, "--rank", "3", check=False)
    assert no_rank.returncode == 3, "no such rank: not found"
    assert f"--rank 3: job {job} has only rank 0" in no_rank.stderr

    # cancel: CANCELLED, and nothing of the deployment left running
    assert processes_under(deploy_dir)
    out = cli("cancel", job, timeout=120).stdout
    assert out.startswith(f"{job} CANCELLED"), out
    wait_for(lambda: not processes_under(deploy_dir), 60, f"every process of {deploy_dir} to exit")
    assert _local_state(job_dir)["state"] == "CANCELLED"
    st = status(job)
    assert st["state"] == "CANCELLED" and st["endpoints"] == [] and st["failed_rank"] is None
    assert not read_endpoints(JobPaths.of_folder(job_dir)), "the endpoint record goes with its server"
    assert cli("status", job, check=False).returncode == 0


def test_local_job_whose_tritonserver_is_killed_fails_naming_rank_0(tmp_path, tiny_gpt2, local_jobs):
    job, job_dir, deploy_dir = _submit_local(tmp_path, "local-victim", tiny_gpt2, local_jobs)
    os.kill(_server_pid(job_dir), signal.SIGKILL)

    st = wait_for(lambda: (s := status(job))["state"] == "FAILED" and s, 60, "the job to be FAILED")
    assert st["failed_rank"]["rank"] == 0 and st["failed_rank"]["signal"] == "SIGKILL"
    assert st["endpoints"] == []
    shown = cli("status", job, check=False)
    assert shown.returncode == 1
    assert f"{job} FAILED" in shown.stdout
    assert "rank 0 on " in shown.stdout and "exited with signal SIGKILL" in shown.stdout

    wait_for(lambda: _local_state(job_dir).get("state") == "FAILED", 30, "local.json to say FAILED")
    assert _local_state(job_dir)["exit_code"] == 128 + signal.SIGKILL  # the launcher's 128+N
    wait_for(lambda: not processes_under(deploy_dir), 60, "the stubs and the launcher to exit")
    assert status(job)["state"] == "FAILED", "still FAILED once the supervisor is gone"


def test_local_tp2_cancel_is_an_ordered_stop(tmp_path, tiny_gpt2, local_jobs):
    """Open MPI's mpirun turns SIGTERM into "abort the job" (SIGKILL to every rank a moment later), so the local
    executor signals each rank's launcher instead: the leader drains and releases its follower, both exit 0."""
    import shutil

    from tests._env import unavailable

    if not shutil.which("mpirun"):
        unavailable("mpirun not installed (apt-get install openmpi-bin)")
    spec = write_spec(tmp_path, "local-tp2", tiny_gpt2, tp=2)
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    deploy_dir = job_dir.parent.parent
    local_jobs.append((job, deploy_dir))
    out = cli("cancel", job, timeout=120).stdout
    assert out.startswith(f"{job} CANCELLED"), out
    wait_for(lambda: not processes_under(deploy_dir), 60, f"every process of {deploy_dir} to exit", interval=0.1)
    # ordered, not timed: mpirun's abort, the follower's release wait running out and the cancel's grace all end
    # in SIGKILL; both ranks exiting 0, the follower released by its leader, is the stop in order
    ranks = rank_records(job_dir)
    assert ranks[0].exit_code == 0 and ranks[1].exit_code == 0, ranks
    assert JobPaths.of_folder(job_dir).released(1).exists()
