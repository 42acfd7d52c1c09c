"""The spec's `model:` section: what is served, by which engine and which TensorRT-LLM workflow, and the checks of
its folders that need no file system (hpc/spec/files.py reads them; hpc/spec/llmapi.py checks the llmapi
workflow's other sections).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from hpc.spec.checks import _no_newline, _Section
from hpc.spec.llmapi import WORKFLOW_HELP
from launcher.contracts.llmapi import (
    ENGINE,
    IMAGE_MODEL,
    IMAGE_MODEL_DIR,
    LLMAPI,
    LLMAPI_MODELS,
    MODEL_FILES,
    OWN_MODEL,
    WORKFLOWS,
)


class ModelInit(_Section):
    """Create a small random-weight checkpoint if `checkpoint_dir` does not exist (CPU backend only)."""

    family: Literal["gpt2", "llama"] = Field("gpt2", description="the architecture of the checkpoint made")
    size: Literal["tiny", "small"] = Field("tiny", description="how large a model to make")
    seed: int = Field(0, description="the random seed of its weights: the same seed makes the same checkpoint")


class ModelSpec(_Section):
    """What is served, by which engine (`backend`: TensorRT-LLM, or `cpu`, the embedded reference engine) and
    which TensorRT-LLM workflow (`workflow`: llmapi serves a Hugging Face checkpoint, engine a trtllm-build
    engine)."""

    backend: Literal["tensorrtllm", "cpu"] = Field(
        "tensorrtllm",
        description="tensorrtllm: TensorRT-LLM on GPUs; cpu: hpc-serve's embedded CPU reference engine behind the "
        "same Triton tensors (no GPU needed)",
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
        "when checkpoint_dir is missing; by hand: `hpc-serve init-model DIR`",
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
        if self.workflow == LLMAPI:
            self._llmapi_dirs()
        elif self.backend == "tensorrtllm":  # engine_dir: required unless a build: section makes it (Spec._fits)
            if self.checkpoint_dir is not None or self.init is not None:
                raise ValueError(
                    "@checkpoint_dir: with model.workflow engine, model.checkpoint_dir and model.init are for "
                    "backend: cpu; use engine_dir (or model.workflow: llmapi to serve a Hugging Face checkpoint)"
                )
            if self.tokenizer_dir is None:
                raise ValueError("@tokenizer_dir: model.backend tensorrtllm needs model.tokenizer_dir")
        else:
            if self.checkpoint_dir is None:
                raise ValueError(
                    "@checkpoint_dir: model.backend cpu needs model.checkpoint_dir (a Hugging Face folder)"
                )
            if self.engine_dir is not None:
                raise ValueError(
                    "@engine_dir: model.engine_dir is for backend: tensorrtllm; use checkpoint_dir with backend: cpu"
                )
        if self.workflow == ENGINE and self.model_files_from is not None:
            raise ValueError("@model_files_from: model.model_files_from is for model.workflow: llmapi")
        if self.workflow == ENGINE and self.llmapi_model is not None:
            raise ValueError("@llmapi_model: model.llmapi_model is for model.workflow: llmapi")
        if self.backend == "cpu" and self.pp_size != 1:
            raise ValueError(
                "@pp_size: model.pp_size must be 1 with backend: cpu (the CPU engine splits by tensor only)"
            )
        return self

    def _llmapi_dirs(self) -> None:
        """A Hugging Face checkpoint and nothing of an engine; where the image's model files are."""
        if self.engine_dir is not None:
            raise ValueError(
                "@engine_dir: model.engine_dir is a trtllm-build engine, for model.workflow: engine; the llmapi "
                "workflow serves a Hugging Face checkpoint (model.checkpoint_dir), or set model.workflow: engine"
            )
        if self.checkpoint_dir is None:
            raise ValueError(
                "@checkpoint_dir: model.workflow llmapi needs model.checkpoint_dir (a Hugging Face checkpoint folder: "
                "config.json, *.safetensors, tokenizer files)"
            )
        if self.tokenizer_dir is not None:
            raise ValueError(
                "@tokenizer_dir: the llmapi workflow reads the tokenizer from model.checkpoint_dir; "
                "to use another folder, set llm_api.tokenizer"
            )
        if self.init is not None and self.backend != "cpu":
            raise ValueError("@init: model.init makes a random-weight checkpoint for backend: cpu only")
        given = self.llmapi_model is not None
        if not given:
            self.llmapi_model = IMAGE_MODEL if self.model_files_from is not None else OWN_MODEL
        if self.llmapi_model == OWN_MODEL and self.model_files_from is not None:
            raise ValueError(
                "@model_files_from: model.model_files_from names the image's model files, for llmapi_model: image; "
                "remove it to serve hpc-serve's model"
            )
        if self.llmapi_model == IMAGE_MODEL:
            if self.backend == "cpu":
                field = "llmapi_model" if given else "model_files_from"
                raise ValueError(
                    f"@{field}: the image's model.py runs only over TensorRT-LLM (backend: tensorrtllm); "
                    f"backend cpu serves hpc-serve's model: remove model.{field}"
                )
            if self.model_files_from is None:
                self.model_files_from = IMAGE_MODEL_DIR

    @property
    def source_dir(self) -> Path:
        """The folder the model reads: the engine (`gpt_model_path`) of the engine workflow's TensorRT-LLM, the
        Hugging Face checkpoint otherwise."""
        if self.backend == "tensorrtllm" and self.workflow == ENGINE:
            return self.engine_dir  # type: ignore[return-value]
        return self.checkpoint_dir  # type: ignore[return-value]

    @property
    def tokenizer(self) -> Path:
        return self.tokenizer_dir or self.source_dir
