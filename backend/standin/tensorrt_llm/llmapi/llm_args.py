"""The LLM API's argument classes a model.yaml or a caller may name (tensorrt_llm/llmapi/llm_args.py upstream):
only their fields' names and defaults; `LLM` takes them as mappings too, as upstream's validators do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class KvCacheConfig:
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = None
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: float | None = None
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = 0
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    tokens_per_block: int = 32
