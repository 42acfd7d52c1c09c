"""Smoke tests of the real one-machine Slurm test cluster (ci/cluster/up.sh): sbatch+sacct, srun --mpi=pmix
across node1/node2, GPU GRES, submitit. Skipped when the cluster is not up."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest
from cluster_smoke_helpers import cluster_env, run, wait_sacct

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("cluster")]


def test_sbatch_hostname_completes_and_sacct_sees_it(cluster: str, job_dir: Path) -> None:
    out = run(
        [
            "sbatch",
            "--parsable",
            "-p",
            cluster,
            "-o",
            str(job_dir / "%j.out"),
            "--chdir",
            str(job_dir),
            "--wrap",
            "hostname",
        ]
    )
    job_id = out.strip().split(";")[0]
    assert wait_sacct(job_id, timeout=60) == "COMPLETED"
    assert (job_dir / f"{job_id}.out").read_text().strip() == socket.gethostname()


MPI_PROG = r"""
import json, os
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
print(json.dumps({"rank": comm.rank, "size": comm.size, "node": os.environ["SLURMD_NODENAME"],
                  "sum": total, "lib": MPI.Get_library_version().split(",")[0]}), flush=True)
"""


def test_srun_pmix_allreduce_across_two_nodes(cluster: str, job_dir: Path) -> None:
    n = 4
    out = run(
        [
            "srun",
            "-p",
            cluster,
            "-N2",
            f"-n{n}",
            "--ntasks-per-node=2",
            "--mpi=pmix",
            "--kill-on-bad-exit=1",
            sys.executable,
            "-c",
            MPI_PROG,
        ],
        timeout=180,
        env=cluster_env(),
        cwd=job_dir,
    )
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in records) == list(range(n)), out
    assert {r["size"] for r in records} == {n}
    assert {r["sum"] for r in records} == {n * (n + 1) // 2}
    assert {r["node"] for r in records} == {"node1", "node2"}
    assert all("Open MPI" in r["lib"] for r in records), records


def test_srun_gres_gpu4_is_allocated(cluster: str, job_dir: Path) -> None:
    out = run(
        [
            "srun",
            "-p",
            cluster,
            "-N1",
            "--gres=gpu:4",
            "bash",
            "-c",
            'echo "CVD=${CUDA_VISIBLE_DEVICES:-} STEP_GPUS=${SLURM_STEP_GPUS:-}"',
        ],
        cwd=job_dir,
    )
    fields = dict(kv.split("=", 1) for kv in out.split())
    assert fields["CVD"] == "0,1,2,3" or fields["STEP_GPUS"], out
    assert len((fields["CVD"] or fields["STEP_GPUS"]).split(",")) == 4, out


GPU_JOB = """#!/bin/bash
python3 - <<'PY' > "{out}/$SLURM_JOB_ID.json"
import json, os, time
start = time.time()
time.sleep(4)
print(json.dumps({{"node": os.environ["SLURMD_NODENAME"], "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                  "start": start, "end": time.time()}}))
PY
"""


def test_two_4gpu_jobs_run_concurrently_on_different_nodes(cluster: str, job_dir: Path) -> None:
    script = job_dir / "gpu_job.sh"
    script.write_text(GPU_JOB.format(out=job_dir))
    ids = [
        run(
            [
                "sbatch",
                "--parsable",
                "-p",
                cluster,
                "-N1",
                "--gres=gpu:4",
                "-o",
                str(job_dir / "%j.log"),
                "--chdir",
                str(job_dir),
                str(script),
            ]
        )
        .strip()
        .split(";")[0]
        for _ in range(2)
    ]
    states = [wait_sacct(j, timeout=90) for j in ids]
    assert states == ["COMPLETED", "COMPLETED"], states
    a, b = (json.loads((job_dir / f"{j}.json").read_text()) for j in ids)
    assert {a["node"], b["node"]} == {"node1", "node2"}, (a, b)
    assert len(a["gpus"].split(",")) == 4 and len(b["gpus"].split(",")) == 4, (a, b)
    assert a["start"] < b["end"] and b["start"] < a["end"], f"jobs did not overlap: {a} {b}"


def _make_where():  # type: ignore[no-untyped-def]
    # A closure, so cloudpickle ships it by value: the job's python cannot import this test module.
    def where() -> dict[str, object]:
        import os

        return {"node": os.environ.get("SLURMD_NODENAME"), "job": os.environ.get("SLURM_JOB_ID"), "answer": 6 * 7}

    return where


def _submitit_final_state(job, timeout: float = 60) -> str:  # type: ignore[no-untyped-def]
    """The job's state as submitit's own watcher reads it from sacct (forced calls; sacct errors would leave
    it UNKNOWN, since submitit only logs them)."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = job.watcher.get_state(job.job_id, mode="force")
        if state not in ("UNKNOWN", "PENDING", "RUNNING", "COMPLETING", "READY"):
            return state
        time.sleep(0.5)
    return state


def test_submitit_auto_executor_result(cluster: str, job_dir: Path) -> None:
    submitit = pytest.importorskip("submitit")
    executor = submitit.AutoExecutor(folder=job_dir / "submitit", cluster="slurm")
    executor.update_parameters(slurm_partition=cluster, timeout_min=5)
    job = executor.submit(_make_where())
    t0 = time.monotonic()
    result = job.result()
    print(f"submitit AutoExecutor job {job.job_id}: result after {time.monotonic() - t0:.1f}s")
    assert result["answer"] == 42 and result["node"] in ("node1", "node2")
    assert result["job"] == job.job_id
    assert _submitit_final_state(job) == "COMPLETED"
    assert wait_sacct(job.job_id, timeout=60) == "COMPLETED"


def test_submitit_slurm_executor_result(cluster: str, job_dir: Path) -> None:
    submitit = pytest.importorskip("submitit")
    executor = submitit.SlurmExecutor(folder=job_dir / "submitit")
    executor.update_parameters(partition=cluster, time=5)
    job = executor.submit(_make_where())
    assert job.result()["answer"] == 42
    assert _submitit_final_state(job) == "COMPLETED"
    assert job.state == "COMPLETED", job.state
