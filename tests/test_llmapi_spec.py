"""The llmapi workflow's spec side: `model.workflow` (and how it is inferred), the `llm_api:` section, the
checkpoint checks, model.yaml, the model repository render writes and launch.json's workflow fields."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from hpc.render import jobfiles as R
from hpc.render.llmapi import model_yaml_args
from hpc.spec import SpecError, load_spec, preview_spec
from hpc.spec.llm_args import LLM_API_ARGS, MAIN, V1_2_1
from launcher.contracts.llmapi import IMAGE_MODEL_DIR, MODEL_YAML
from launcher.contracts.plan import LaunchPlan

ROOT = Path(__file__).resolve().parent.parent


def write(folder: Path, text: str) -> Path:
    path = folder / "spec.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return [str(p) for p in err.value.problems]


def make_checkpoint(folder: Path, **config) -> Path:
    """A Hugging Face folder as the checks read it: config.json, a weights file, a tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 8, "num_hidden_layers": 4, **config}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_text("")
    (folder / "tokenizer.json").write_text("{}")
    return folder


GPU = """
name: big
slurm: {nodes: 2, gpus_per_node: 4}
container: {type: pyxis, image: nvcr.io#nvidia/tritonserver:25.09-trtllm-python-py3}
model:
  backend: tensorrtllm
  checkpoint_dir: hf
  tp_size: 4
  pp_size: 2
"""

CPU = """
name: small
slurm: {nodes: 1}
model:
  backend: cpu
  checkpoint_dir: hf
"""


@pytest.fixture()
def hf(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "hf")


# ------------------------------------------------------------------------------------------------ workflow
def test_a_spec_without_engine_fields_is_llmapi_and_one_with_engine_dir_or_build_is_engine(tmp_path, hf):
    assert load_spec(write(tmp_path, GPU)).model.workflow == "llmapi"
    assert load_spec(write(tmp_path, CPU)).model.workflow == "llmapi"
    engine = GPU.replace("checkpoint_dir: hf", "engine_dir: hf\n  tokenizer_dir: hf").replace("container:", "#")
    spec = load_spec(write(tmp_path, engine), check_files=False)
    assert spec.model.workflow == "engine" and spec.model.model_files_from is None
    build = CPU + "build: {}\n"
    assert load_spec(write(tmp_path, build), check_files=False).model.workflow == "engine"


@pytest.mark.parametrize(
    ("extra", "field", "instead"),
    [
        ("triton:\n  triton_max_batch_size: 8\n", "triton.triton_max_batch_size", "llm_api.max_batch_size"),
        ("triton:\n  enable_kv_cache_reuse: true\n", "triton.enable_kv_cache_reuse", "enable_block_reuse"),
        ("triton:\n  parameters: {enable_chunked_context: true}\n", "triton.parameters", "enable_chunked_prefill"),
    ],
)
def test_an_engine_field_on_an_inferred_llmapi_spec_is_an_error_naming_it(tmp_path, hf, extra, field, instead):
    path = write(tmp_path, CPU + extra)
    (found,) = problems(path)
    key = field.rsplit(".", 1)[1]
    assert found.startswith(f"{path}:{line_of(path, key + ':')}: {field}: is for model.workflow: engine"), found
    assert "the default for a spec without model.engine_dir or build:" in found and instead in found
    assert "set model.workflow: engine" in found
    said = write(tmp_path, CPU.replace("backend: cpu", "backend: cpu\n  workflow: engine") + extra)
    assert load_spec(said).model.workflow == "engine", "said engine: the same field is fine"


def test_engine_dir_or_build_on_an_explicit_llmapi_spec_is_an_error(tmp_path, hf):
    path = write(tmp_path, GPU.replace("tp_size: 4", "tp_size: 4\n  workflow: llmapi\n  engine_dir: e"))
    (found,) = problems(path)
    assert found.startswith(f"{path}:{line_of(path, 'engine_dir:')}: model.engine_dir: ")
    assert "for model.workflow: engine" in found
    path = write(tmp_path, CPU.replace("backend: cpu", "backend: cpu\n  workflow: llmapi") + "build: {}\n")
    (found,) = problems(path)
    assert found.startswith(f"{path}:{line_of(path, 'build:')}: build: ") and "model.workflow is llmapi" in found


def test_llm_api_on_an_engine_spec_is_an_error(tmp_path, hf):
    path = write(tmp_path, CPU.replace("backend: cpu", "backend: cpu\n  workflow: engine") + "llm_api: {}\n")
    (found,) = problems(path)
    assert found.startswith(f"{path}:{line_of(path, 'llm_api:')}: llm_api: llm_api is for model.workflow: llmapi")


def test_llmapi_needs_a_checkpoint_and_refuses_tokenizer_dir_and_orchestrator(tmp_path, hf):
    path = write(tmp_path, GPU.replace("checkpoint_dir: hf", "tokenizer_dir: hf"))
    (found,) = problems(path)
    assert "model.workflow llmapi needs model.checkpoint_dir" in found
    path = write(tmp_path, GPU.replace("checkpoint_dir: hf", "checkpoint_dir: hf\n  tokenizer_dir: hf"))
    (found,) = problems(path)
    assert f"{path}:{line_of(path, 'tokenizer_dir')}: model.tokenizer_dir: " in found and "llm_api.tokenizer" in found
    one_node = GPU.replace("nodes: 2", "nodes: 1").replace("pp_size: 2", "pp_size: 1")
    (found,) = problems(write(tmp_path, one_node + "mode: orchestrator\n"))
    assert "mode: mode orchestrator is the engine workflow's" in found


# ---------------------------------------------------------------------------------------------- model files
def test_hpc_serves_model_is_the_default_and_the_images_files_are_for_tensorrtllm(tmp_path, hf):
    for text in (GPU, CPU):
        model = load_spec(write(tmp_path, text)).model
        assert (model.llmapi_model, model.model_files_from) == ("hpc-serve", None)
    image = load_spec(write(tmp_path, GPU.replace("pp_size: 2", "pp_size: 2\n  llmapi_model: image")))
    assert image.model.model_files_from == IMAGE_MODEL_DIR, "the image's files, where NGC images keep them"
    own = load_spec(write(tmp_path, GPU.replace("pp_size: 2", "pp_size: 2\n  model_files_from: /opt/llmapi/1")))
    assert (own.model.llmapi_model, own.model.model_files_from) == ("image", "/opt/llmapi/1")
    path = write(tmp_path, CPU + "  model_files_from: /opt/llmapi/1\n")
    (found,) = problems(path)
    assert found.startswith(f"{path}:{line_of(path, 'model_files_from')}: model.model_files_from: ")
    assert "backend: tensorrtllm" in found
    path = write(tmp_path, GPU.replace("pp_size: 2", "pp_size: 2\n  llmapi_model: hpc-serve\n  model_files_from: /x"))
    (found,) = problems(path)
    assert f"{path}:{line_of(path, 'model_files_from')}: model.model_files_from: " in found and "image" in found
    path = write(tmp_path, GPU.replace("pp_size: 2", "pp_size: 2\n  model_files_from: llmapi/1"))
    (found,) = problems(path)
    assert "must be an absolute path" in found


def test_model_files_on_the_host_must_exist_without_a_container(tmp_path, hf):
    bare = GPU.replace("container: {type: pyxis, image: nvcr.io#nvidia/tritonserver:25.09-trtllm-python-py3}\n", "")
    bare = bare.replace("pp_size: 2", "pp_size: 2\n  llmapi_model: image")
    (found,) = problems(write(tmp_path, bare))
    assert f"model.model_files_from: {IMAGE_MODEL_DIR} does not exist here" in found
    (tmp_path / "llmapi").mkdir()
    here = bare.replace("pp_size: 2", f"pp_size: 2\n  model_files_from: {tmp_path / 'llmapi'}")
    assert load_spec(write(tmp_path, here)).model.model_files_from == str(tmp_path / "llmapi")


# ------------------------------------------------------------------------------------------------- llm_api
def test_llm_api_lists_every_bad_key_at_its_line_with_did_you_mean_and_the_field_to_use(tmp_path, hf):
    path = write(
        tmp_path,
        GPU
        + """
        llm_api:
          max_batch_szie: 8
          tensor_parallel_size: 4
          gpus_per_node: 4
          model: /elsewhere
          triton_config: {decoupled: false}
          no_such_argument_at_all: 1
        """.replace("\n        ", "\n"),
    )
    found = problems(path)
    assert found == [
        f"{path}:{line_of(path, 'max_batch_szie')}: llm_api.max_batch_szie: unknown LLM API argument "
        "'max_batch_szie'; did you mean 'max_batch_size' (TensorRT-LLM 1.2.1 and main)?",
        f"{path}:{line_of(path, 'tensor_parallel_size')}: llm_api.tensor_parallel_size: is set by model.tp_size; "
        "remove it from llm_api",
        f"{path}:{line_of(path, '  gpus_per_node')}: llm_api.gpus_per_node: is set by the placement (a replica's "
        "ranks per node: slurm.ntasks_per_node, slurm.gpus_per_node); remove it from llm_api",
        f"{path}:{line_of(path, 'model: /elsewhere')}: llm_api.model: is set by model.checkpoint_dir; "
        "remove it from llm_api",
        f"{path}:{line_of(path, 'triton_config')}: llm_api.triton_config: is set by triton.decoupled "
        "(hpc-serve writes model.yaml's triton_config); remove it from llm_api",
        f"{path}:{line_of(path, 'no_such')}: llm_api.no_such_argument_at_all: unknown LLM API argument "
        "'no_such_argument_at_all'",
    ]


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ("max_batch_size: 0", "llm_api.max_batch_size", "greater than or equal to 1"),
        ("kv_cache_config: {free_gpu_memory_fraction: 1.5}", "llm_api.kv_cache_config.free_gpu_memory_fraction", "1"),
        ("enable_chunked_prefill: maybe", "llm_api.enable_chunked_prefill", "boolean"),
        ("cuda_graph_config: {batch_sizes: [one]}", "llm_api.cuda_graph_config.batch_sizes.0", "integer"),
        ("kv_cache_config: null", "llm_api.kv_cache_config", "leave it out for TensorRT-LLM's defaults"),
    ],
)
def test_named_llm_api_arguments_are_checked(tmp_path, hf, entry, field, words):
    path = write(tmp_path, GPU + f"llm_api:\n  {entry}\n")
    (found,) = problems(path)
    assert found.startswith(f"{path}:{line_of(path, entry.split(':')[0])}: {field}: ") and words in found, found


def test_the_table_tags_each_name_with_its_releases():
    assert LLM_API_ARGS["max_batch_size"] == (V1_2_1, MAIN)
    assert LLM_API_ARGS["sampler_type"] == (V1_2_1,), "1.2.1 only"
    assert LLM_API_ARGS["num_serve_frontends"] == (MAIN,)
    assert {"kv_cache_config", "cuda_graph_config", "trust_remote_code", "max_seq_len"} <= set(LLM_API_ARGS)


# ---------------------------------------------------------------------------------------------- model.yaml
def test_model_yaml_has_the_specs_sizes_then_the_given_arguments(tmp_path, hf):
    spec = load_spec(
        write(
            tmp_path,
            GPU
            + "llm_api:\n  max_batch_size: 32\n  cuda_graph_config: null\n  sampler_type: auto\n"
            + "  kv_cache_config: {free_gpu_memory_fraction: 0.8, event_buffer_max_size: 16}\n",
        )
    )
    assert model_yaml_args(spec) == {
        "model": str(hf),
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 2,
        "gpus_per_node": 4,
        "max_batch_size": 32,
        "cuda_graph_config": None,  # given as null: CUDA graphs off, as upstream reads it
        "sampler_type": "auto",  # passed through
        "kv_cache_config": {"free_gpu_memory_fraction": 0.8, "event_buffer_max_size": 16},
        # max_batch_size: 0 is added by the repository's writer (backend/llmapi_repository.py with_triton_config)
        "triton_config": {"decoupled": True, "cancellation_check_period_ms": 100},
    }


def test_the_resolved_spec_renders_the_same_model_yaml(tmp_path, hf):
    """render's spec.yaml is loaded again (status, renewal): the llm_api keys not given stay not given."""
    spec = load_spec(write(tmp_path, CPU + "llm_api:\n  max_num_tokens: 512\n  kv_cache_config: {max_tokens: 64}\n"))
    out = R.render(spec, tmp_path / "d")
    again = load_spec(out.deploy_dir / "spec.yaml")
    assert model_yaml_args(again) == model_yaml_args(spec)
    assert "cuda_graph_config" not in model_yaml_args(again)


# ------------------------------------------------------------------------------------------- the repository
def repository_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_cpu_repository_is_upstreams_layout_with_a_shim(tmp_path, hf):
    spec = load_spec(write(tmp_path, CPU + "triton: {decoupled: false}\nllm_api: {max_batch_size: 4}\n"))
    repo = R.render(spec, tmp_path / "d").model_repository
    assert repository_files(repo) == [
        ".hpc-serve-repository.json",
        "tensorrt_llm/1/model.py",
        "tensorrt_llm/1/model.yaml",
        "tensorrt_llm/config.pbtxt",
    ]
    config = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'name: "tensorrt_llm"' in config and 'backend: "python"' in config
    assert "decoupled: false" in config and "decoupled: true" not in config, "the spec's, as in model.yaml"
    assert not [line for line in config.splitlines() if line.strip().startswith("max_batch_size")], "no batching"
    for name in ("text_input", "streaming", "sampling_param_max_tokens", "stop", "return_finish_reason"):
        assert f'name: "{name}"' in config
    model_yaml = yaml.safe_load((repo / "tensorrt_llm" / "1" / MODEL_YAML).read_text())
    assert model_yaml["triton_config"]["decoupled"] is False and model_yaml["max_batch_size"] == 4
    assert model_yaml["model"] == str(hf) and model_yaml["gpus_per_node"] == 1, "the replica's ranks per node"
    assert "from backend.models.llmapi import TritonPythonModel" in (repo / "tensorrt_llm/1/model.py").read_text()


def test_the_images_model_leaves_model_py_to_the_launcher(tmp_path, hf):
    spec = load_spec(write(tmp_path, GPU.replace("pp_size: 2", "pp_size: 2\n  llmapi_model: image")))
    out = R.render(spec, tmp_path / "d")
    assert repository_files(out.model_repository) == [
        ".hpc-serve-repository.json",
        "tensorrt_llm/1/model.yaml",
        "tensorrt_llm/config.pbtxt",
    ]
    assert "decoupled: true" in (out.model_repository / "tensorrt_llm/config.pbtxt").read_text()


@pytest.mark.slow
def test_a_rerender_to_the_engine_workflow_replaces_the_llmapi_repository(tmp_path, hf):
    R.render(load_spec(write(tmp_path, CPU)), tmp_path / "d")
    engine = load_spec(write(tmp_path, CPU.replace("backend: cpu", "backend: cpu\n  workflow: engine")))
    repo = R.render(engine, tmp_path / "d").model_repository
    assert (repo / "ensemble" / "config.pbtxt").is_file() and not (repo / "tensorrt_llm/1/model.yaml").exists()


# ------------------------------------------------------------------------------------------------- the plan
@pytest.mark.slow
def test_launch_json_says_the_workflow_backend_and_model_files(tmp_path, hf):
    gpu = LaunchPlan.read(R.render(load_spec(write(tmp_path, GPU)), tmp_path / "g").launch)
    assert (gpu.workflow, gpu.backend, gpu.model_files_from) == ("llmapi", "tensorrtllm", None)
    image = GPU.replace("pp_size: 2", "pp_size: 2\n  llmapi_model: image")
    gpu = LaunchPlan.read(R.render(load_spec(write(tmp_path, image)), tmp_path / "i").launch)
    assert gpu.model_files_from == IMAGE_MODEL_DIR
    assert gpu.world_size_per_replica == 8
    cpu = LaunchPlan.read(R.render(load_spec(write(tmp_path, CPU)), tmp_path / "c").launch)
    assert (cpu.workflow, cpu.backend, cpu.model_files_from) == ("llmapi", "cpu", None)
    engine = CPU.replace("backend: cpu", "backend: cpu\n  workflow: engine")
    plan = LaunchPlan.read(R.render(load_spec(write(tmp_path, engine)), tmp_path / "e").launch)
    assert (plan.workflow, plan.backend, plan.model_files_from) == ("engine", "cpu", None)


@pytest.mark.slow
def test_render_says_where_model_py_comes_from(tmp_path, hf):
    def render(text: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "hpc.cli.main", "render", str(write(tmp_path, text)), "-o", "d"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)},
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    image = GPU.replace("pp_size: 2", "pp_size: 2\n  llmapi_model: image")
    assert f"copied from {IMAGE_MODEL_DIR} (inside the image) into tensorrt_llm/1/ when each replica starts" in (
        render(image)
    )
    assert "hpc-serve's llmapi model (backend.models.llmapi, a shim in the repository) over TensorRT-LLM" in render(GPU)
    assert "over the CPU engine's stand-in of TensorRT-LLM" in render(CPU)


@pytest.mark.slow
def test_build_on_an_llmapi_spec_says_there_is_nothing_to_build_and_submits_nothing(tmp_path, hf):
    spec = write(tmp_path, CPU)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "hpc.cli.main", "build", str(spec)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "no engine to build" in proc.stdout and f"hpc-serve submit {spec}" in proc.stdout
    assert not (tmp_path / "runs").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["hf", "spec.yaml"]


# ---------------------------------------------------------------------------------------------- checkpoint
@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"architectures": []}, "model.checkpoint_dir", "names no architecture"),
        ({"num_attention_heads": 6}, "model.tp_size", "tp_size 4 does not divide the model's attention heads (6)"),
        ({"num_hidden_layers": 1}, "model.pp_size", "pp_size 2 is more than the model's 1 layers"),
    ],
)
def test_a_checkpoint_that_cannot_serve_the_spec_is_refused_even_by_render(tmp_path, change, field, words):
    make_checkpoint(tmp_path / "hf", **change)
    path = write(tmp_path, GPU)
    (found,) = problems(path)
    assert f": {field}: " in found and words in found, found
    with pytest.raises(SpecError):
        preview_spec(path)


def test_the_cpu_engine_refuses_an_architecture_it_does_not_run(tmp_path):
    make_checkpoint(tmp_path / "hf", architectures=["MixtralForCausalLM"])
    (found,) = problems(write(tmp_path, CPU))
    assert "architecture MixtralForCausalLM is not one the CPU engine runs" in found


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_checkpoint_missing_files_is_refused_by_validate_and_noted_by_render(tmp_path, hf, missing):
    (hf / missing).unlink()
    path = write(tmp_path, GPU)
    (found,) = problems(path)
    assert found.startswith(f"{path}:{line_of(path, 'checkpoint_dir')}: model.checkpoint_dir: {hf} has no ")
    _, notes = preview_spec(path)
    assert [n.path for n in notes] == ["model.checkpoint_dir"]


def test_a_checkpoint_saved_by_init_model_passes(tmp_path, tiny_gpt2):
    shutil.copytree(tiny_gpt2, tmp_path / "hf")
    assert load_spec(write(tmp_path, CPU)).model.checkpoint_dir == tmp_path / "hf"


def test_gpu_binding_on_llmapi_is_none_and_per_rank_is_refused(tmp_path, hf):
    """TensorRT-LLM's PyTorch workers open cuda:<rank % gpus_per_node>: a rank that sees one GPU fails on an
    invalid ordinal (docs/decisions.md "One GPU per rank"), so auto resolves to none on this workflow."""
    from hpc.render.gpu_binding import gpu_decision

    spec = load_spec(write(tmp_path, GPU))
    assert gpu_decision(spec).binding == "none" and "llmapi" in gpu_decision(spec).why
    with pytest.raises(SpecError, match=r"slurm.gpu_binding: per-rank binding breaks the llmapi workflow"):
        load_spec(write(tmp_path, GPU.replace("gpus_per_node: 4}", "gpus_per_node: 4, gpu_binding: per-rank}")))


def test_the_fields_described_as_engine_only_are_those_llmapi_refuses():
    """docs/spec.md says "engine workflow:" of exactly the triton fields an llmapi spec may not set."""
    from hpc.spec.llmapi import ENGINE_TRITON_FIELDS
    from hpc.spec.schema import _ENGINE_ONLY, TritonSpec

    described = {n for n, f in TritonSpec.model_fields.items() if (f.description or "").startswith(_ENGINE_ONLY)}
    assert described == set(ENGINE_TRITON_FIELDS)


# ------------------------------------------------------------------------------------------------ backend sim
SIM = """
name: sim
slurm: {nodes: 1}
model:
  backend: sim
  checkpoint_dir: hf
"""


def test_backend_sim_asks_no_weights_and_hands_its_ranks_the_engine_and_the_gpu(tmp_path, hf):
    from launcher.contracts.llmapi import ENGINE_VAR, SIM_GPU_VAR, SIM_SLOWDOWN_VAR

    (hf / "model.safetensors").unlink()
    spec = load_spec(write(tmp_path, SIM))
    assert spec.model.workflow == "llmapi" and not spec.backend_strategy.uses_gpus
    assert not spec.backend_strategy.init_makes_random_weights, "generate's note on random text is not for it"
    assert spec.backend_strategy.rank_env(spec.model) == {ENGINE_VAR: "sim", SIM_GPU_VAR: "h200"}
    with_gpu = load_spec(write(tmp_path, SIM + "  sim: {gpu: h100, slowdown: 4}\n"))
    assert with_gpu.backend_strategy.rank_env(with_gpu.model) == {
        ENGINE_VAR: "sim",
        SIM_GPU_VAR: "h100",
        SIM_SLOWDOWN_VAR: "4",
    }
    assert any("has no weights" in p for p in problems(write(tmp_path, CPU))), "the CPU engine needs them"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("  workflow: engine\n", "model.backend: model.backend sim runs on the llmapi workflow only"),
        ("  sim: {gpu: a100}\n", "model.sim.gpu: Input should be 'h100' or 'h200'"),
        ("  sim: {gpus: h100}\n", "unknown key 'gpus'; did you mean 'gpu'?"),
        ("  pp_size: 2\n", "model.pp_size must be 1 with backend: sim"),
        ("  sim: {slowdown: 0.5}\n", "model.sim.slowdown: Input should be greater than or equal to 1"),
    ],
)
def test_backend_sim_refuses_what_it_cannot_simulate(tmp_path, hf, extra, words):
    found = problems(write(tmp_path, SIM + extra))
    assert any(words in p for p in found), found


def test_model_sim_and_a_simulated_init_are_for_backend_sim_only(tmp_path, hf):
    assert any("model.sim is for backend: sim, not cpu" in p for p in problems(write(tmp_path, CPU + "  sim: {}\n")))
    cpu_init = CPU + "  init: {model: llama-3.1-8b}\n"
    assert any("model.init.model names a simulated model" in p for p in problems(write(tmp_path, cpu_init)))
    sim = load_spec(write(tmp_path, SIM.replace("checkpoint_dir: hf", "checkpoint_dir: new") + "  init: {}\n"))
    assert sim.model.init is not None and sim.model.init.model == "llama-3.1-8b", "the default simulated model"
    from hpc.jobs.model_init import init_command

    assert init_command(sim) == f"hpc-serve init-model {tmp_path / 'new'} --sim-model llama-3.1-8b"
