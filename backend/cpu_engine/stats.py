"""What the engine reports after each step (`Engine.stats`): read by its Prometheus gauges (backend/models/
engine_metrics.py) and tests. A module of its own so the gauges' module can name the type without the engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """Counts for the TRT-LLM-named Prometheus metrics."""

    active_requests: int
    scheduled_requests: int
    waiting_requests: int
    max_requests: int
    context_requests: int  # prefilled in the last step
    generation_requests: int  # decoded in the last step
    context_tokens: int  # prompt tokens prefilled in the last step
    completed_requests: int
    iterations: int
    used_blocks: int
    free_blocks: int
    max_blocks: int
    tokens_per_block: int
