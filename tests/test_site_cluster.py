"""A site profile on the real Slurm test cluster: its values serve from a rendered folder that no longer sees it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e import cli, processes_under, status, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(400)]

PROFILE = {
    "slurm": {
        "partition": "debug",
        "time": "00:10:00",
        "mpi": "pmix",
        "env": {"OMPI_MCA_btl": "self,tcp", "HPC_SITE_MARK": "from-the-profile"},
        "setup": ['echo "site setup ran on $(hostname)"'],
    }
}


def test_hand_sbatch_serves_with_the_profile_gone(
    slurm_cluster, hpc_home, tritonserver, tmp_path, tiny_gpt2, monkeypatch
):
    """The spec names nothing of the cluster; the profile gives the partition, time, MPI, environment and a setup
    line. After render the profile is deleted (and $HPC_SERVE_SITE names a file that is not there, so anything
    that still looked for a profile would fail): `sbatch D/tensorrt_llm_triton.sub` by hand serves, with them."""
    profile = tmp_path / "site.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    spec = tmp_path / "portable.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "site-e2e",
                "workdir": str(tmp_path / "runs"),
                "model": {"backend": "cpu", "workflow": "engine", "checkpoint_dir": str(tiny_gpt2)},
                "triton": {"triton_max_batch_size": 8, "ready_timeout_s": 120},
            }
        )
    )
    deploy = tmp_path / "deploy"
    monkeypatch.setenv("HPC_SERVE_SITE", str(profile))
    rendered = cli("render", str(spec), "-o", str(deploy))
    assert f"site profile: {profile} (gave 6 values" in rendered.stdout
    profile.unlink()
    monkeypatch.setenv("HPC_SERVE_SITE", str(tmp_path / "gone.yaml"))
    sub = (deploy / "tensorrt_llm_triton.sub").read_text()
    assert "#SBATCH -p debug\n" in sub and "#SBATCH --time=00:10:00\n" in sub and "srun --mpi=pmix " in sub
    job = (
        subprocess.run(
            ["sbatch", "--parsable", str(deploy / "tensorrt_llm_triton.sub")],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .split(";")[0]
    )
    try:
        assert cli("wait", job, "--timeout", "180", timeout=240).returncode == 0
        cli("generate", job, "site", "--max-tokens", "4")  # fails unless answered
        log = deploy / "logs" / f"{job}.out"
        assert "site setup ran on " in log.read_text()
        environs = [Path(f"/proc/{pid}/environ").read_bytes() for pid, _ in processes_under(deploy)]
        assert any(b"HPC_SITE_MARK=from-the-profile\0" in env for env in environs)
        partition = subprocess.run(["squeue", "-h", "-j", job, "-o", "%P"], capture_output=True, text=True).stdout
        assert partition.strip() == "debug"
        cli("cancel", job, timeout=120)
        assert status(job)["state"] == "CANCELLED"
        wait_for(lambda: not processes_under(deploy), 60, f"every process of {deploy} to exit")
    finally:
        subprocess.run(["scancel", job], capture_output=True)
