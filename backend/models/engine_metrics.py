"""The CPU engine's gauges on tritonserver's metrics page, under the TensorRT-LLM backend's own family and label
names (`nv_trt_llm_*`), so `hpc-serve metrics`, dashboards and scripts written for a GPU deployment read a CPU one
unchanged. Apart from the model because the names are a contract of their own; the stub's `pb_utils` is handed
in (it exists only inside the python-backend stub).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names alone are imported by the login node's tools (hpc/bench), without numpy
    from backend.cpu_engine.stats import EngineStats

from launcher.contracts.prometheus import ENGINE_BATCHER_FAMILY as BATCHER
from launcher.contracts.prometheus import ENGINE_GENERAL_FAMILY as GENERAL
from launcher.contracts.prometheus import ENGINE_KV_CACHE_FAMILY as KV_CACHE
from launcher.contracts.prometheus import ENGINE_REQUEST_FAMILY as REQUEST
from launcher.contracts.prometheus import MODEL_IN_FLIGHT_FAMILY

#: each family's label and description, as tensorrtllm_backend's custom metrics reporter names them
FAMILIES = {
    REQUEST: ("request_type", "TRT LLM request metrics"),
    KV_CACHE: ("kv_cache_block_type", "TRT LLM KV cache block metrics"),
    BATCHER: ("inflight_batcher_specific_metric", "TRT LLM inflight batcher metrics"),
    GENERAL: ("general_type", "General TRT LLM metrics"),
}


def readings(s: EngineStats | SimpleNamespace) -> dict[tuple[str, str], float]:
    """(family, label value) → one engine step's reading; `timestamp` is now, in microseconds, as upstream's."""
    return {
        (REQUEST, "active"): s.active_requests,
        (REQUEST, "max"): s.max_requests,
        (REQUEST, "scheduled"): s.scheduled_requests,
        (REQUEST, "context"): s.context_requests,
        (REQUEST, "waiting"): s.waiting_requests,
        (REQUEST, "completed"): s.completed_requests,
        (KV_CACHE, "used"): s.used_blocks,
        (KV_CACHE, "free"): s.free_blocks,
        (KV_CACHE, "max"): s.max_blocks,
        (KV_CACHE, "tokens_per"): s.tokens_per_block,
        (BATCHER, "total_context_tokens"): s.context_tokens,
        (BATCHER, "generation_requests"): s.generation_requests,
        (BATCHER, "micro_batch_id"): 0,
        (BATCHER, "paused_requests"): 0,
        (GENERAL, "iteration_counter"): s.iterations,
        (GENERAL, "timestamp"): time.time_ns() // 1000,
    }


def from_iteration(it: Mapping[str, Any]) -> SimpleNamespace:
    """The counts of one of the LLM API's iteration stats (`LLM.get_stats_async`: TensorRT-LLM's IterationStats as
    JSON), under EngineStats' names; a key the release does not send reads 0."""
    batch = it.get("inflightBatchingStats") or {}
    kv = it.get("kvCacheStats") or {}
    return SimpleNamespace(
        active_requests=it.get("numActiveRequests", 0),
        scheduled_requests=batch.get("numScheduledRequests", 0),
        waiting_requests=it.get("numQueuedRequests", 0),
        max_requests=it.get("maxNumActiveRequests", 0),
        context_requests=batch.get("numContextRequests", 0),
        generation_requests=batch.get("numGenRequests", 0),
        context_tokens=batch.get("numCtxTokens", 0),
        completed_requests=it.get("numCompletedRequests", 0),
        iterations=it.get("iter", 0),
        used_blocks=kv.get("usedNumBlocks", 0),
        free_blocks=kv.get("freeNumBlocks", 0),
        max_blocks=kv.get("maxNumBlocks", 0),
        tokens_per_block=kv.get("tokensPerBlock", 0),
    )


def idle_iteration(it: Mapping[str, Any]) -> dict[str, Any]:
    """An iteration's stats as an engine that stopped stepping has them: no request active, queued or scheduled
    (the KV cache and the counts so far as they were)."""
    batch = dict(it.get("inflightBatchingStats") or {})
    batch.update(numScheduledRequests=0, numContextRequests=0, numGenRequests=0, numCtxTokens=0)
    return {**it, "numActiveRequests": 0, "numQueuedRequests": 0, "inflightBatchingStats": batch}


class EngineMetrics:
    """The gauges of one model instance: made in `initialize` from the engine's first stats (none yet: zeros), set
    after each step."""

    def __init__(
        self, pb_utils: Any, model_name: str, model_version: str, first: EngineStats | SimpleNamespace | None
    ) -> None:
        first = first if first is not None else from_iteration({})
        base = {"model": model_name, "version": model_version}
        gauge = pb_utils.MetricFamily.GAUGE
        self._families = {  # kept alive with the model: the stub drops a family's gauges with it
            name: pb_utils.MetricFamily(name=name, description=description, kind=gauge)
            for name, (_, description) in FAMILIES.items()
        }
        self._gauges = {
            (name, kind): self._families[name].Metric(labels={**base, FAMILIES[name][0]: kind})
            for name, kind in readings(first)
        }
        self.update(first)

    def update(self, stats: EngineStats | SimpleNamespace) -> None:
        for key, value in readings(stats).items():
            if (gauge := self._gauges.get(key)) is not None:  # none after release()
                gauge.set(float(value))

    def update_from_iteration(self, it: Mapping[str, Any]) -> None:
        self.update(from_iteration(it))

    def release(self) -> None:
        """Drop the stub's metric objects now, while the stub is whole (see TritonPythonModel.finalize)."""
        self._gauges.clear()
        self._families.clear()


class RequestsInFlight:
    """hpc-serve's llmapi model's own count of the requests it holds (`hpc_serve_model_requests_in_flight`): what
    a drain reads beside the engine's gauges, which go stale when the LLM's stats stop coming while requests run
    (upstream's IterationResult ends for good after one read timed out, until the next request)."""

    def __init__(self, pb_utils: Any, model_name: str, model_version: str) -> None:
        self._family: Any = pb_utils.MetricFamily(
            name=MODEL_IN_FLIGHT_FAMILY,
            description="Requests hpc-serve's model holds in the engine",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self._gauge: Any = self._family.Metric(labels={"model": model_name, "version": model_version})
        self._gauge.set(0.0)

    def set(self, count: int) -> None:
        if self._gauge is not None:  # none after release()
            self._gauge.set(float(count))

    def release(self) -> None:
        self._gauge = self._family = None
