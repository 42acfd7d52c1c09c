"""The llmapi workflow's model repository from the spec: model.yaml's content, and where model.py comes from.

model.yaml holds what the `tensorrt_llm` model passes to `LLM(**args)` plus its `triton_config` (upstream's
model.py and hpc-serve's read every key but triton_config as an LLM argument). What the spec decides elsewhere is
written here, once: the checkpoint (`model`), the parallel sizes, `gpus_per_node` (TensorRT-LLM's ranks per node
of the replica: `Mapping.local_rank = rank % gpus_per_node`); then the `llm_api:` section's keys as given; then,
for hpc-serve's model, `kv_cache_config.event_buffer_max_size` where the spec left it out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.contracts.llmapi import CANCELLATION_CHECK_PERIOD_MS, KV_EVENT_BUFFER, MODEL_FILES, OWN_MODEL

if TYPE_CHECKING:
    from hpc.spec import Spec


def model_yaml_args(spec: Spec) -> dict[str, Any]:
    """model.yaml's mapping: the LLM arguments, then triton_config."""
    m = spec.model
    args: dict[str, Any] = {
        "model": str(m.checkpoint_dir),
        "tensor_parallel_size": m.tp_size,
        "pipeline_parallel_size": m.pp_size,
        "gpus_per_node": min(spec.world_size_per_replica, spec.tasks_per_node),
    }
    if spec.llm_api is not None:
        args.update(spec.llm_api.arguments())
    if m.llmapi_model == OWN_MODEL:
        # hpc-serve's model keeps the engine's KV-cache events for the gateway's cache-aware routing
        # (hpc/serving/kv_events.py), unless the spec says otherwise (0: none)
        kv = args.get("kv_cache_config")
        kv = dict(kv) if isinstance(kv, dict) else {}
        kv.setdefault("event_buffer_max_size", KV_EVENT_BUFFER)
        args["kv_cache_config"] = kv
    # max_batch_size 0 is filled in by backend/llmapi_repository.py (with_triton_config), which owns the rule
    args["triton_config"] = {
        "decoupled": spec.triton.decoupled,
        "cancellation_check_period_ms": CANCELLATION_CHECK_PERIOD_MS,
    }
    return args


def model_yaml_header(spec: Spec) -> str:
    """The comment model.yaml opens with: where it comes from."""
    return (
        f"# {spec.name}: TensorRT-LLM LLM API arguments, written by `hpc-serve render` from the spec (model, the\n"
        "# parallel sizes and gpus_per_node from its model: and slurm: sections, the rest from llm_api:).\n"
        "# triton_config is read by the tensorrt_llm python model, not by LLM(); edit the spec, not this file.\n"
    )


def model_files_source(spec: Spec) -> str:
    """Where the running model's model.py comes from, for `render`'s output."""
    from backend.llmapi_repository import LLMAPI_MODULE

    m = spec.model
    if m.llmapi_model == OWN_MODEL:
        engine = m.backend_strategy.llmapi_engine_words
        return f"model.py: hpc-serve's llmapi model ({LLMAPI_MODULE}, a shim in the repository) over {engine}"
    where = "inside the image" if spec.container.type != "none" else "on each node"
    return (
        f"model.py: {' and '.join(MODEL_FILES)} are copied from {m.model_files_from} ({where}) into "
        "tensorrt_llm/1/ when each replica starts (model.model_files_from); a missing file fails the job"
    )
