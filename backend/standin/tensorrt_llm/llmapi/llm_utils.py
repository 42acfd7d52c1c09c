"""upstream's `update_llm_args_with_extra_dict` (tensorrt_llm/llmapi/llm_utils.py, from llm_args.py): what
NVIDIA's and hpc-serve's llmapi models pass model.yaml through before `LLM(**args)`. Each configuration section it
knows becomes its class, built from the mapping's keys (so an unknown key in kv_cache_config fails here, as
upstream's class refuses it); the rest passes as it is, the mapping's values over `llm_args`'."""

from __future__ import annotations

import logging
from typing import Any

from .llm_args import KvCacheConfig

log = logging.getLogger("tensorrt_llm")
#: the sections the stand-in has a class for (upstream maps more: quant_config, build_config, speculative_config,
#: lora_config, ...; the CPU engine acts on none of them, and they pass as mappings)
FIELD_MAPPING: dict[str, type] = {"kv_cache_config": KvCacheConfig}


def update_llm_args_with_extra_dict(
    llm_args: dict[str, Any], llm_args_dict: dict[str, Any], extra_llm_api_options: str | None = None
) -> dict[str, Any]:
    llm_args_dict = dict(llm_args_dict)
    for field_name, field_type in FIELD_MAPPING.items():
        if field_name in llm_args_dict:
            llm_args_dict[field_name] = field_type(**llm_args_dict[field_name])
            because = f"because it's specified in {extra_llm_api_options}" if extra_llm_api_options else ""
            log.warning(f"Overriding {field_name} {because}")
    return llm_args | llm_args_dict
