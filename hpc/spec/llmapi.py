"""The llmapi workflow's side of the spec: the `llm_api:` section (TensorRT-LLM's LLM API arguments, rendered into
`tensorrt_llm/1/model.yaml` by hpc/render/llmapi.py) and which spec fields belong to which workflow.

`llm_api:` names and checks the arguments most deployments set (kv_cache_config, max_batch_size, max_num_tokens,
max_seq_len, enable_chunked_prefill, cuda_graph_config, trust_remote_code); any other key passes through to
`LLM(**args)` unchanged, if the table of LLM API names (hpc/spec/llm_args.py) knows it. The arguments the spec
decides elsewhere (the parallel sizes, gpus_per_node, the checkpoint) are refused here with the field to use, so
model.yaml and the job's shape can never disagree.

The workflow checks are findings (`workflow_findings`), not one raised error, so `validate` lists every field of
the other workflow at once, each at its own line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hpc.spec.llm_args import LLM_API_ARGS, suggestion

if TYPE_CHECKING:
    from hpc.spec.schema import Spec

Finding = tuple[tuple[str, ...], str]


class _PassThrough(BaseModel):
    """A section whose named keys are checked and whose other keys go to TensorRT-LLM as they are."""

    model_config = ConfigDict(extra="allow", validate_default=True)


class KvCacheConfig(_PassThrough):
    """TensorRT-LLM's `KvCacheConfig` (tensorrt_llm/llmapi/llm_args.py): the common keys checked, others passed."""

    free_gpu_memory_fraction: float | None = Field(
        None, gt=0, le=1, description="the share of free GPU memory (after the weights) for the KV cache"
    )
    max_tokens: int | None = Field(None, ge=1, description="at most this many tokens in the KV cache")
    enable_block_reuse: bool | None = Field(None, description="reuse the KV blocks of a shared prompt prefix")
    max_attention_window: list[int] | None = Field(None, description="sliding-window sizes, per layer group")
    host_cache_size: int | None = Field(None, ge=0, description="bytes of host memory for offloaded KV blocks")
    dtype: str | None = Field(None, description="the KV cache's data type, e.g. auto or fp8")


class CudaGraphConfig(_PassThrough):
    """TensorRT-LLM's `CudaGraphConfig`; `cuda_graph_config: null` turns CUDA graphs off (upstream's meaning)."""

    batch_sizes: list[int] | None = Field(None, description="the batch sizes to capture a graph for")
    max_batch_size: int | None = Field(None, ge=0, description="capture graphs up to this batch size")
    enable_padding: bool | None = Field(None, description="pad a batch up to the next captured size")


class LlmApiSpec(_PassThrough):
    """TensorRT-LLM LLM API arguments (`LLM(**args)`), written into model.yaml. Only keys given are written:
    TensorRT-LLM's own defaults apply to the others. tensor_parallel_size and pipeline_parallel_size come from
    model.tp_size / model.pp_size, gpus_per_node from the placement (a replica's ranks per node), `model` from
    model.checkpoint_dir. Any other
    key passes through if TensorRT-LLM's table of LLM API arguments (hpc/spec/llm_args.py) has it; an unknown one is
    an error with a did-you-mean."""

    kv_cache_config: KvCacheConfig | None = Field(None, description="free_gpu_memory_fraction, max_tokens, ...")
    max_batch_size: int | None = Field(None, ge=1, description="requests batched per step (TensorRT-LLM: 2048)")
    max_num_tokens: int | None = Field(None, ge=1, description="tokens per step, all requests (TensorRT-LLM: 8192)")
    max_seq_len: int | None = Field(None, ge=1, description="prompt plus output; default the model's positions")
    enable_chunked_prefill: bool | None = Field(None, description="split long prompts over several steps")
    cuda_graph_config: CudaGraphConfig | None = Field(None, description="null: no CUDA graphs")
    trust_remote_code: bool | None = Field(None, description="run the checkpoint's own modelling code")

    @model_validator(mode="before")
    @classmethod
    def _kv_section(cls, data: Any) -> Any:
        """A kv_cache_config given as null is no KvCacheConfig: TensorRT-LLM's update_llm_args_with_extra_dict
        builds the class from the mapping, and the model fails to load (unlike cuda_graph_config, where null
        means no CUDA graphs)."""
        if isinstance(data, dict) and "kv_cache_config" in data and data["kv_cache_config"] is None:
            raise ValueError(
                "@kv_cache_config: null is not a kv_cache_config: leave it out for TensorRT-LLM's defaults, or give "
                "its keys"
            )
        return data

    def arguments(self) -> dict[str, Any]:
        """The keys the spec gave (named and passed through), nested sections likewise: model.yaml's LLM args."""
        return self.model_dump(mode="json", exclude_unset=True)


#: LLM API arguments the spec decides elsewhere → the field that sets them
DECIDED_ELSEWHERE: dict[str, str] = {
    "tensor_parallel_size": "model.tp_size",
    "pipeline_parallel_size": "model.pp_size",
    "gpus_per_node": "the placement (a replica's ranks per node: slurm.ntasks_per_node, slurm.gpus_per_node)",
    "model": "model.checkpoint_dir",
    "mpi_session": "the launcher (it runs TensorRT-LLM's leader node; there is nothing to set)",
    "_mpi_session": "the launcher (it runs TensorRT-LLM's leader node; there is nothing to set)",
    "triton_config": "triton.decoupled (hpc-serve writes model.yaml's triton_config)",
}

#: `triton:` fields of the engine workflow's model repository (ensemble, C++ backend) → what does it on llmapi
ENGINE_TRITON_FIELDS: dict[str, str] = {
    "triton_max_batch_size": "llm_api.max_batch_size",
    "batching_strategy": "nothing (the LLM API always batches in flight)",
    "batch_scheduler_policy": "llm_api.scheduler_config",
    "kv_cache_free_gpu_mem_fraction": "llm_api.kv_cache_config.free_gpu_memory_fraction",
    "max_tokens_in_paged_kv_cache": "llm_api.kv_cache_config.max_tokens",
    "max_attention_window_size": "llm_api.kv_cache_config.max_attention_window",
    "enable_kv_cache_reuse": "llm_api.kv_cache_config.enable_block_reuse",
    "exclude_input_in_output": "the request's sampling_param_exclude_input_from_output",
    "max_queue_delay_microseconds": "nothing (the LLM API schedules every step)",
    "max_queue_size": "nothing (the LLM API queues requests itself)",
    "preprocessing_instance_count": "nothing (the llmapi model tokenizes itself)",
    "postprocessing_instance_count": "nothing (the llmapi model detokenizes itself)",
    "bls_instance_count": "nothing (there is no BLS model)",
    "parameters": "llm_api (e.g. enable_chunked_context → llm_api.enable_chunked_prefill)",
}

WORKFLOW_HELP = (
    "the TensorRT-LLM workflow. llmapi: a Hugging Face checkpoint (model.checkpoint_dir) served by TensorRT-LLM's "
    "LLM API model `tensorrt_llm` (TensorRT-LLM 1.x, NGC tritonserver:*-trtllm-python-py3 since 25.09), configured "
    "by the llm_api: section. engine: a trtllm-build engine (model.engine_dir, or a build: section) served by the "
    "ensemble and the C++ backend (TensorRT-LLM <= 1.2.x or 1.3.0rc20). Left out: engine when the spec has "
    "model.engine_dir or a build: section, else llmapi; a field of the other workflow is then an error naming it, "
    "never ignored."
)


def _set_differently(section: BaseModel, name: str) -> bool:
    """True when `name` was given a value other than its default (a resolved spec.yaml writes every default)."""
    field = type(section).model_fields[name]
    default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    return name in section.model_fields_set and getattr(section, name) != default


def workflow_findings(spec: Spec) -> list[Finding]:
    """Every field of the other workflow that the spec sets, and every llm_api key that is not an LLM API
    argument or that another field decides: one finding each, at its own key (the workflow's strategy,
    hpc/spec/workflows.py, says which)."""
    return spec.model.workflow_strategy.findings(spec)


def llmapi_findings(spec: Spec) -> list[Finding]:
    """On llmapi: the engine workflow's fields the spec sets, and the llm_api keys it cannot take."""
    why = _LLMAPI_DEFAULT if spec.model._workflow_inferred else "model.workflow is llmapi"
    found: list[Finding] = []
    for name, instead in ENGINE_TRITON_FIELDS.items():
        if _set_differently(spec.triton, name):
            found.append(
                (
                    ("triton", name),
                    f"is for model.workflow: engine, but {why}; use {instead}, or set model.workflow: engine",
                )
            )
    if spec.build is not None:
        found.append((("build",), f"build: makes a TensorRT engine, for model.workflow: engine, but {why}"))
    return found + llm_api_findings(spec)


_LLMAPI_DEFAULT = "this spec is llmapi (the default for a spec without model.engine_dir or build:)"


def llm_api_findings(spec: Spec) -> list[Finding]:
    """llm_api keys that another field decides, or that no TensorRT-LLM release of the table has."""
    if spec.llm_api is None:
        return []
    found: list[Finding] = []
    for key in spec.llm_api.model_extra or {}:
        loc = ("llm_api", key)
        if key in DECIDED_ELSEWHERE:
            found.append((loc, f"is set by {DECIDED_ELSEWHERE[key]}; remove it from llm_api"))
        elif key not in LLM_API_ARGS:
            found.append((loc, f"unknown LLM API argument {key!r}{suggestion(key)}"))
    return found
