"""The spec's `model:` section: what is served, by which engine and which TensorRT-LLM workflow, and the checks of
its folders that need no file system (hpc/spec/files.py reads them; hpc/spec/llmapi.py checks the llmapi
workflow's other sections).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from backend.sim_engine.profiles import DEFAULT_GPU, DEFAULT_MODEL, GPUS, MODELS
from hpc.spec.checks import _no_newline, _Section
from hpc.spec.llmapi import WORKFLOW_HELP
from hpc.spec.workflows import BACKEND_STRATEGIES, WORKFLOW_STRATEGIES, Backend, Workflow
from launcher.contracts.llmapi import BACKENDS, ENGINE, IMAGE_MODEL_DIR, LLMAPI, LLMAPI_MODELS, MODEL_FILES, WORKFLOWS


class ModelInit(_Section):
    """Create the checkpoint if `checkpoint_dir` does not exist: a small random-weight one (backend cpu), or a
    simulated model's config.json and tokenizer, without weights (backend sim)."""

    family: Literal["gpt2", "llama"] = Field("gpt2", description="backend cpu: the architecture of the checkpoint made")
    size: Literal["tiny", "small"] = Field("tiny", description="backend cpu: how large a model to make")
    seed: int = Field(0, description="backend cpu: the random seed of its weights: the same seed, the same checkpoint")
    model: Literal[tuple(MODELS)] | None = Field(  # type: ignore[valid-type]
        None,
        description=f"backend sim: the model whose published config.json the checkpoint gets ({', '.join(MODELS)}; "
        f"default {DEFAULT_MODEL}), with a tokenizer trained on the shipped corpus and no weights",
    )


class SimSpec(_Section):
    """The simulated engine's hardware (backend sim): which GPU each rank stands in for (backend/sim_engine/
    profiles.py: its memory, bandwidth, FLOPs and calibrated constants)."""

    gpu: Literal[tuple(GPUS)] = Field(  # type: ignore[valid-type]
        DEFAULT_GPU, description=f"the GPU simulated: {', '.join(GPUS)} (SXM parts)"
    )
    slowdown: float = Field(
        1.0,
        ge=1.0,
        le=1000.0,
        description="every step takes this many times the GPU's time: more than 1 where this machine cannot serve "
        "the replicas' tokens at a GPU's pace (tritonserver and its python model cost CPU per token); comparisons "
        "between runs of the same slowdown hold",
    )


class ModelSpec(_Section):
    """What is served, by which engine (`backend`: TensorRT-LLM, or `cpu`, the embedded reference engine) and
    which TensorRT-LLM workflow (`workflow`: llmapi serves a Hugging Face checkpoint, engine a trtllm-build
    engine)."""

    backend: Literal[BACKENDS] = Field(  # type: ignore[valid-type]
        "tensorrtllm",
        description="tensorrtllm: TensorRT-LLM on GPUs; cpu: hpc-serve's embedded CPU reference engine behind the "
        "same Triton tensors (no GPU needed); sim: a simulated GPU engine (llmapi workflow: a GPU's timing, KV "
        "cache and block reuse, waited rather than computed; see model.sim)",
    )
    workflow: Literal[WORKFLOWS] | None = Field(None, description=WORKFLOW_HELP)  # type: ignore[valid-type]
    engine_dir: Path | None = Field(
        None, description="engine workflow, backend tensorrtllm: the trtllm-build output (or a build: section)"
    )
    checkpoint_dir: Path | None = Field(
        None,
        description="a Hugging Face checkpoint folder: what the llmapi workflow serves, and what backend cpu reads",
    )
    tokenizer_dir: Path | None = Field(
        None,
        description="engine workflow: the tokenizer's folder (required with backend tensorrtllm; default "
        "checkpoint_dir); llmapi reads it from checkpoint_dir (another: llm_api.tokenizer)",
    )
    tp_size: int = Field(1, ge=1, description="tensor-parallel ranks of a replica")
    pp_size: int = Field(1, ge=1, description="pipeline-parallel ranks of a replica (1 with backend cpu)")
    init: ModelInit | None = Field(
        None,
        description="backend cpu: a random-weight checkpoint that `submit` (or the build job, with build:) creates "
        "when checkpoint_dir is missing; backend sim: a simulated model's config.json and tokenizer; by hand: "
        "`hpc-serve init-model DIR`",
    )
    sim: SimSpec | None = Field(
        None, description="backend sim: the GPU simulated (default: an H200); set with backend sim only"
    )
    llmapi_model: Literal[LLMAPI_MODELS] | None = Field(  # type: ignore[valid-type]
        None,
        description="llmapi workflow: which `tensorrt_llm` Triton model serves: hpc-serve (the default: hpc-serve's "
        "own model over TensorRT-LLM's public LLM API, the same file CI runs; streams token by token, takes stop "
        "strings, ignore_eos, min_tokens, repetition_penalty and exports engine metrics) or image (NVIDIA's "
        "model.py and helpers.py from the image, exactly; backend tensorrtllm only; see model_files_from)",
    )
    model_files_from: str | None = Field(
        None,
        description=f"llmapi_model image: the folder holding TensorRT-LLM's llmapi {' and '.join(MODEL_FILES)} "
        "(the image's own, so they match its TensorRT-LLM), copied into the model repository when a replica "
        f"starts; default {IMAGE_MODEL_DIR} (NGC images). Setting it picks llmapi_model image",
    )

    #: True when `workflow` was left out and inferred (messages say why the spec is on its workflow)
    _workflow_inferred: bool = PrivateAttr(False)

    @field_validator("model_files_from")
    @classmethod
    def _image_path(cls, value: str | None) -> str | None:
        """A path where the ranks run (usually inside the image), so never made relative to the spec's folder."""
        if value is not None and not _no_newline(value).startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path (as the ranks see it, inside the container)")
        return value

    @model_validator(mode="after")
    def _dirs(self) -> ModelSpec:
        if self.workflow is None:  # see WORKFLOW_HELP; a build: section makes it engine (Spec._build_is_engine)
            self.workflow = ENGINE if self.engine_dir is not None else LLMAPI
            self._workflow_inferred = True
        self.workflow_strategy.check_model(self)
        backend = self.backend_strategy
        if self.sim is not None and not backend.simulates_gpu:
            raise ValueError(f"@sim: model.sim is for backend: sim, not {backend.name}")
        backend.check_model(self)
        if self.init is not None and backend.makes_checkpoints:
            backend.check_init(self)
        return self

    @property
    def workflow_strategy(self) -> Workflow:
        """The object that answers every question whose answer depends on `workflow` (hpc/spec/workflows.py)."""
        return WORKFLOW_STRATEGIES[self.workflow or LLMAPI]

    @property
    def backend_strategy(self) -> Backend:
        """The object that answers every question whose answer depends on `backend` (hpc/spec/workflows.py)."""
        return BACKEND_STRATEGIES[self.backend]

    @property
    def serves_built_engine(self) -> bool:
        """The model reads a trtllm-build engine: model.engine_dir, or a build: section's output."""
        return self.workflow_strategy.serves_built_engine(self.backend_strategy)

    @property
    def source_dir(self) -> Path:
        """The folder the model reads: the engine (`gpt_model_path`) of the engine workflow's TensorRT-LLM, the
        Hugging Face checkpoint otherwise."""
        return self.workflow_strategy.source_dir(self)

    @property
    def tokenizer(self) -> Path:
        return self.tokenizer_dir or self.source_dir
