"""How a model's refusal of a request reads: launcher/contracts/refusals.py (the gateway matches the same words); the
CPU engine's modules import them from here."""

from __future__ import annotations

from launcher.contracts.refusals import (
    BUSY_MARKERS,
    CONTEXT_MARKERS,
    CPU_CONTEXT,
    CPU_STOPPING,
    LLMAPI_CONTEXT,
    STOPPING_MARKERS,
    TRITON_STOPPING,
    TRTLLM_CONTEXT,
)

__all__ = [
    "BUSY_MARKERS",
    "CONTEXT_MARKERS",
    "CPU_CONTEXT",
    "CPU_STOPPING",
    "LLMAPI_CONTEXT",
    "STOPPING_MARKERS",
    "TRITON_STOPPING",
    "TRTLLM_CONTEXT",
]
