"""Stand-in of the llmapi model's helpers.py (scripts/gpu/prove_llmapi_gpus.py): request parsing and what the model
reports about the environment tritonserver gave it."""

from __future__ import annotations

import os
from typing import Any

import triton_python_backend_utils as pb_utils

PROXY_VARS = ("TLLM_SPAWN_PROXY_PROCESS", "TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR", "TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY")


def environment_seen() -> dict[str, Any]:
    """The proxy variables (the key only as its length: it is a secret), the names of all variables (the proof
    looks for MPI/Slurm ones), the GPUs."""
    env = os.environ
    proxy = {name: env.get(name) for name in PROXY_VARS}
    key = proxy[PROXY_VARS[2]]
    proxy[PROXY_VARS[2]] = f"<{len(key)} hex chars>" if key else None
    seen: dict[str, Any] = {
        "pid": os.getpid(),
        "proxy": proxy,
        "env_names": sorted(env),
        "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES"),
    }
    try:  # what TensorRT-LLM's LLM() in this process would count (its gpus_per_node default, its dtype check)
        import torch

        seen["device_count"] = torch.cuda.device_count()
    except Exception as exc:
        seen["device_count"] = f"{type(exc).__name__}: {exc}"
    return seen


def prompt_of(request: Any) -> str:
    tensor = pb_utils.get_input_tensor_by_name(request, "text_input")
    if tensor is None:
        raise pb_utils.TritonModelException("text_input is missing from the request")
    return tensor.as_numpy().flatten()[0].decode("utf-8")


def max_tokens_of(request: Any, default: int = 16) -> int:
    tensor = pb_utils.get_input_tensor_by_name(request, "sampling_param_max_tokens")
    return default if tensor is None else int(tensor.as_numpy().flatten()[0])
