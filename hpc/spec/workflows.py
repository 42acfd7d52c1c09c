"""The workflow and backend strategies: one object per `model.workflow` (engine, llmapi) and per `model.backend`
(tensorrtllm, cpu, sim) that answers every question whose answer differs between them, so that callers ask the object
(`spec.model.workflow_strategy`, `spec.model.backend_strategy`) instead of testing the spec's strings, and adding a
workflow or a backend is adding one class here (DEVELOPERS.md, "How to add things").

What differs is a class attribute; behaviour that differs (the spec's checks, which modules a replica imports) is a
method. The registries are keyed by the spec's YAML values (launcher/contracts/llmapi.py WORKFLOWS, BACKENDS),
which stay the spec's and the records' names. What other processes ask sits in tables keyed by the same names,
since they cannot import hpc or hold no spec: the ranks' (launcher/contracts/workflows.py, this module's `.rank`),
the backend's repository (backend/parameters.py REPOSITORY_BACKENDS) and the gateway's ModelIO, chosen by a
replica's record (hpc/serving/model_io.py WORKFLOW_IO).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from backend.llmapi_repository import LLMAPI_MODULE as CPU_LLMAPI_MODULE
from backend.repository import CPU_ENGINE_MODULE, PYTHON_MODEL_MODULES
from backend.sim_engine.profiles import DEFAULT_GPU, DEFAULT_MODEL
from launcher.contracts.llmapi import (
    ENGINE,
    ENGINE_VAR,
    IMAGE_MODEL,
    IMAGE_MODEL_DIR,
    LLMAPI,
    OWN_MODEL,
    SIM_GPU_VAR,
    SIM_SLOWDOWN_VAR,
)
from launcher.contracts.trtllm_versions import FIRST_LLMAPI, LAST_ENGINE
from launcher.contracts.workflows import RANK_BACKENDS, RANK_WORKFLOWS, RankBackend, RankWorkflow

if TYPE_CHECKING:
    from hpc.spec.build import BuildSpec
    from hpc.spec.files import Finding
    from hpc.spec.model import ModelSpec
    from hpc.spec.schema import Spec


class Backend(ABC):
    """The engine that runs the model: its name is the spec's `model.backend`."""

    name: ClassVar[str]
    #: rank r opens GPU r % gpus_per_node: slurm.gpus_per_node sets a node's ranks and bounds them, the GPU
    #: binding counts GPUs, a build job asks for them, the doctor checks the node shows them
    uses_gpus: ClassVar[bool]
    #: the engine workflow serves a trtllm-build engine (model.engine_dir, or a build: section's output); else
    #: it reads the Hugging Face checkpoint itself
    serves_built_engine: ClassVar[bool]
    #: the llmapi workflow can serve the image's model.py (model.llmapi_model image), which runs over TensorRT-LLM
    runs_image_model: ClassVar[bool]
    #: model.init may make a checkpoint for it (random weights; for the simulated engine, none)
    makes_checkpoints: ClassVar[bool]
    #: the checkpoint must hold weights (the simulated engine reads only config.json and the tokenizer)
    needs_weights: ClassVar[bool]
    #: it stands in for a GPU (`model.sim:` says which)
    simulates_gpu: ClassVar[bool]
    #: mode orchestrator (the C++ backend spawns the ranks) is possible
    spawns_ranks: ClassVar[bool]
    #: tensor parallelism splits the KV heads too (the CPU engine; TensorRT-LLM copies a KV head onto ranks)
    splits_kv_heads: ClassVar[bool]
    #: the engine workflow's `tensorrt_llm` model is told tp_size (the CPU engine shards the checkpoint itself)
    tp_size_parameter: ClassVar[bool]
    #: what runs under hpc-serve's llmapi model, for `render`'s output
    llmapi_engine_words: ClassVar[str]
    #: the engine, in the serving script's first comment line, and what a build job makes, in the build script's
    script_words: ClassVar[str]
    build_words: ClassVar[str]
    #: the python modules the engine workflow's `tensorrt_llm` model and the llmapi workflow's own model add to
    #: the repository's (backend/repository.py, backend/llmapi_repository.py)
    ensemble_modules: ClassVar[tuple[str, ...]]
    llmapi_modules: ClassVar[tuple[str, ...]]

    @abstractmethod
    def check_model(self, model: ModelSpec) -> None:
        """The `model:` section's fields this engine cannot take, on either workflow."""

    @abstractmethod
    def check_engine_model(self, model: ModelSpec) -> None:
        """The engine workflow's `model:` folders for this engine; ValueError("@field: what, and the fix")."""

    @abstractmethod
    def check_build(self, spec: Spec, build: BuildSpec) -> None:
        """How `build:` fits this engine; ValueError("@build.field: what, and the fix")."""

    @property
    def rank(self) -> RankBackend:
        """What the ranks and the build job ask of this backend (launcher/contracts/workflows.py)."""
        return RANK_BACKENDS[self.name]

    @property
    def init_makes_random_weights(self) -> bool:
        """model.init's checkpoint has random weights, so its text is random (the simulated engine's has none: its
        answers are the corpus)."""
        return self.makes_checkpoints and self.needs_weights

    def rank_env(self, model: ModelSpec) -> dict[str, str]:
        """Variables launch.json's env hands every rank for this engine (none but the simulated engine's)."""
        return {}

    def check_init(self, model: ModelSpec) -> None:
        """`model.init`'s fields for this engine (only backends that make checkpoints get here)."""
        if model.init is not None and model.init.model is not None:
            raise ValueError(
                "@init.model: model.init.model names a simulated model, for backend: sim; "
                "the CPU engine's checkpoint is family and size"
            )

    @property
    def imports_tensorrt_llm(self) -> bool:
        """The replica imports NVIDIA's `tensorrt_llm`, not the stand-in (the doctor checks the node's version and
        imports)."""
        return not self.rank.standin

    def engine_source(self, model: ModelSpec) -> Path:
        """The folder the engine workflow's model reads."""
        return model.checkpoint_dir  # type: ignore[return-value]

    def supported_architectures(self) -> tuple[str, ...] | None:
        """The checkpoint architectures it runs; None: whatever TensorRT-LLM builds."""
        return None


class TensorRTLLM(Backend):
    name = "tensorrtllm"
    uses_gpus = True
    serves_built_engine = True
    runs_image_model = True
    makes_checkpoints = False
    needs_weights = True
    simulates_gpu = False
    spawns_ranks = True
    splits_kv_heads = False
    tp_size_parameter = False
    llmapi_engine_words = "TensorRT-LLM"
    script_words = "TensorRT-LLM"
    build_words = "TensorRT-LLM"
    ensemble_modules = ()
    llmapi_modules = ()

    def check_model(self, model: ModelSpec) -> None:
        pass  # any tp × pp

    def check_engine_model(self, model: ModelSpec) -> None:
        # engine_dir: required unless a build: section makes it (Spec._fits)
        if model.checkpoint_dir is not None or model.init is not None:
            raise ValueError(
                "@checkpoint_dir: with model.workflow engine, model.checkpoint_dir and model.init are for "
                "backend: cpu; use engine_dir (or model.workflow: llmapi to serve a Hugging Face checkpoint)"
            )
        if model.tokenizer_dir is None:
            raise ValueError("@tokenizer_dir: model.backend tensorrtllm needs model.tokenizer_dir")

    def check_build(self, spec: Spec, build: BuildSpec) -> None:
        b = build
        if spec.model.engine_dir is not None:
            raise ValueError(
                "@model.engine_dir: with a build: section the engine is the build's output (a folder under "
                "build.output_dir); drop model.engine_dir, or drop build: to serve that engine as it is"
            )
        if b.checkpoint_dir is None:
            raise ValueError("@build.checkpoint_dir: the build needs the Hugging Face checkpoint to convert")
        if b.quantization is None and not b.convert_script:
            raise ValueError(
                "@build.convert_script: give the convert_checkpoint.py of the model's family in the container, "
                "e.g. /app/tensorrt_llm/examples/llama/convert_checkpoint.py (or set build.quantization)"
            )
        if (b.kv_cache_dtype or b.calib_size) and b.quantization is None:
            raise ValueError("@build.quantization: kv_cache_dtype and calib_size are quantize.py's; set quantization")

    def engine_source(self, model: ModelSpec) -> Path:
        return model.engine_dir  # type: ignore[return-value]


class Cpu(Backend):
    name = "cpu"
    uses_gpus = False
    serves_built_engine = False
    runs_image_model = False
    makes_checkpoints = True
    needs_weights = True
    simulates_gpu = False
    spawns_ranks = False
    splits_kv_heads = True
    tp_size_parameter = True
    llmapi_engine_words = "the CPU engine's stand-in of TensorRT-LLM"
    script_words = "the hpc-serve CPU engine"
    build_words = "CPU engine shards"
    ensemble_modules = (CPU_ENGINE_MODULE,)
    llmapi_modules = (CPU_LLMAPI_MODULE,)

    def check_model(self, model: ModelSpec) -> None:
        if model.pp_size != 1:
            raise ValueError(
                "@pp_size: model.pp_size must be 1 with backend: cpu (the CPU engine splits by tensor only)"
            )

    def check_engine_model(self, model: ModelSpec) -> None:
        if model.checkpoint_dir is None:
            raise ValueError("@checkpoint_dir: model.backend cpu needs model.checkpoint_dir (a Hugging Face folder)")
        if model.engine_dir is not None:
            raise ValueError(
                "@engine_dir: model.engine_dir is for backend: tensorrtllm; use checkpoint_dir with backend: cpu"
            )

    def check_build(self, spec: Spec, build: BuildSpec) -> None:
        b, m = build, spec.model
        cpu_only = [
            name
            for name in ("quantization", "kv_cache_dtype", "calib_size", "convert_script", "max_num_tokens")
            if getattr(b, name) is not None
        ]
        cpu_only += [name for name in ("plugins", "convert_args", "quantize_args", "build_args") if getattr(b, name)]
        if cpu_only:
            raise ValueError(
                f"@build.{cpu_only[0]}: is for backend tensorrtllm; the CPU engine's build only creates and shards "
                "the checkpoint (float32)"
            )
        if b.dtype not in ("auto", "float32"):
            raise ValueError("@build.dtype: the CPU engine computes in float32; use auto or float32")
        if b.checkpoint_dir is not None and m.checkpoint_dir is not None and b.checkpoint_dir != m.checkpoint_dir:
            raise ValueError(
                "@build.checkpoint_dir: with backend cpu the build reads model.checkpoint_dir (which model.init "
                "creates); drop build.checkpoint_dir or make them the same"
            )

    def supported_architectures(self) -> tuple[str, ...] | None:
        from backend.cpu_engine.checkpoint import SUPPORTED_ARCHITECTURES

        return tuple(SUPPORTED_ARCHITECTURES)


class Sim(Backend):
    """The simulated GPU engine (backend/sim_engine/): the llmapi workflow's process layout and stand-in, a GPU's
    timing, a checkpoint of config.json and a tokenizer."""

    name = "sim"
    uses_gpus = False
    serves_built_engine = False
    runs_image_model = False
    makes_checkpoints = True
    needs_weights = False
    simulates_gpu = True
    spawns_ranks = False
    splits_kv_heads = False  # as TensorRT-LLM: a KV head may be copied onto several ranks
    tp_size_parameter = False
    llmapi_engine_words = "the simulated GPU engine behind the stand-in of TensorRT-LLM"
    script_words = "the hpc-serve simulated GPU engine"
    build_words = "nothing (the simulated engine has no weights)"
    ensemble_modules = ()
    llmapi_modules = (CPU_LLMAPI_MODULE,)

    def check_model(self, model: ModelSpec) -> None:
        if model.pp_size != 1:
            raise ValueError("@pp_size: model.pp_size must be 1 with backend: sim (it simulates tensor parallelism)")

    def check_engine_model(self, model: ModelSpec) -> None:
        raise ValueError(
            "@backend: model.backend sim runs on the llmapi workflow only (a Hugging Face checkpoint folder in "
            "model.checkpoint_dir); drop model.workflow engine and engine_dir"
        )

    def check_build(self, spec: Spec, build: BuildSpec) -> None:
        raise ValueError("@build: backend sim has nothing to build (no weights, no engine); drop the build: section")

    def check_init(self, model: ModelSpec) -> None:
        if model.init is not None and model.init.model is None:
            model.init.model = DEFAULT_MODEL

    def rank_env(self, model: ModelSpec) -> dict[str, str]:
        env = {ENGINE_VAR: self.name, SIM_GPU_VAR: model.sim.gpu if model.sim is not None else DEFAULT_GPU}
        if model.sim is not None and model.sim.slowdown != 1:
            env[SIM_SLOWDOWN_VAR] = f"{model.sim.slowdown:g}"
        return env

    def supported_architectures(self) -> tuple[str, ...] | None:
        return ("LlamaForCausalLM",)


class Workflow(ABC):
    """How TensorRT-LLM serves the model: its name is the spec's `model.workflow` and launch.json's `workflow`."""

    name: ClassVar[str]
    #: serves a trtllm-build engine through the ensemble of five models filled from `triton.parameters`
    #: (backend/repository.py); else one `tensorrt_llm` model configured by model.yaml (llm_api:)
    ensemble_repository: ClassVar[bool]
    #: `hpc-serve build` and a build: section make its engine
    builds_engines: ClassVar[bool]
    #: the Hugging Face checkpoint is what it serves: its files are checked (config.json, weights, tokenizer)
    serves_checkpoint: ClassVar[bool]
    #: mode orchestrator (the C++ backend spawns the ranks) is possible
    spawns_ranks: ClassVar[bool]
    #: slurm.gpu_binding per-rank is possible (each rank sees one GPU)
    per_rank_binding: ClassVar[bool]
    #: `render` says where the running model.py comes from; `doctor --serve` has a battery for its model
    chooses_model_py: ClassVar[bool]
    #: the doctor's fix when the node's TensorRT-LLM does not serve this workflow (WORKFLOW_RELEASES says which do)
    trtllm_fix: ClassVar[str]

    @abstractmethod
    def check_model(self, model: ModelSpec) -> None:
        """The `model:` section's folders and fields on this workflow; ValueError("@field: what, and the fix")."""

    @abstractmethod
    def findings(self, spec: Spec) -> list[Finding]:
        """The fields of another workflow that the spec sets (hpc/spec/llmapi.py), one finding each."""

    @abstractmethod
    def source_dir(self, model: ModelSpec) -> Path:
        """The folder the model reads."""

    @abstractmethod
    def model_modules(self, backend: Backend) -> list[str]:
        """The modules tritonserver's python stubs import when the models start (the doctor's probe imports them)."""

    @property
    def rank(self) -> RankWorkflow:
        """What the ranks ask of this workflow (launcher/contracts/workflows.py)."""
        return RANK_WORKFLOWS[self.name]

    def serves_built_engine(self, backend: Backend) -> bool:
        """The model reads a trtllm-build engine (model.engine_dir or a build's output)."""
        return self.builds_engines and backend.serves_built_engine


class Engine(Workflow):
    name = ENGINE
    ensemble_repository = True
    builds_engines = True
    serves_checkpoint = False
    spawns_ranks = True
    per_rank_binding = True
    chooses_model_py = False
    trtllm_fix = (
        f"the engine workflow needs TensorRT-LLM {LAST_ENGINE} or older (NGC tritonserver up to 25.xx "
        "-trtllm-python-py3 with TensorRT-LLM 1.2); or serve the Hugging Face checkpoint with model.workflow: llmapi"
    )

    def check_model(self, model: ModelSpec) -> None:
        model.backend_strategy.check_engine_model(model)
        if model.model_files_from is not None:
            raise ValueError("@model_files_from: model.model_files_from is for model.workflow: llmapi")
        if model.llmapi_model is not None:
            raise ValueError("@llmapi_model: model.llmapi_model is for model.workflow: llmapi")

    def findings(self, spec: Spec) -> list[Finding]:
        if spec.llm_api is not None:
            return [(("llm_api",), "llm_api is for model.workflow: llmapi; the engine workflow is set by triton:")]
        return []

    def source_dir(self, model: ModelSpec) -> Path:
        return model.backend_strategy.engine_source(model)

    def model_modules(self, backend: Backend) -> list[str]:
        return [*PYTHON_MODEL_MODULES.values(), *backend.ensemble_modules]


class Llmapi(Workflow):
    name = LLMAPI
    ensemble_repository = False
    builds_engines = False
    serves_checkpoint = True
    spawns_ranks = False
    per_rank_binding = False
    chooses_model_py = True
    trtllm_fix = (
        f"use an image with TensorRT-LLM {FIRST_LLMAPI} or newer (NGC tritonserver 25.09+ -trtllm-python-py3), "
        "or serve a trtllm-build engine with model.workflow: engine"
    )

    def check_model(self, model: ModelSpec) -> None:
        """A Hugging Face checkpoint and nothing of an engine; where the image's model files are."""
        if model.engine_dir is not None:
            raise ValueError(
                "@engine_dir: model.engine_dir is a trtllm-build engine, for model.workflow: engine; the llmapi "
                "workflow serves a Hugging Face checkpoint (model.checkpoint_dir), or set model.workflow: engine"
            )
        if model.checkpoint_dir is None:
            raise ValueError(
                "@checkpoint_dir: model.workflow llmapi needs model.checkpoint_dir (a Hugging Face checkpoint folder: "
                "config.json, *.safetensors, tokenizer files)"
            )
        if model.tokenizer_dir is not None:
            raise ValueError(
                "@tokenizer_dir: the llmapi workflow reads the tokenizer from model.checkpoint_dir; "
                "to use another folder, set llm_api.tokenizer"
            )
        backend = model.backend_strategy
        if model.init is not None and not backend.makes_checkpoints:
            raise ValueError("@init: model.init makes a checkpoint for backend: cpu or sim only")
        given = model.llmapi_model is not None
        if not given:
            model.llmapi_model = IMAGE_MODEL if model.model_files_from is not None else OWN_MODEL
        if model.llmapi_model == OWN_MODEL and model.model_files_from is not None:
            raise ValueError(
                "@model_files_from: model.model_files_from names the image's model files, for llmapi_model: image; "
                "remove it to serve hpc-serve's model"
            )
        if model.llmapi_model == IMAGE_MODEL:
            if not backend.runs_image_model:
                field = "llmapi_model" if given else "model_files_from"
                raise ValueError(
                    f"@{field}: the image's model.py runs only over TensorRT-LLM (backend: tensorrtllm); "
                    f"backend {backend.name} serves hpc-serve's model: remove model.{field}"
                )
            if model.model_files_from is None:
                model.model_files_from = IMAGE_MODEL_DIR

    def findings(self, spec: Spec) -> list[Finding]:
        from hpc.spec.llmapi import llmapi_findings

        return llmapi_findings(spec)

    def source_dir(self, model: ModelSpec) -> Path:
        return model.checkpoint_dir  # type: ignore[return-value]

    def model_modules(self, backend: Backend) -> list[str]:
        return list(backend.llmapi_modules)  # with TensorRT-LLM: the image's own model.py, not ours


#: the spec's `model.workflow` → its strategy
WORKFLOW_STRATEGIES: dict[str, Workflow] = {w.name: w for w in (Engine(), Llmapi())}
#: the spec's `model.backend` → its strategy
BACKEND_STRATEGIES: dict[str, Backend] = {b.name: b for b in (TensorRTLLM(), Cpu(), Sim())}
