"""The `build:` section (hpc/spec/build.py), the build plan and its cache (hpc/jobs/build_plan.py,
launcher/jobscript/build_record.py), sharded CPU checkpoints (backend/cpu_engine/shards.py) and the engine checks of
`validate` (hpc/spec/files.py engine_limit_conflicts). The build job itself runs in tests/test_build_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from backend.cpu_engine.checkpoint import CheckpointError, load_config
from backend.cpu_engine.model import TransformerShard
from backend.cpu_engine.shards import _Place, write_sharded
from backend.cpu_engine.tensors import ShardedWeights, load_weights
from hpc.jobs.build_plan import plan_build, served_spec
from hpc.jobs.build_script import build_steps, write_build
from hpc.jobs.local_run import LocalState
from hpc.spec import SpecError, load_spec
from hpc.spec.files import context_length
from launcher.contracts.build_records import BuildStep
from launcher.contracts.layout import BUILD_RECORD_NAME, Deployment
from launcher.contracts.rank import JOB_ID_ENV
from launcher.jobscript.build_record import checkpoint_identity, finish


def write(folder: Path, body: str, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return [str(p) for p in err.value.problems]


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


GPU = """
name: llama-build
slurm: {nodes: 1, gpus_per_node: 4}
model: {backend: tensorrtllm, tokenizer_dir: hf, tp_size: 4}
build:
  checkpoint_dir: hf
  convert_script: /app/tensorrt_llm/examples/llama/convert_checkpoint.py
"""

CPU = """
name: cpu-build
slurm: {nodes: 2, ntasks_per_node: 1}
model: {backend: cpu, checkpoint_dir: ckpt, tp_size: 2, init: {family: gpt2}}
build: {}
"""


@pytest.fixture
def gpu_dir(tmp_path: Path) -> Path:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return tmp_path


# ---------------------------------------------------------------- the section


def test_a_build_section_replaces_engine_dir(gpu_dir):
    spec = load_spec(write(gpu_dir, GPU))
    assert spec.build is not None and spec.model.engine_dir is None
    assert spec.build.checkpoint_dir == gpu_dir / "hf" and spec.build.output_dir == gpu_dir / "engines"
    assert spec.build.plugin_flags()["kv_cache_type"] == "paged"


def test_tensorrtllm_without_engine_dir_or_build_names_both(gpu_dir):
    path = write(
        gpu_dir, GPU.split("build:")[0].replace("backend: tensorrtllm,", "backend: tensorrtllm, workflow: engine,")
    )
    (found,) = problems(path)
    assert found.startswith(f"{path}:{line_of(path, 'model:')}: model.engine_dir: ")
    assert "or a build: section" in found


@pytest.mark.parametrize(
    ("extra", "needle", "field", "words"),
    [
        ("  plugins: {gemm_plugn: auto}", "gemm_plugn", "build.plugins.gemm_plugn", "did you mean 'gemm_plugin'?"),
        ("  quantization: int3", "quantization", "build.quantization", "int4_awq"),
        ("  max_seq_len: 512\n  max_input_len: 1024", "max_input_len", "build.max_input_len", "raise max_seq_len"),
        ("  kv_cache_dtype: fp8", "build:", "build.quantization", "set quantization"),
        ("  time: 2:00:00", "time:", "build.time", "quote the time"),
        ("  max_batch: 64", "max_batch", "build.max_batch", "did you mean 'max_batch_size'?"),
    ],
)
def test_build_problems_name_the_field_and_the_fix(gpu_dir, extra, needle, field, words):
    path = write(gpu_dir, GPU + extra + "\n")
    found = problems(path)
    assert len(found) == 1, found
    assert found[0].startswith(f"{path}:{line_of(path, needle)}: {field}: "), found
    assert words in found[0]


def test_engine_dir_and_build_together_are_refused(gpu_dir):
    path = write(gpu_dir, GPU.replace("tokenizer_dir: hf,", "tokenizer_dir: hf, engine_dir: hf,"))
    (found,) = problems(path)
    assert "model.engine_dir: with a build: section the engine is the build's output" in found


def test_tensorrtllm_build_needs_a_convert_script_or_quantization(gpu_dir):
    path = write(gpu_dir, GPU.replace("  convert_script: /app/tensorrt_llm/examples/llama/convert_checkpoint.py\n", ""))
    (found,) = problems(path)
    assert "build.convert_script: give the convert_checkpoint.py" in found
    write(
        gpu_dir,
        GPU.replace("convert_script: /app/tensorrt_llm/examples/llama/convert_checkpoint.py", "quantization: int4_awq"),
    )
    load_spec(gpu_dir / "spec.yaml")


def test_cpu_build_refuses_tensorrtllm_options(tmp_path):
    path = write(tmp_path, CPU.replace("build: {}", "build: {quantization: int4_awq}"))
    (found,) = problems(path)
    assert "build.quantization: is for backend tensorrtllm" in found


def test_missing_build_checkpoint_is_named(tmp_path):
    path = write(tmp_path, GPU)
    found = problems(path)
    assert any(
        f":{line_of(path, 'checkpoint_dir')}: build.checkpoint_dir: " in p and "does not exist" in p for p in found
    )


# ---------------------------------------------------------------- plan, cache, record


def _finish(spec, plan, deploy: Path, built: Path) -> Path:
    """What the build job's last step does, here: record `built` and move it into place."""
    write_build(spec, plan, deploy)
    return finish(Deployment(deploy).build_request, built)


def test_cpu_plan_is_stable_and_a_created_checkpoint_hits_the_cache(tmp_path):
    spec = load_spec(write(tmp_path, CPU))
    plan = plan_build(spec)
    assert plan.cached is None and plan.inputs == {"init": {"family": "gpt2", "size": "tiny", "seed": 0}}
    assert plan_build(spec).engine_dir == plan.engine_dir  # the same spec, the same folder
    assert not (tmp_path / "ckpt").exists()  # planning creates nothing
    # the job: create the checkpoint, shard it, record it (after the checkpoint exists)
    from backend.cpu_engine.init_model import create_checkpoint

    create_checkpoint(tmp_path / "ckpt", family="gpt2", size="tiny", seed=0)
    write_sharded(tmp_path / "ckpt", tmp_path / "engines" / ".staging", 2)
    engine = _finish(spec, plan, tmp_path / "deploy", tmp_path / "engines" / ".staging")
    assert engine == plan.engine_dir and (engine / BUILD_RECORD_NAME).is_file()
    record = json.loads((engine / BUILD_RECORD_NAME).read_text())
    assert record["inputs"] == checkpoint_identity(tmp_path / "ckpt")
    again = plan_build(load_spec(tmp_path / "spec.yaml"))  # the checkpoint exists now: its files identify it
    assert again.inputs != plan.inputs and again.cached == engine
    served = served_spec(spec, again.served_dir)
    assert served.model.checkpoint_dir == engine and served.model.init is None and served.build is None


def test_a_changed_spec_or_checkpoint_builds_into_a_new_folder(tmp_path):
    from backend.cpu_engine.init_model import create_checkpoint

    create_checkpoint(tmp_path / "ckpt", family="gpt2", size="tiny", seed=0)
    spec = load_spec(write(tmp_path, CPU))
    plan = plan_build(spec)
    write_sharded(tmp_path / "ckpt", tmp_path / "engines" / ".s1", 2)
    engine = _finish(spec, plan, tmp_path / "d1", tmp_path / "engines" / ".s1")
    stamp = (engine / "rank0.safetensors").stat().st_mtime_ns
    tp1 = load_spec(write(tmp_path, CPU.replace("tp_size: 2", "tp_size: 1").replace("nodes: 2", "nodes: 1")))
    other = plan_build(tp1)
    assert other.cached is None and other.engine_dir != engine
    (tmp_path / "ckpt" / "config.json").write_text((tmp_path / "ckpt" / "config.json").read_text() + "\n")
    edited = plan_build(load_spec(write(tmp_path, CPU)))
    assert edited.cached is None and edited.engine_dir not in (engine, other.engine_dir)
    # a second build of a request whose engine exists keeps the existing folder untouched
    write_sharded(tmp_path / "ckpt", tmp_path / "engines" / ".s2", 2)
    assert _finish(spec, plan, tmp_path / "d2", tmp_path / "engines" / ".s2") == engine
    assert (engine / "rank0.safetensors").stat().st_mtime_ns == stamp
    assert not (tmp_path / "engines" / ".s2").exists()


def test_tensorrtllm_request_changes_with_every_engine_argument(gpu_dir):
    base = plan_build(load_spec(write(gpu_dir, GPU)))
    for extra in ("  max_input_len: 2048", "  plugins: {gemm_plugin: float16}", "  dtype: bfloat16"):
        changed = plan_build(load_spec(write(gpu_dir, GPU + extra + "\n")))
        assert changed.key != base.key, extra
    workers = plan_build(load_spec(write(gpu_dir, GPU + "  workers: 2\n")))
    assert workers.key == base.key  # how fast it builds does not change the engine


@pytest.mark.slow
def test_render_writes_the_build_script_and_creates_nothing(tmp_path, hpc_home):
    path = write(tmp_path, CPU)
    out = subprocess.run(
        [sys.executable, "-m", "hpc.cli.main", "render", str(path), "-o", str(tmp_path / "deploy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "sbatch --dependency=afterok:$BUILD --kill-on-invalid-dep=yes" in out.stdout
    assert (tmp_path / "deploy" / "build.sub").is_file()
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "engines").exists()
    check = subprocess.run(["bash", "-n", str(tmp_path / "deploy" / "build.sub")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    served = yaml.safe_load((tmp_path / "deploy" / "spec.yaml").read_text())
    assert served["build"] is None and served["model"]["checkpoint_dir"].startswith(str(tmp_path / "engines"))


def test_cpu_steps_create_the_checkpoint_only_when_missing(tmp_path):
    spec = load_spec(write(tmp_path, CPU))
    steps = build_steps(spec, plan_build(spec), tmp_path / "deploy")
    assert [s["name"] for s in steps] == ["init-model", "shard", "record"]
    assert steps[0]["unless"] == f"{tmp_path / 'ckpt'}/config.json"
    assert steps[1]["argv"][-3:] == ["$STAGING/engine", "--tp", "2"]


# ---------------------------------------------------------------- sharded checkpoints


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_sharded_checkpoint_computes_what_the_whole_one_does(tmp_path, family):
    from backend.cpu_engine.init_model import create_checkpoint

    whole = Path(create_checkpoint(tmp_path / family, family=family, size="tiny", seed=1))
    write_sharded(whole, tmp_path / "tp2", 2)
    names = sorted(os.listdir(tmp_path / "tp2"))
    assert "rank0.safetensors" in names and "rank1.safetensors" in names and "tokenizer.json" in names
    assert json.loads((tmp_path / "tp2" / "config.json").read_text())["mapping"]["tp_size"] == 2
    sharded = load_weights(tmp_path / "tp2")
    assert isinstance(sharded, ShardedWeights) and len(sharded) == 0  # nothing read until a rank asks
    config, full = load_config(whole), load_weights(whole)
    for rank in range(2):
        a = TransformerShard(config, full, comm=_Place(2, rank))
        b = TransformerShard(load_config(tmp_path / "tp2"), sharded, comm=_Place(2, rank))
        ta, tb = a.rank_tensors(), b.rank_tensors()
        assert ta.keys() == tb.keys()
        assert all(np.array_equal(ta[k], tb[k]) for k in ta)
    # one rank whole: the logits of a sharded tp 1 folder equal the whole checkpoint's
    write_sharded(whole, tmp_path / "tp1", 1)
    tokens = np.array([1, 5, 9, 3], dtype=np.int64)
    got = TransformerShard(config, load_weights(tmp_path / "tp1"), max_slots=1).prefill(0, tokens)
    want = TransformerShard(config, full, max_slots=1).prefill(0, tokens)
    assert got is not None and want is not None and np.allclose(got, want, atol=1e-5)


def test_a_sharded_checkpoint_refuses_another_tp_size(tmp_path, tiny_gpt2):
    write_sharded(tiny_gpt2, tmp_path / "tp2", 2)
    with pytest.raises(CheckpointError, match="sharded for tp_size 2, but the model runs with tp_size 4"):
        TransformerShard(load_config(tmp_path / "tp2"), load_weights(tmp_path / "tp2"), comm=_Place(4, 0))


@pytest.mark.slow
def test_sharding_cli_refuses_an_existing_folder(tmp_path, tiny_gpt2):
    (tmp_path / "out").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "backend.cpu_engine.shards", str(tiny_gpt2), str(tmp_path / "out"), "--tp", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "shards:" in proc.stderr


# ---------------------------------------------------------------- engine checks (validate)

#: an engine's config.json as trtllm-build (TensorRT-LLM 0.12) writes it: EngineConfig.to_dict() of
#: tensorrt_llm/builder.py, `mapping` from tensorrt_llm/mapping.py Mapping.to_dict(); gpus_per_node left at
#: trtllm-build's default of 8
ENGINE_CONFIG = {
    "version": "0.12.0",
    "pretrained_config": {
        "architecture": "LlamaForCausalLM",
        "dtype": "float16",
        "vocab_size": 128256,
        "hidden_size": 8192,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "mapping": {
            "world_size": 8,
            "gpus_per_node": 8,
            "cp_size": 1,
            "tp_size": 4,
            "pp_size": 2,
            "moe_tp_size": 4,
            "moe_ep_size": 1,
        },
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    },
    "build_config": {
        "max_input_len": 2048,
        "max_seq_len": 4096,
        "opt_batch_size": 8,
        "max_batch_size": 32,
        "max_beam_width": 1,
        "max_num_tokens": 8192,
        "opt_num_tokens": None,
        "max_prompt_embedding_table_size": 0,
        "kv_cache_type": "PAGED",
        "gather_context_logits": False,
        "gather_generation_logits": False,
        "plugin_config": {"gpt_attention_plugin": "auto", "gemm_plugin": "auto", "remove_input_padding": True},
    },
}

SERVE_70B = """
name: llama70b
slurm: {nodes: 2, gpus_per_node: 4}
model: {backend: tensorrtllm, engine_dir: engine, tokenizer_dir: hf, tp_size: 4, pp_size: 2}
triton: {triton_max_batch_size: 32}
"""


def engine_dir(folder: Path, **changes) -> Path:
    config = json.loads(json.dumps(ENGINE_CONFIG))
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        target = config["pretrained_config"]["mapping"] if section == "mapping" else config[section]
        target[key] = value
    (folder / "engine").mkdir(exist_ok=True)
    (folder / "engine" / "config.json").write_text(json.dumps(config, indent=4))
    (folder / "hf").mkdir(exist_ok=True)
    return folder / "engine"


def test_an_engine_built_for_8_gpus_per_node_is_refused_on_4_gpu_nodes(tmp_path):
    engine_dir(tmp_path)
    path = write(tmp_path, SERVE_70B)
    (found,) = problems(path)
    assert found.startswith(f"{path}:{line_of(path, 'slurm:')}: slurm.gpus_per_node: ")
    assert "mapping.gpus_per_node is 8, but the job runs 4 ranks per node" in found
    assert "GPU r % 8" in found and "build with trtllm-build --gpus_per_node 4 (then serve that engine)" in found
    engine_dir(tmp_path, mapping__gpus_per_node=4)
    load_spec(path)  # rebuilt with --gpus_per_node 4: fine


def test_one_node_engines_with_the_default_mapping_are_fine(tmp_path):
    engine_dir(tmp_path, mapping__tp_size=2, mapping__pp_size=1, mapping__world_size=2)
    load_spec(
        write(
            tmp_path,
            SERVE_70B.replace("nodes: 2", "nodes: 1")
            .replace("pp_size: 2", "pp_size: 1")
            .replace("tp_size: 4", "tp_size: 2")
            .replace("gpus_per_node: 4", "gpus_per_node: 2"),
        )
    )


@pytest.mark.parametrize(
    ("triton", "field", "words"),
    [
        ("triton_max_batch_size: 64", "triton.triton_max_batch_size", "64 is more than the engine in"),
        ("max_tokens_in_paged_kv_cache: 2560", "triton.max_tokens_in_paged_kv_cache", "cannot hold one sequence"),
        ("max_attention_window_size: 8192", "triton.max_attention_window_size", "8192 is more than the engine in"),
    ],
)
def test_serving_limits_against_the_engines_build_limits(tmp_path, triton, field, words):
    engine_dir(tmp_path, mapping__gpus_per_node=4)
    keys = triton if triton.startswith("triton_max_batch_size") else f"triton_max_batch_size: 32, {triton}"
    path = write(tmp_path, SERVE_70B.replace("triton: {triton_max_batch_size: 32}", f"triton: {{{keys}}}"))
    (found,) = problems(path)
    assert f": {field}: " in found and words in found, found
    assert str(tmp_path / "engine") in found
    numbers = {
        "triton.triton_max_batch_size": "max_batch_size 32",
        "triton.max_tokens_in_paged_kv_cache": "max_seq_len 4096",
    }
    assert numbers.get(field, "max_seq_len 4096") in found


def test_legacy_engine_layout_limits(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "hf").mkdir()
    legacy = {
        "builder_config": {
            "tensor_parallel": 4,
            "pipeline_parallel": 2,
            "max_batch_size": 16,
            "max_input_len": 1024,
            "max_output_len": 1024,
        }
    }
    (tmp_path / "engine" / "config.json").write_text(json.dumps(legacy))
    (found,) = problems(write(tmp_path, SERVE_70B))
    assert "32 is more than the engine in" in found and "max_batch_size 16" in found


def test_the_context_length_the_gateway_reads_is_the_engines_or_the_checkpoints(tmp_path, tiny_gpt2):
    """What `finish_reason` "length" for a generation cut to the context hangs on: the engine's max_seq_len (new
    and legacy layouts), the CPU checkpoint's positions, None while the files do not say (not built yet)."""
    engine_dir(tmp_path, mapping__gpus_per_node=4)
    spec = load_spec(write(tmp_path, SERVE_70B))
    assert context_length(spec.model) == 4096
    legacy = {"builder_config": {"tensor_parallel": 4, "pipeline_parallel": 2, "max_input_len": 100}}
    (tmp_path / "engine" / "config.json").write_text(
        json.dumps(legacy | {"builder_config": legacy["builder_config"] | {"max_output_len": 28}})
    )
    assert context_length(spec.model) == 128
    (tmp_path / "engine" / "config.json").unlink()
    assert context_length(spec.model) is None, "an engine not built yet"
    cpu = spec.model.model_copy(update={"backend": "cpu", "engine_dir": None, "checkpoint_dir": tiny_gpt2})
    positions = json.loads((tiny_gpt2 / "config.json").read_text())["n_positions"]
    assert context_length(cpu) == positions
    assert context_length(cpu, max_seq_len=100) == 100, "llm_api.max_seq_len caps the llmapi workflow's"
    assert context_length(cpu, max_seq_len=10**6) == positions, "the CPU engine caps at the checkpoint's positions"
    assert context_length(cpu.model_copy(update={"checkpoint_dir": tmp_path / "none"})) is None


def test_with_a_build_section_the_checks_use_the_builds_arguments(gpu_dir):
    spec = GPU + "  max_seq_len: 2048\n"
    load_spec(write(gpu_dir, spec))
    path = write(gpu_dir, spec + "  gpus_per_node: 8\n")
    path.write_text(
        path.read_text()
        .replace("nodes: 1, gpus_per_node: 4", "nodes: 2, gpus_per_node: 4")
        .replace("tp_size: 4", "tp_size: 4, pp_size: 2")
    )
    (found,) = problems(path)
    assert "the build: section's mapping.gpus_per_node is 8" in found and "build with build.gpus_per_node 4" in found
    path = write(gpu_dir, spec + "  max_batch_size: 8\n")
    (found,) = problems(path)
    assert "triton.triton_max_batch_size: 64 is more than the build: section's max_batch_size 8" in found
    assert "build.max_batch_size" in found
    path = write(
        gpu_dir, spec.replace("name: llama-build", "name: llama-build\ntriton: {max_tokens_in_paged_kv_cache: 1024}")
    )
    (found,) = problems(path)
    assert "1024 tokens cannot hold one sequence of the build: section's max_seq_len 2048" in found


# ---------------------------------------------------------------- the local executor


@pytest.mark.slow
def test_local_build_then_cache_hit_and_a_failed_step(tmp_path, hpc_home):
    """`hpc-serve build --executor local` runs build.sub under the local supervisor (no srun) and waits for it."""
    path = write(tmp_path, CPU.replace("build: {}", "build: {output_dir: engines}"))

    def build() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "hpc.cli.main", "build", str(path), "--executor", "local"],
            capture_output=True,
            text=True,
            timeout=240,
        )

    first = build()
    assert first.returncode == 0, first.stdout + first.stderr
    engine = Path(first.stdout.split()[0])
    assert not list(engine.parent.glob(".building*")), "the job's end leaves no marker that it builds"
    assert engine.parent == tmp_path / "engines" and "built in" in first.stdout
    assert sorted(p.name for p in engine.glob("rank*")) == ["rank0.safetensors", "rank1.safetensors"]
    again = build()
    assert again.returncode == 0 and "is built already for this spec: nothing to build" in again.stdout
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"not a safetensors file")  # a changed checkpoint
    broken = build()
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "the build failed: " in broken.stderr and "step 1 (shard) failed with exit status 1" in broken.stderr
    assert "| " in broken.stderr  # the step's last lines
    assert not list(engine.parent.glob(".*")), "a failed build leaves neither its marker nor its staging folder"


def test_stale_building_markers_are_removed_and_a_live_one_is_waited_on(tmp_path, hpc_home):
    """A marker whose job ended without removing it (cancelled while pending), whose folder is gone, that is
    broken, or that has the name of builds rendered before: removed by the next reader. A building job's stays."""
    from hpc.jobs.build import _build_under_way
    from hpc.jobs.kinds import BuildJob
    from launcher.contracts.layout import OLD_BUILDING_MARKER_NAME, JobPaths, building_marker

    plan = plan_build(load_spec(write(tmp_path, CPU.replace("build: {}", "build: {output_dir: engines}"))))
    root = plan.engine_dir.parent
    root.mkdir()

    def job(job_id: str, state: str) -> JobPaths:
        paths = JobPaths(tmp_path / "d", job_id).create()
        BuildJob.mark(paths)
        LocalState(state=state, pid=os.getpid(), exit_code=1).write(paths.local_state)
        building_marker(root, plan.key, job_id).write_text(json.dumps({"job_id": job_id, "job_dir": str(paths.folder)}))
        return paths

    job("local-ended", "FAILED")
    building_marker(root, plan.key, "local-gone").write_text(
        json.dumps({"job_id": "x", "job_dir": str(tmp_path / "x")})
    )
    building_marker(root, plan.key, "local-broken").write_text("{")
    (root / OLD_BUILDING_MARKER_NAME.format(key=plan.key)).write_text(json.dumps({"job_id": "1", "job_dir": "/nope"}))
    other = building_marker(root, "0" * 12, "local-other")  # another engine's: not this reader's business
    other.write_text("{")
    assert _build_under_way(plan) is None
    assert sorted(p.name for p in root.iterdir()) == [other.name]
    live = job("local-live", "RUNNING")
    found = _build_under_way(plan)
    assert found is not None and (found.job_id, found.job_dir) == ("local-live", live.folder)
    assert building_marker(root, plan.key, "local-live").exists()


@pytest.mark.slow
def test_launch_spec_serves_the_built_engine_or_says_to_build_it(tmp_path, monkeypatch, tiny_gpt2):
    """`hpc-serve launch SPEC` inside an allocation: rank 0 renders the served engine, never an unbuilt one."""
    from hpc.cli.launch import deployment_for_spec

    for name in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "PMI_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    monkeypatch.setenv(JOB_ID_ENV, "local-launch")
    path = write(tmp_path, CPU.replace("ckpt", str(tiny_gpt2)).replace(", init: {family: gpt2}", ""))
    with pytest.raises(SystemExit, match="is not built yet .* hpc-serve build .* --wait"):
        deployment_for_spec(path)
    spec = load_spec(path)
    plan = plan_build(spec)
    write_sharded(tiny_gpt2, tmp_path / "engines" / ".staging", 2)
    engine = _finish(spec, plan, tmp_path / "d", tmp_path / "engines" / ".staging")
    deploy = deployment_for_spec(path)
    served = yaml.safe_load((deploy / "spec.yaml").read_text())
    assert served["model"]["checkpoint_dir"] == str(engine) and served["build"] is None


def test_the_older_paged_kv_cache_flag_replaces_kv_cache_type(gpu_dir):
    spec = load_spec(write(gpu_dir, GPU + "  plugins: {paged_kv_cache: true, tokens_per_block: 32}\n"))
    assert spec.build is not None
    flags = spec.build.plugin_flags()
    assert flags["paged_kv_cache"] == "enable" and "kv_cache_type" not in flags and flags["tokens_per_block"] == "32"


def test_build_job_status_lines(tmp_path, hpc_home):
    """What `status` says of a build job, from its folder: the failed step with its command and last lines."""
    from hpc.jobs.kinds import BuildJob
    from hpc.jobs.status import JobStatus
    from hpc.jobs.track import job_status
    from hpc.scheduler.index import JobRef
    from launcher.contracts.layout import JobPaths

    assert JobStatus("812", "PENDING", "Resources", kind="build").summary() == "812 PENDING (build; Resources)"
    deploy = tmp_path / "d"
    paths = JobPaths(deploy, "local-b1").create()
    BuildJob.mark(paths)
    paths.local_state.write_text(json.dumps({"state": "FAILED", "exit_code": 1, "pid": 1}))
    Deployment(deploy).build_request.write_text(
        json.dumps(
            {
                "steps": [
                    {"name": "convert", "command": "python3 convert.py"},
                    {"name": "trtllm-build", "command": "trtllm-build --x"},
                ]
            }
        )
    )
    paths.build_log.write_text("".join(f"line {i}\n" for i in range(30)))
    BuildStep(step=1, name="trtllm-build", exit_code=3).write(paths.build_failure)
    status = job_status(JobRef("local-b1", paths.folder))
    assert status.kind == "build" and status.state == "FAILED"
    lines = status.summary().splitlines()
    assert (
        lines[0]
        == "local-b1 FAILED (build) step 1 (trtllm-build) failed with exit status 3: trtllm-build --x; last lines:"
    )
    assert lines[1:] == [f"  | line {i}" for i in range(18, 30)]


def test_a_running_build_names_its_step_from_the_record_not_the_log(tmp_path, hpc_home):
    """BUILDING says the step the script's record names (launcher/contracts/build_records.py), with its command from the build
    request; what the log says is only shown, never read as state."""
    from hpc.jobs.kinds import BuildJob
    from hpc.jobs.track import job_status
    from hpc.scheduler.index import JobRef
    from launcher.contracts.layout import JobPaths

    paths = JobPaths(tmp_path / "d", "local-b2").create()
    BuildJob.mark(paths)
    paths.local_state.write_text(json.dumps({"state": "RUNNING", "pid": os.getpid()}))
    steps = [{"name": "convert", "command": "python3 convert.py"}, {"name": "trtllm-build", "command": "trtllm-build"}]
    Deployment(tmp_path / "d").build_request.write_text(json.dumps({"steps": steps}))
    paths.build_log.write_text("hpc-serve build: step 7 (made-up): a line of output that looks like a step\n")
    ref = JobRef("local-b2", paths.folder)
    assert job_status(ref).summary() == "local-b2 BUILDING (build)", "no record yet: no step"
    BuildStep(step=1, name="trtllm-build").write(paths.build_step)
    assert job_status(ref).summary() == "local-b2 BUILDING (build) step 1 (trtllm-build): trtllm-build"


def test_the_build_scripts_steps_write_their_records(tmp_path):
    """The rendered script's `step` function, run by bash: each step's record as it starts, the failed one's with
    its exit status, in the records' own format (render passes it in: launcher/contracts/build_records.py)."""
    import re

    from hpc.jobs.build_script import render_build_script
    from launcher.contracts.layout import JobPaths

    spec = load_spec(write(tmp_path, CPU))
    script = render_build_script(spec, plan_build(spec), tmp_path / "deploy")
    function = re.search(r"^step\(\) \{.*?^\}\n", script, re.M | re.S)
    assert function is not None, script
    paths = JobPaths(tmp_path / "deploy", "9").create()
    run = f'JOB_DIR={paths.folder}\nLOG={paths.build_log}\nrun() {{ "$@"; }}\n{function.group(0)}'
    done = subprocess.run(["bash", "-c", run + "step 0 shard true"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert BuildStep.read(paths.build_step) == BuildStep(step=0, name="shard") and not paths.build_failure.exists()
    failed = subprocess.run(["bash", "-c", run + "step 1 record sh -c 'exit 3'"], capture_output=True, text=True)
    assert failed.returncode == 3
    assert BuildStep.read(paths.build_step) == BuildStep(step=1, name="record")
    assert BuildStep.read(paths.build_failure) == BuildStep(step=1, name="record", exit_code=3)
