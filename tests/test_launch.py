"""`hpc-serve launch SPEC`: which rank renders, and that every rank of one step agrees on the folder.

The case that breaks naive code: `mpirun hpc-serve launch spec.yaml` inside a Slurm allocation, where every rank
inherits the batch step's stale SLURM_PROCID=0, so each one would think it is rank 0 and render.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import hpc.cli.launch as launch
from launcher.contracts.rank import JOB_ID_ENV, job_id_from_env, step_name
from tests.e2e import write_spec

ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "4294967290", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}


def _mpirun_rank(rank: int) -> dict[str, str]:
    return {
        **ALLOCATION,
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
        "PMIX_NAMESPACE": "prterun-login-4242@1",
    }


def _use_env(monkeypatch, env: dict[str, str]) -> None:
    for name in (
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_STEP_NUM_TASKS",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "PMIX_NAMESPACE",
        JOB_ID_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.mark.slow
def test_mpirun_inside_an_allocation_renders_once_on_rank_0(tmp_path: Path, monkeypatch, hpc_home) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    spec = write_spec(tmp_path, "interactive", ckpt)
    monkeypatch.setattr(launch, "WAIT_FOR_RENDER_S", 0.3)
    _use_env(monkeypatch, _mpirun_rank(1))  # stale SLURM_PROCID=0, but mpirun says rank 1
    with pytest.raises(SystemExit, match="rank 0 did not render"):
        launch.deployment_for_spec(spec)
    assert not (tmp_path / "runs").exists(), "rank 1 must wait for rank 0, not render"
    _use_env(monkeypatch, {**_mpirun_rank(0), "SLURM_PROCID": "1"})
    monkeypatch.setattr("hpc.jobs.model_init.ensure_model", lambda spec: None)
    deploy = launch.deployment_for_spec(spec)
    assert (deploy / "launch.json").is_file() and deploy.name == "interactive-77.4294967290"


def test_every_rank_of_a_bare_mpirun_agrees_on_the_job_id() -> None:
    ids = {job_id_from_env({k: v for k, v in _mpirun_rank(r).items() if not k.startswith("SLURM")}) for r in (0, 1)}
    assert ids == {"local-prterun-login-4242-1"}
    assert step_name(_mpirun_rank(1)) == "77.4294967290"
    assert step_name({JOB_ID_ENV: "local-abc"}) == "local-abc"
