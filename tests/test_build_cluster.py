"""Engine builds on the real one-machine Slurm cluster (ci/cluster/up.sh): the CPU engine's build job creates
the checkpoint `model.init` asks for and shards it per rank, the serving job (tp 2 across node1/node2) runs after
it through `--dependency=afterok`, a resubmission is a cache hit (no build job), and a failed build says which
step failed with its last lines while Slurm cancels the serving job that waited for it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from launcher.contracts.layout import BUILD_RECORD_NAME
from tests.e2e import cli, status, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(400)]


def build_spec(folder: Path, checkpoint: Path, init: bool = True) -> Path:
    spec = {
        "name": "built",
        "workdir": str(folder / "runs"),
        "slurm": {"nodes": 2, "ntasks_per_node": 1, "time": "00:10:00", "env": {"OMPI_MCA_btl": "self,tcp"}},
        "model": {
            "backend": "cpu",
            "checkpoint_dir": str(checkpoint),
            "tp_size": 2,
            **({"init": {"family": "gpt2", "size": "tiny", "seed": 3}} if init else {}),
        },
        "triton": {"triton_max_batch_size": 8, "ready_timeout_s": 120},
        "build": {"output_dir": str(folder / "engines")},
    }
    path = folder / "built.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _submit(spec: Path) -> tuple[str, str | None, str]:
    """`hpc-serve submit` (no wait): (serving job, build job or None, stderr)."""
    proc = cli("submit", str(spec))
    build = re.search(r"^build (\d+) → ", proc.stderr, re.M)
    return proc.stdout.split()[0], build.group(1) if build else None, proc.stderr


def _sacct(job: str, field: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", field], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


def test_build_then_serve_tp2_across_nodes_and_a_cache_hit(jobs, tmp_path):
    checkpoint = tmp_path / "ckpt"
    spec = build_spec(tmp_path, checkpoint)
    serving, build, err = _submit(spec)
    jobs += [serving] + ([build] if build else [])
    assert build is not None, err
    assert not checkpoint.exists() or (checkpoint / "config.json").exists()  # submit left the creating to the job
    dependency = subprocess.run(["scontrol", "show", "job", serving], capture_output=True, text=True).stdout
    proc = cli("wait", serving, "--timeout", "240", timeout=260, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = status(build)
    assert built["state"] == "COMPLETED" and built["kind"] == "build", built
    # afterok: the serving job was held on the build, or started only once it had ended
    held = f"afterok:{build}" in dependency
    assert held or _sacct(serving, "Start") >= _sacct(build, "End"), dependency
    engine = Path(re.search(r"engine (\S+)", built["reason"]).group(1))
    assert sorted(p.name for p in engine.glob("rank*.safetensors")) == ["rank0.safetensors", "rank1.safetensors"]
    assert not list(engine.parent.glob(".building*")), "the build job's end removed its marker"
    assert (checkpoint / "config.json").is_file()  # the build job created it
    record = json.loads((engine / BUILD_RECORD_NAME).read_text())
    assert record["job_id"] == build and record["request"]["tp_size"] == 2
    ready = status(serving)
    assert ready["state"] == "READY"
    job_dir = Path(ready["job_dir"])
    repo = (job_dir.parent.parent / "triton_model_repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert str(engine) in repo  # the ranks serve the sharded folder
    placed = [(job_dir / f"{serving}_{rank}_log.out").read_text().splitlines()[0] for rank in (0, 1)]
    assert "rank 0/2 on node1" in placed[0] and "rank 1/2 on node2" in placed[1], placed  # tp 2 across the nodes
    cli("generate", serving, "built and sharded", "--max-tokens", "4")
    # the same spec again: the engine is there, no build job, served at once
    again, rebuild, err = _submit(spec)
    jobs.append(again)
    assert rebuild is None and f"engine {engine} is built already" in err, err
    proc = cli("wait", again, "--timeout", "200", timeout=220, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in engine.parent.iterdir() if not p.name.startswith(".")) == [engine.name]
    cli("generate", again, "from the cache", "--max-tokens", "4")


def test_a_failed_build_names_its_step_and_cancels_the_serving_job(jobs, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"architectures": ["NotAModel"], "model_type": "nope"}))
    serving, build, err = _submit(build_spec(tmp_path, broken, init=False))
    jobs += [serving] + ([build] if build else [])
    assert build is not None, err
    failed = wait_for(lambda: (s := status(build)).get("state") == "FAILED" and s, 180, "the build to fail")
    reason = failed["reason"]
    assert reason.startswith("step 0 (shard) failed with exit status 2: "), reason
    assert "backend.cpu_engine.shards" in reason and "not supported by the CPU engine" in reason
    summary = cli("status", build, check=False)
    assert summary.returncode == 1 and "(build)" in summary.stdout and "| shards:" in summary.stdout
    # Slurm cancels the serving job whose dependency can no longer be met (--kill-on-invalid-dep=yes)
    ended = wait_for(lambda: (s := status(serving)).get("state") in ("CANCELLED", "FAILED") and s, 120, "serving end")
    assert ended["state"] in ("CANCELLED", "FAILED")
    serving_text = cli("status", serving, check=False).stdout
    assert f"{build} FAILED (build) step 0 (shard) failed" in serving_text, serving_text  # why it never started
    log = cli("logs", build).stdout
    assert "hpc-serve build: step 0 (shard)" in log and "shards:" in log
    # nothing in the engine cache: no engine, no staging folder, and no marker that the job builds (its EXIT trap)
    assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").iterdir())
