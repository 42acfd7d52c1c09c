"""The spec side of the one table of tensorrt_llm parameters (backend/repository.py owns types and choices).

Which `triton:` fields set which repository parameter (render maps the spec with it), which parameters a spec
field already decides, and the check of `triton.parameters` entries against both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.repository import normalize_parameter

if TYPE_CHECKING:
    from hpc.spec.schema import Spec

#: `triton:` field → the repository parameter it sets (hpc/render/jobfiles.py maps the spec with this table).
NAMED_PARAMETERS: dict[str, str] = {
    "triton_max_batch_size": "triton_max_batch_size",
    "decoupled": "decoupled_mode",
    "batching_strategy": "batching_strategy",
    "batch_scheduler_policy": "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction": "kv_cache_free_gpu_mem_fraction",
    "max_tokens_in_paged_kv_cache": "max_tokens_in_paged_kv_cache",
    "max_attention_window_size": "max_attention_window_size",
    "enable_kv_cache_reuse": "enable_kv_cache_reuse",
    "exclude_input_in_output": "exclude_input_in_output",
    "max_queue_delay_microseconds": "max_queue_delay_microseconds",
    "max_queue_size": "max_queue_size",
    "preprocessing_instance_count": "preprocessing_instance_count",
    "postprocessing_instance_count": "postprocessing_instance_count",
    "bls_instance_count": "bls_instance_count",
}
#: Repository parameters a spec field decides; `triton.parameters` may not set them a second time.
PARAMETER_OWNERS: dict[str, str] = {
    **{param: f"triton.{field}" for field, param in NAMED_PARAMETERS.items()},
    "engine_dir": "model.engine_dir (or model.checkpoint_dir)",
    "tokenizer_dir": "model.tokenizer_dir",
    "tp_size": "model.tp_size",
    "pp_size": "model.pp_size",
    "triton_backend": "model.backend",
}


def parameter_findings(spec: Spec) -> list[tuple[tuple[str, ...], str]]:
    """Every `triton.parameters` entry that a named spec field already sets, or whose value has the wrong type
    (the repository's own check, so `validate` catches what `render` would refuse)."""
    findings: list[tuple[tuple[str, ...], str]] = []
    if not spec.workflow_strategy.ensemble_repository:  # no parameters: hpc/spec/llmapi.py refuses the section
        return findings
    for key, value in spec.triton.parameters.items():
        loc = ("triton", "parameters", key)
        owner = PARAMETER_OWNERS.get(key)
        if owner:
            findings.append((loc, f"{key} is set by {owner}; set it there and remove it from triton.parameters"))
            continue
        try:
            normalize_parameter(key, value)
        except ValueError as e:
            findings.append((loc, str(e)))
    return findings
