"""hpc/render/jobfiles.py: the deployment folder (DEVELOPERS.md), launch.json, the #SBATCH header and srun line of the
.sub, container flags, re-render and failed-render behaviour, site templates, model repository configs."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

import backend.repository
from hpc.render import jobfiles as R
from hpc.render.deployment_plan import plan_deployment
from hpc.spec import Spec, load_spec, parse_spec
from launcher.contracts.layout import BUILD_SUB_NAME, JobPaths
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.rank import REPLICA_RESTARTS_ENV, STEP_REPLICA_ENV
from launcher.contracts.stop_records import BY_TIME_LIMIT, StopNotice, StopRequest

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"}


# ----------------------------------------------------------------------------------------------- helpers
def deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def cpu_spec(tmp: Path, **extra) -> Spec:
    (tmp / "ckpt").mkdir(parents=True, exist_ok=True)
    data = deep_merge(
        {
            "name": "cpu-test",
            "slurm": {"nodes": 1},
            "model": {"backend": "cpu", "workflow": "engine", "checkpoint_dir": "ckpt"},
        },
        extra,
    )
    return parse_spec(yaml.safe_dump(data), file="cpu.yaml", base=tmp)


def gpu_spec(tmp: Path, tp: int = 2, pp: int = 1, **extra) -> Spec:
    engine = tmp / "models" / "engine"
    engine.mkdir(parents=True, exist_ok=True)
    (engine / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": {"tp_size": tp, "pp_size": pp}}}))
    (tmp / "models" / "tok").mkdir(exist_ok=True)
    data = deep_merge(
        {
            "name": "gpu-test",
            "slurm": {"nodes": pp, "gpus_per_node": tp, "partition": "gpu", "account": "proj", "time": "02:00:00"},
            "model": {
                "backend": "tensorrtllm",
                "engine_dir": "models/engine",
                "tokenizer_dir": "models/tok",
                "tp_size": tp,
                "pp_size": pp,
            },
        },
        extra,
    )
    return parse_spec(yaml.safe_dump(data), file="gpu.yaml", base=tmp)


def sbatch_header(sub: str) -> list[str]:
    """The #SBATCH lines sbatch reads: those before the first line that is not a comment or blank."""
    lines = sub.splitlines()
    assert lines[0] == "#!/bin/bash"
    header = []
    for line in lines[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            header.append(line)
    assert header == [line for line in lines if line.startswith("#SBATCH")], "an #SBATCH line after the first command"
    return header


def srun_argv(sub: str) -> list[str]:
    """A replica's server step's argv as bash would split it (continuations joined, quotes removed; without the
    replica variable in front and the placement, "$@", that each `start_replica` call adds)."""
    joined = sub.replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines() if "srun --mpi=pmix" in line]
    assert len(lines) == 1, lines
    argv = shlex.split(lines[0])
    assert argv[0] == f"{STEP_REPLICA_ENV}=$replica", (
        "each step's ranks learn their replica (launcher/contracts/rank.py)"
    )
    assert argv[1] == f"{REPLICA_RESTARTS_ENV}=${{RESTARTED[replica]:-0}}", "and how often it was restarted"
    assert argv[-1] == "&", "srun runs in the background so the .sub's traps can act (ordered stop)"
    return [arg for arg in argv[2:-1] if arg != "$@"]


def replica_starts(sub: str) -> list[list[str]]:
    """Each `K) start_replica K OPTIONS ;;` case of the .sub's launch_replica, split: one srun step per replica
    (hpc/spec/placement.py), started the same way at the job's start and at a restart."""
    cases = [shlex.split(line.strip())[2:-1] for line in sub.splitlines() if ") start_replica " in line]
    assert [line.strip() for line in sub.splitlines() if line.startswith("launch_replica ")] == [
        f"launch_replica {case[0]}" for case in cases
    ], "every replica is launched once at the start"
    return cases


def parse_pbtxt(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(encoding="utf-8"), mc.ModelConfig())


# ------------------------------------------------------------------------------------------ the folder
def test_render_writes_the_deployment_folder(tmp_path):
    spec = cpu_spec(tmp_path)
    out = R.render(spec, tmp_path / "deploy")
    d = tmp_path / "deploy"
    assert out.deploy_dir == d and out.sub == d / "tensorrt_llm_triton.sub" and out.sh == d / "tensorrt_llm_triton.sh"
    assert out.launch == d / "launch.json" and out.model_repository == d / "triton_model_repo"
    assert {p.name for p in d.iterdir()} == {
        "spec.yaml",
        "launch.json",
        "tensorrt_llm_triton.sub",
        "tensorrt_llm_triton.sh",
        "triton_model_repo",
        "logs",
        "jobs",
        "python",
        "access_token",  # auth: token, the default (tests/test_auth.py)
    }
    # the ranks' code ships inside the folder: hpc-serve's own packages, never the environment around them
    assert {p.name for p in (d / "python").iterdir()} == {"launcher", "backend"}
    assert (d / "python" / "backend" / "models" / "postprocessing.py").is_file()
    assert f"export PYTHONPATH={d}/python" in out.sh.read_text()
    for script in (out.sub, out.sh):
        assert os.access(script, os.X_OK)
    assert {p.name for p in out.model_repository.iterdir() if p.is_dir()} == MODELS
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".deploy")] == []  # no staging left
    # spec.yaml is the resolved spec: it loads back to the same thing with absolute paths
    reloaded = load_spec(d / "spec.yaml")
    assert reloaded == spec
    assert reloaded.model.checkpoint_dir == tmp_path / "ckpt"


def test_launch_json_contract(tmp_path):
    spec = cpu_spec(
        tmp_path,
        replicas=2,
        model={"tp_size": 2},
        slurm={"ntasks_per_node": 4},
        triton={
            "log_verbose": 2,
            "server_args": ["--exit-timeout-secs=5"],
            "ready_timeout_s": 60,
            "warmup_timeout_s": 30,
        },
    )
    R.render(spec, tmp_path / "d")
    plan = json.loads((tmp_path / "d" / "launch.json").read_text())
    loaded = LaunchPlan.read(tmp_path / "d" / "launch.json")
    assert (loaded.ready_timeout_s, loaded.warmup_timeout_s) == (60, 30), "what the launcher reads of it"
    assert plan == {
        "version": 1,
        "name": "cpu-test",
        "deployment_dir": str(tmp_path / "d"),
        "model_repository": str(tmp_path / "d" / "triton_model_repo"),
        "tp_size": 2,
        "pp_size": 1,
        "replicas": 2,
        "world_size_per_replica": 2,
        "mode": "leader",
        "tritonserver": None,
        "ports": {"http": "auto", "grpc": "auto", "metrics": "auto"},
        "follower_models": ["tensorrt_llm"],
        "server_args": ["--log-verbose=2", "--exit-timeout-secs=5"],
        "ready_timeout_s": 60,
        "warmup_timeout_s": 30,
        "env": {"PMIX_MCA_gds": "hash"},
        "auth": "token",
        "gpu_binding": "none",
        "replica_policy": "fail-job",
        "drain_s": 10.0,
        "workflow": "engine",
        "backend": "cpu",
        "decoupled": True,
    }
    assert LaunchPlan.from_dict(plan) == loaded, "render writes what the plan's schema reads back"


def test_launch_json_fixed_ports_server_and_orchestrator(tmp_path):
    spec = gpu_spec(
        tmp_path,
        tp=2,
        slurm={"ntasks_per_node": 1},
        mode="orchestrator",
        triton={"ports": {"http": 9000, "grpc": 9001, "metrics": "auto"}, "server": "/opt/ts"},
    )
    plan = plan_deployment(spec, tmp_path / "d").launch
    assert plan.ports == {"http": 9000, "grpc": 9001, "metrics": "auto"}
    assert plan.tritonserver == "/opt/ts"
    assert plan.world_size_per_replica == 1 and plan.tp_size == 2 and plan.mode == "orchestrator"
    assert plan.env["PMIX_MCA_gds"] == "hash" and plan.env["TRTLLM_ORCHESTRATOR"] == "1"


def test_ranks_other_than_the_leader_load_only_tensorrt_llm(tmp_path):
    from launcher.contracts import rank
    from launcher.node import command
    from launcher.node.ports import Ports

    spec = cpu_spec(tmp_path, replicas=2, model={"tp_size": 2}, slurm={"ntasks_per_node": 4})
    R.render(spec, tmp_path / "d")
    plan = LaunchPlan.read(tmp_path / "d")
    assert plan.follower_models == ("tensorrt_llm",)
    leaders = []
    for r in range(4):
        info = rank.RankInfo(r, r, 4, "n1", "7", "slurm")
        me = rank.role(info, plan.tp_size, plan.pp_size, plan.replicas, plan.world_size_per_replica)
        argv = command.build_argv(
            "tritonserver",
            model_repository=plan.model_repository,
            rank=r,
            job_id="7",
            leader=me.leader,
            ports=Ports(8000, 8001, 8002),
            follower_models=plan.follower_models,
            server_args=plan.server_args,
        )
        loads = [a for a in argv if a.startswith("--load-model=")]
        if me.leader:
            leaders.append(r)
            assert loads == [] and "--http-port=8000" in argv
        else:
            assert loads == ["--load-model=tensorrt_llm"] and "--model-control-mode=explicit" in argv
            assert not any(a.startswith("--http-port") for a in argv)
    assert leaders == [0, 2]


# ----------------------------------------------------------------------------------------------- the .sub
def test_sub_header_and_srun_line(tmp_path):
    spec = gpu_spec(
        tmp_path,
        tp=4,
        pp=2,
        slurm={
            "qos": "normal",
            "mem": "64G",
            "constraint": "a100&ib",
            "sbatch_args": ["--mail-type=END"],
            "exclusive": True,
        },
    )
    R.render(spec, tmp_path / "d")
    d = tmp_path / "d"
    sub = (d / "tensorrt_llm_triton.sub").read_text()
    assert sbatch_header(sub) == [
        "#SBATCH -J gpu-test",
        f"#SBATCH -o {d}/logs/%j.out",
        f"#SBATCH -e {d}/logs/%j.err",
        "#SBATCH -A proj",
        "#SBATCH -p gpu",
        "#SBATCH --qos=normal",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --time=02:00:00",
        "#SBATCH --signal=B:USR1@30",
        "#SBATCH --gres=gpu:4",
        "#SBATCH --mem=64G",
        "#SBATCH --exclusive",
        "#SBATCH --constraint=a100&ib",
        "#SBATCH --mail-type=END",
    ]
    argv = srun_argv(sub)
    assert argv[:3] == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1"]
    assert not [a for a in argv if a.startswith(("--output", "--error"))]  # the launcher names the rank logs
    assert replica_starts(sub) == [
        ["0", "--nodes=2", "--ntasks=8", "--relative=0", "--distribution=block", "--ntasks-per-node=4"]
    ]
    assert argv[-2:] == ["bash", "$DEPLOY_DIR/tensorrt_llm_triton.sh"]
    assert "trap stop_job USR1 TERM" in sub  # ordered stop, not srun's (test_the_subs_stop_asks_the_launchers_first)
    assert f"DEPLOY_DIR={d}" in sub.splitlines()
    assert 'JOB_DIR="$DEPLOY_DIR/jobs/$JOB_ID"' in sub
    assert "nvidia-smi" not in sub  # no clock lock unless asked for


def test_one_step_per_replica_on_nodes_of_its_own(tmp_path):
    """Each replica its own srun step (its own MPI world), on its own node; when one ends, its endpoint and the
    shared memory of its ranks go; fail-job stops the others in order, keep-serving does not."""
    spec = cpu_spec(tmp_path, slurm={"nodes": 2, "ntasks_per_node": 2}, model={"tp_size": 2}, replicas=2, requeue=True)
    sub = R.render_scripts(spec, tmp_path / "d")[R.SUB_NAME]
    assert replica_starts(sub) == [
        ["0", "--nodes=1", "--ntasks=2", "--relative=0", "--distribution=block"],
        ["1", "--nodes=1", "--ntasks=2", "--relative=1", "--distribution=block"],
    ]
    assert {"#SBATCH --requeue", "#SBATCH --open-mode=append"} <= set(sbatch_header(sub))
    assert '1) endpoint="$JOB_DIR/endpoints/replica-1.json"' in sub and 'rm -f "$endpoint"' in sub
    assert 'bash -c "rm -f /dev/shm/prefix2_${JOB_ID}_* /dev/shm/prefix3_${JOB_ID}_*"' in sub
    stop_others = "    stop_job"
    assert stop_others in sub.splitlines()
    keep = cpu_spec(
        tmp_path,
        slurm={"nodes": 2, "ntasks_per_node": 2},
        model={"tp_size": 2},
        replicas=2,
        replica_policy="keep-serving",
    )
    kept = R.render_scripts(keep, tmp_path / "d")[R.SUB_NAME]
    assert stop_others not in kept.splitlines() and "#SBATCH --requeue" not in kept
    for text in (sub, kept):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_replicas_sharing_a_node_split_it(tmp_path):
    """Steps that share a node ask for only their part of it, or they would wait for each other (Slurm 22.05)."""
    spec = gpu_spec(tmp_path, tp=1, slurm={"nodes": 2, "gpus_per_node": 2}, replicas=4)
    sub = R.render_scripts(spec, tmp_path / "d")[R.SUB_NAME]
    share = ["--exact", "--cpus-per-task=$STEP_CPUS", "--mem=0", "--gres=gpu:1"]
    assert replica_starts(sub) == [
        [str(k), "--nodes=1", "--ntasks=1", f"--relative={k // 2}", "--distribution=block", *share] for k in range(4)
    ]
    assert "STEP_CPUS=$(( ${SLURM_CPUS_ON_NODE:-2} / 2 ))" in sub
    fixed = gpu_spec(tmp_path, tp=1, slurm={"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 6}, replicas=4)
    sub = R.render_scripts(fixed, tmp_path / "d")[R.SUB_NAME]
    assert "--cpus-per-task=6" in replica_starts(sub)[0] and "STEP_CPUS" not in sub


def test_optional_directives_absent_when_unset(tmp_path):
    sub = R.render_scripts(cpu_spec(tmp_path), tmp_path / "d")[R.SUB_NAME]
    header = sbatch_header(sub)
    assert not any(
        re.match(r"#SBATCH (-A|-p|--qos|--gres|--mem|--exclusive|--constraint|--reservation)", h) for h in header
    ), header
    assert "#SBATCH --ntasks-per-node=1" in header and "#SBATCH --time=01:00:00" in header
    assert "module load" not in sub and "nvidia-smi" not in sub


def test_clock_lock_only_when_set(tmp_path):
    spec = gpu_spec(tmp_path, slurm={"gpu_clocks_mhz": 1410})
    sub = R.render_scripts(spec, tmp_path / "d")[R.SUB_NAME]
    assert "srun --ntasks-per-node=1 sudo nvidia-smi -lgc 1410,1410" in sub.splitlines()
    # the lock runs before the server step
    assert sub.index("nvidia-smi -lgc") < sub.index("srun --mpi=pmix")


def test_modules_setup_and_gres_override(tmp_path):
    spec = gpu_spec(
        tmp_path,
        slurm={
            "modules": ["cuda/12.4", "apptainer"],
            "setup": ["echo hi > /dev/null"],
            "gres": "gpu:a100:2",
            "reservation": "resv",
        },
    )
    sub = R.render_scripts(spec, tmp_path / "d")[R.SUB_NAME]
    lines = sub.splitlines()
    assert "module load cuda/12.4" in lines and "module load apptainer" in lines
    assert "echo hi > /dev/null" in lines
    assert "#SBATCH --gres=gpu:a100:2" in lines and "#SBATCH --gres=gpu:2" not in lines
    assert "#SBATCH --reservation=resv" in lines


def test_pyxis_container_flags(tmp_path):
    (tmp_path / "data").mkdir()
    spec = gpu_spec(
        tmp_path,
        container={
            "type": "pyxis",
            "image": "nvcr.io#nvidia/tritonserver:24.08",
            "mounts": [f"{tmp_path / 'data'}:/data:ro"],
            "workdir": "/work",
            "name": "trt",
            "python": "/usr/bin/python3",
        },
    )
    d = tmp_path / "d"
    scripts = R.render_scripts(spec, d)
    argv = srun_argv(scripts[R.SUB_NAME])
    assert "--container-image=nvcr.io#nvidia/tritonserver:24.08" in argv
    assert "--container-workdir=/work" in argv and "--container-name=trt" in argv
    mounts = [a for a in argv if a.startswith("--container-mounts=")]
    assert len(mounts) == 1
    assert mounts[0].removeprefix("--container-mounts=").split(",") == [
        f"{tmp_path / 'data'}:/data:ro",
        f"{d}:{d}",  # the code ships in d/python: no install mounted
        f"{tmp_path / 'models' / 'engine'}:{tmp_path / 'models' / 'engine'}",
        f"{tmp_path / 'models' / 'tok'}:{tmp_path / 'models' / 'tok'}",
    ]
    assert "apptainer" not in argv
    assert scripts[R.SH_NAME].splitlines()[-1] == f"exec /usr/bin/python3 -m launcher {d}"


def test_model_folder_under_a_same_path_mount_is_not_mounted_twice(tmp_path):
    spec = gpu_spec(tmp_path, container={"type": "pyxis", "image": "img", "mounts": [str(tmp_path / "models")]})
    argv = srun_argv(R.render_scripts(spec, tmp_path / "d")[R.SUB_NAME])
    mounts = next(a for a in argv if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert mounts[0] == str(tmp_path / "models")
    assert not any("engine" in m or "/tok" in m for m in mounts), mounts


def test_apptainer_wrapper(tmp_path):
    image = tmp_path / "img.sif"
    image.write_text("")
    spec = gpu_spec(tmp_path, container={"type": "apptainer", "image": str(image), "workdir": "/w"})
    d = tmp_path / "d"
    scripts = R.render_scripts(spec, d)
    argv = srun_argv(scripts[R.SUB_NAME])
    start = argv.index("apptainer")
    engine, tok = tmp_path / "models" / "engine", tmp_path / "models" / "tok"
    assert argv[start:] == [
        "apptainer",
        "exec",
        "--nv",
        "-B",
        f"{d}:{d}",
        "-B",
        f"{engine}:{engine}",
        "-B",
        f"{tok}:{tok}",
        "--pwd",
        "/w",
        str(image),
        "bash",
        "$DEPLOY_DIR/tensorrt_llm_triton.sh",
    ]
    assert not any(a.startswith("--container-") for a in argv)
    assert scripts[R.SH_NAME].splitlines()[-1] == f"exec python3 -m launcher {d}"


def test_sh_exports_env_quoted_and_runs_the_launcher(tmp_path):
    spec = cpu_spec(tmp_path, slurm={"env": {"NCCL_DEBUG": "WARN", "WITH_SPACE": "a b"}})
    sh = R.render_scripts(spec, tmp_path / "d")[R.SH_NAME]
    lines = sh.splitlines()
    assert not any("PMIX_MCA_gds" in line for line in lines), "launch.json's env, applied by the launcher"
    assert "export NCCL_DEBUG=WARN" in lines and "export WITH_SPACE='a b'" in lines
    assert f'export PYTHONPATH={shlex.quote(str(tmp_path / "d" / "python"))}"${{PYTHONPATH:+:$PYTHONPATH}}"' in lines
    assert lines[-1] == f"exec {shlex.quote(sys.executable)} -m launcher {tmp_path / 'd'}"
    assert "set -euo pipefail" in lines


# ------------------------------------------------------------------------------ re-render and failures
def test_rerender_keeps_jobs_and_replaces_the_repository(tmp_path):
    d = tmp_path / "d"
    R.render(cpu_spec(tmp_path), d)
    job = JobPaths(d, "123")
    job.folder.mkdir()
    job.rank_log(0).write_text("log")
    job.deployment.sbatch_log("out", "123").write_text("out")
    (job.deployment.model_repository / "stale").mkdir()
    R.render(cpu_spec(tmp_path, triton={"triton_max_batch_size": 7}), d)
    assert job.rank_log(0).read_text() == "log"
    assert job.deployment.sbatch_log("out", "123").read_text() == "out"
    assert not (d / "triton_model_repo" / "stale").exists()
    assert parse_pbtxt(d / "triton_model_repo" / "tensorrt_llm" / "config.pbtxt").max_batch_size == 7
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".d.")] == []


def test_render_never_deletes_a_folder_it_did_not_write(tmp_path):
    d = tmp_path / "d"
    (d / "triton_model_repo").mkdir(parents=True)
    (d / "triton_model_repo" / "my-notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an hpc-serve model repository"):
        R.render(cpu_spec(tmp_path), d)
    assert (d / "triton_model_repo" / "my-notes.txt").read_text() == "mine"
    assert sorted(p.name for p in d.iterdir()) == ["triton_model_repo"]  # nothing half-written beside it


def _boom(*args, **kwargs):
    raise RuntimeError("disk full")


def test_failed_render_leaves_no_deployment_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(backend.repository, "write_model_repository", _boom)
    with pytest.raises(RuntimeError, match="disk full"):
        R.render(cpu_spec(tmp_path), tmp_path / "out" / "d")
    assert list((tmp_path / "out").iterdir()) == []  # neither d nor a staging sibling


def test_failed_rerender_keeps_the_previous_deployment(tmp_path, monkeypatch):
    d = tmp_path / "d"
    R.render(cpu_spec(tmp_path), d)
    before = {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()}
    monkeypatch.setattr(backend.repository, "write_model_repository", _boom)
    with pytest.raises(RuntimeError):
        R.render(cpu_spec(tmp_path, triton={"triton_max_batch_size": 7}), d)
    after = {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "d"]


@pytest.mark.parametrize("name", ["my deploy", "d$x", "d'q", "d;x"])
def test_unsafe_deployment_folder_is_refused(tmp_path, name):
    with pytest.raises(ValueError, match="#SBATCH -o"):
        R.render(cpu_spec(tmp_path), tmp_path / name)
    assert not (tmp_path / name).exists()


def test_deployment_folder_with_a_trailing_newline_is_refused(tmp_path):
    with pytest.raises(ValueError):
        R.render(cpu_spec(tmp_path), str(tmp_path / "d") + "\n")


# ------------------------------------------------------------------------------------------ CLI render
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "hpc.cli.main", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )


@pytest.mark.slow
def test_cli_render_with_site_template(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "spec.yaml").write_text(
        "name: site\nmodel:\n  backend: cpu\n  checkpoint_dir: ckpt\n  workflow: engine\n"
    )
    site = tmp_path / "site"
    site.mkdir()
    (site / "tensorrt_llm_triton.sh.j2").write_text(
        "#!/bin/bash\n# SITE TEMPLATE for {{ spec.name }}\nexec {{ python | q }} -m launcher {{ deploy_dir | q }}\n"
    )
    result = _cli("render", "spec.yaml", "-o", "d", "--templates", str(site), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    sh = (tmp_path / "d" / "tensorrt_llm_triton.sh").read_text()
    assert sh.startswith("#!/bin/bash\n# SITE TEMPLATE for site\n")
    sub = (tmp_path / "d" / "tensorrt_llm_triton.sub").read_text()
    assert "SITE TEMPLATE" not in sub and "srun --mpi=pmix" in sub  # the other file: the default template
    # without --templates the default per-rank script comes back
    assert _cli("render", "spec.yaml", "-o", "d", cwd=tmp_path).returncode == 0
    assert "SITE TEMPLATE" not in (tmp_path / "d" / "tensorrt_llm_triton.sh").read_text()


@pytest.mark.slow
def test_a_site_sbatch_header_shapes_every_job_script(tmp_path):
    """The three job scripts print their #SBATCH lines (hpc/render/sbatch.py's) with one macro
    (hpc/render/templates/_sbatch.j2): a site's copy of that file with one more line changes the serving, gateway
    and build scripts alike."""
    (tmp_path / "spec.yaml").write_text(
        "name: site\nslurm: {nodes: 1}\nmodel: {backend: cpu, workflow: engine, checkpoint_dir: ckpt, init: {family: gpt2}}\n"
        "gateway: {}\nbuild: {output_dir: engines}\n"
    )
    site = tmp_path / "site"
    site.mkdir()
    default = (R.DEFAULT_TEMPLATES / "_sbatch.j2").read_text()
    printed = "{% for line in lines %}{{ line }}\n{% endfor %}"
    assert default.count(printed) == 1
    (site / "_sbatch.j2").write_text(default.replace(printed, printed + "#SBATCH --comment=site-header\n"))
    scripts = (R.SUB_NAME, R.GATEWAY_SUB_NAME, BUILD_SUB_NAME)
    result = _cli("render", "spec.yaml", "-o", "d", "--templates", str(site), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in scripts:
        lines = (tmp_path / "d" / name).read_text().splitlines()
        header = lines[: lines.index("#SBATCH --comment=site-header")]
        assert header[-1].startswith("#SBATCH ") and "#SBATCH -J site" in "\n".join(header), name
    assert _cli("render", "spec.yaml", "-o", "d", cwd=tmp_path).returncode == 0
    for name in scripts:
        assert "site-header" not in (tmp_path / "d" / name).read_text(), name


@pytest.mark.slow
def test_cli_render_bad_spec_and_bad_folder_exit_2(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "spec.yaml").write_text(
        "name: x\nmodel:\n  backend: cpu\n  checkpoint_dir: ckpt\n  workflow: engine\n  tp_szie: 2\n"
    )
    bad = _cli("render", "spec.yaml", "-o", "d", cwd=tmp_path)
    assert bad.returncode == 2 and "spec.yaml:6: model.tp_szie:" in bad.stderr
    assert not (tmp_path / "d").exists()
    (tmp_path / "spec.yaml").write_text("name: x\nmodel:\n  backend: cpu\n  checkpoint_dir: ckpt\n  workflow: engine\n")
    spaced = _cli("render", "spec.yaml", "-o", "my d", cwd=tmp_path)
    assert spaced.returncode == 2 and "#SBATCH -o" in spaced.stderr
    assert not (tmp_path / "my d").exists()


# ------------------------------------------------------------------------------------ model repository
@pytest.mark.parametrize("kind", ["cpu", "tensorrtllm"])
def test_every_config_pbtxt_parses_and_has_no_placeholders(tmp_path, kind):
    if kind == "cpu":
        spec = cpu_spec(
            tmp_path,
            model={"tp_size": 1},
            triton={"max_tokens_in_paged_kv_cache": 4096, "parameters": {"enable_chunked_context": True}},
        )
    else:
        spec = gpu_spec(
            tmp_path, triton={"decoupled": False, "triton_max_batch_size": 32, "max_attention_window_size": 2560}
        )
    out = R.render(spec, tmp_path / "d")
    configs = sorted(out.model_repository.glob("*/config.pbtxt"))
    assert {c.parent.name for c in configs} == MODELS
    parsed = {}
    for path in configs:
        text = path.read_text()
        assert "${" not in text, path
        parsed[path.parent.name] = parse_pbtxt(path)
        assert parsed[path.parent.name].name == path.parent.name
    trt = parsed["tensorrt_llm"]
    assert trt.backend == ("python" if kind == "cpu" else "tensorrtllm")
    assert trt.parameters["gpt_model_path"].string_value == str(spec.model.source_dir)
    assert parsed["preprocessing"].parameters["tokenizer_dir"].string_value == str(spec.model.tokenizer)
    if kind == "cpu":
        assert trt.max_batch_size == 64
        assert trt.model_transaction_policy.decoupled is True
        assert trt.parameters["max_tokens_in_paged_kv_cache"].string_value == "4096"
        assert trt.parameters["enable_chunked_context"].string_value == "true"
    else:
        assert trt.max_batch_size == 32
        assert trt.model_transaction_policy.decoupled is False
        assert trt.parameters["max_attention_window_size"].string_value == "2560"


def test_deployment_folder_with_comma_is_refused_only_with_a_container(tmp_path):
    with pytest.raises(ValueError, match="','"):
        R.render(cpu_spec(tmp_path, container={"type": "pyxis", "image": "img"}), tmp_path / "a,b")
    assert not (tmp_path / "a,b").exists()
    assert R.render(cpu_spec(tmp_path), tmp_path / "a,b").deploy_dir == tmp_path / "a,b"


@pytest.mark.slow
def test_submit_dry_run_prints_the_scripts_and_writes_nothing(tmp_path, monkeypatch):
    """Like dask-jobqueue's job_script(): see exactly what would run, before spending an allocation."""
    import os
    import subprocess
    import sys

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"num_attention_heads": 4}')
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: dry\nworkdir: {tmp_path}/runs\nmodel:\n  backend: cpu\n  checkpoint_dir: {ckpt}\n  workflow: engine\n"
    )
    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-m", "hpc.cli.main", "submit", str(spec), "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "HPC_SERVE_HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH -J dry" in proc.stdout and "srun --mpi=pmix" in proc.stdout
    assert "-m launcher" in proc.stdout
    assert not (tmp_path / "runs").exists() and not home.exists()


# ------------------------------------------------------------- render is a preview: no model is created
INIT_SPEC = (
    "name: init-test\nworkdir: runs\nmodel:\n  backend: cpu\n  checkpoint_dir: models/tiny\n  workflow: engine\n"
    "  init: {family: gpt2, size: tiny, seed: 3}\n"
)


def fake_sbatch(tmp: Path) -> tuple[dict, Path]:
    """An environment whose `sbatch` records its arguments (so a test sees whether anything was submitted)
    and whose job index is private to the test."""
    bin_dir, calls = tmp / "bin", tmp / "sbatch-calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/bash\necho "$@" >> {calls}\necho 4242\n')
    (bin_dir / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HPC_SERVE_HOME": str(tmp / "hs")}
    return env, calls


def test_render_writes_the_scripts_but_creates_no_checkpoint(tmp_path):
    spec = parse_spec(INIT_SPEC, file="s.yaml", base=tmp_path)
    out = R.render(spec, tmp_path / "d")
    assert out.sub.is_file() and out.launch.is_file() and (out.model_repository / "tensorrt_llm").is_dir()
    assert not (tmp_path / "models").exists(), "render created the checkpoint (model creation is an explicit step)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # render wrote into the deployment folder only


def _hpc_serve(*args: str, env: dict, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpc.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        timeout=timeout,
    )


@pytest.mark.slow
def test_cli_render_and_dry_run_create_nothing_and_say_what_will(tmp_path):
    (tmp_path / "s.yaml").write_text(INIT_SPEC)
    env, calls = fake_sbatch(tmp_path)
    rendered = _hpc_serve("render", "s.yaml", "-o", "d", env=env, cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    ckpt = tmp_path / "models" / "tiny"
    command = f"hpc-serve init-model {ckpt} --family gpt2 --size tiny --weights-seed 3"
    assert "`hpc-serve submit` creates it" in rendered.stderr and command in rendered.stderr
    assert f"submit with: {command} && sbatch {tmp_path / 'd' / R.SUB_NAME}" in rendered.stdout
    dry = _hpc_serve("submit", "s.yaml", "--dry-run", env=env, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH -J init-test" in dry.stdout and command in dry.stderr
    assert not (tmp_path / "models").exists(), "a preview created the checkpoint"
    assert not calls.exists() and not (tmp_path / "runs").exists() and not (tmp_path / "hs").exists()
    # The command the note gives is the explicit step, and it works as printed.
    made = _hpc_serve(*command.split()[1:], env=env, timeout=120)
    assert made.returncode == 0, made.stderr
    assert (ckpt / "config.json").is_file() and (ckpt / "tokenizer.json").is_file()
    again = _hpc_serve("render", "s.yaml", "-o", "d", env=env, cwd=tmp_path)
    assert "note:" not in again.stderr and f"submit with: sbatch {tmp_path / 'd' / R.SUB_NAME}" in again.stdout


def test_submit_creates_the_checkpoint_then_submits(tmp_path, monkeypatch):
    from hpc.jobs.submit import submit

    env, calls = fake_sbatch(tmp_path)
    for name in ("PATH", "HPC_SERVE_HOME"):
        monkeypatch.setenv(name, env[name])
    spec = parse_spec(INIT_SPEC, file="s.yaml", base=tmp_path)
    ref = submit(spec, executor="slurm")
    ckpt = tmp_path / "models" / "tiny"
    assert (ckpt / "config.json").is_file() and (ckpt / "tokenizer.json").is_file()
    assert ref.job_id == "4242"
    assert calls.read_text().split() == ["--parsable", str(ref.job_dir.parent.parent / R.SUB_NAME)]


@pytest.mark.slow
def test_cli_render_previews_a_spec_whose_model_folders_do_not_exist_yet(tmp_path):
    """`render` shows the scripts before the engine is built; validate still refuses the spec."""
    (tmp_path / "spec.yaml").write_text("name: x\nmodel:\n  backend: cpu\n  checkpoint_dir: nope\n  workflow: engine\n")
    result = _cli("render", "spec.yaml", "-o", "d", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"note: spec.yaml:4: model.checkpoint_dir: {tmp_path / 'nope'} does not exist" in result.stderr
    assert (tmp_path / "d" / R.SUB_NAME).is_file() and not (tmp_path / "nope").exists()
    assert _cli("validate", "spec.yaml", cwd=tmp_path).returncode == 2


@pytest.mark.slow
def test_the_subs_stop_asks_the_launchers_first(tmp_path):
    """The .sub's ordered stop (Slurm's time-limit USR1, a TERM to the batch shell, a failed replica under
    fail-job) writes the job's stop request, the file every launcher watches (launcher/contracts/layout.py's name), and
    signals the steps with `scancel --signal=TERM` only when no leader started its stop within STOP_ACK_S: a
    signal from Slurm reaches tritonserver itself before its model drained. Run for real in bash, with a
    `scancel` on PATH that records its arguments."""
    from launcher.contracts.config import STOP_ACK_S

    sub = R.render_scripts(cpu_spec(tmp_path), tmp_path / "d")[R.SUB_NAME]
    function = re.search(r"^stop_job\(\) \{\n.*?^\}\n", sub, re.M | re.S)
    assert function is not None, sub
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text('#!/bin/bash\necho "$@" >>"$SCANCEL_LOG"\n')
    (bin_dir / "scancel").chmod(0o755)

    def stop(job: str, leader_stops: bool) -> subprocess.Popen:
        paths = JobPaths(tmp_path / "d", job).create()
        if leader_stops:  # the leader's launcher answers the request at once
            StopNotice(signal="SIGTERM", at=time.time(), drain_until=time.time() + 10).write(paths.stopping(0))
        script = f"set -euo pipefail\nJOB_ID={job}\nJOB_DIR={shlex.quote(str(paths.folder))}\n{function.group(0)}stop_job\nwait\n"
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
        env["SCANCEL_LOG"] = str(tmp_path / f"scancel-{job}")
        return subprocess.Popen(["bash", "-c", script], env=env)

    answered, silent = stop("7", leader_stops=True), stop("8", leader_stops=False)
    assert answered.wait(STOP_ACK_S + 10) == 0 and silent.wait(STOP_ACK_S + 10) == 0
    for job in ("7", "8"):
        request = StopRequest.read(JobPaths(tmp_path / "d", job).stop_request)  # the record, as the trap wrote it
        assert request is not None and request.by == BY_TIME_LIMIT and time.time() - 60 < request.at <= time.time()
        assert not JobPaths(tmp_path / "d", job).cancel_marker.exists()  # the job was not cancelled: COMPLETED
    assert not (tmp_path / "scancel-7").exists()
    assert (tmp_path / "scancel-8").read_text().split() == ["--signal=TERM", "8"]


def test_one_module_writes_sbatch_lines():
    """Every job's #SBATCH lines come from hpc/render/sbatch.py (`SbatchOptions.lines`): no other module has a
    string that starts one, and the templates only print the lines they are given (outside their comments)."""
    import ast

    root = Path(R.__file__).resolve().parents[2]
    writers = set()
    for top in ("hpc", "launcher", "backend"):
        for path in (root / top).rglob("*.py"):
            tree = ast.parse(path.read_text())
            # a spec field's description names the option it sets (text, not a line of a script)
            described = {id(k.value) for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg == "description"}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in described:
                    if any(line.lstrip().startswith("#SBATCH ") for line in node.value.splitlines()):
                        writers.add(str(path.relative_to(root)))
                elif isinstance(node, ast.JoinedStr) and node.values:
                    first = node.values[0]
                    if isinstance(first, ast.Constant) and str(first.value).startswith("#SBATCH"):
                        writers.add(str(path.relative_to(root)))
    assert writers == {"hpc/render/sbatch.py"}, writers
    for template in R.DEFAULT_TEMPLATES.glob("*.j2"):
        code = re.sub(r"\{#.*?#\}", "", template.read_text(), flags=re.S)
        assert "#SBATCH" not in code, template.name
