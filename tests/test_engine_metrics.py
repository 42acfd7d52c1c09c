"""The CPU engine's gauges (backend/models/engine_metrics.py): upstream's names, and released on demand.

`pb_utils` exists only inside tritonserver's python stub; the stand-in below records what the model asks of it.
The real stub is exercised end to end (tests/test_e2e_tp2_serving.py reads the page; tests/test_e2e_cluster.py
checks that a tp 2 leader exits without the segfault a gauge left to interpreter teardown caused)."""

from __future__ import annotations

import gc
import weakref
from dataclasses import fields

import pytest

from backend.cpu_engine.stats import EngineStats
from backend.models.engine_metrics import FAMILIES, EngineMetrics


class Gauge:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels, self.value = labels, None

    def set(self, value: float) -> None:
        self.value = value


class Family:
    GAUGE = "gauge"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.gauges = name, []

    def Metric(self, labels: dict[str, str]) -> Gauge:  # noqa: N802 - the stub's name
        self.gauges.append(Gauge(labels))
        return self.gauges[-1]


class StubUtils:
    MetricFamily = Family


def stats(**changes: int) -> EngineStats:
    values = {f.name: i + 1 for i, f in enumerate(fields(EngineStats))}
    return EngineStats(**(values | changes))


def test_gauges_carry_upstreams_families_labels_and_the_engines_counts() -> None:
    metrics = EngineMetrics(StubUtils, "tensorrt_llm", "1", stats())
    by_name = {(g.labels.get(FAMILIES[name][0]), name): g for (name, _), g in metrics._gauges.items()}
    assert by_name[("active", "nv_trt_llm_request_metrics")].value == stats().active_requests
    assert by_name[("max", "nv_trt_llm_kv_cache_block_metrics")].value == stats().max_blocks
    assert by_name[("max", "nv_trt_llm_request_metrics")].value == stats().max_requests
    metrics.update(stats(iterations=41))
    gauge = by_name[("iteration_counter", "nv_trt_llm_general_metrics")]
    assert gauge.value == 41 and gauge.labels == {
        "model": "tensorrt_llm",
        "version": "1",
        "general_type": "iteration_counter",
    }


@pytest.mark.slow
def test_release_lets_every_gauge_go_while_the_object_is_still_held() -> None:
    metrics = EngineMetrics(StubUtils, "tensorrt_llm", "1", stats())
    hook = metrics.update  # as the engine's on_step holds it
    gauges = [weakref.ref(g) for g in metrics._gauges.values()]
    families = [weakref.ref(f) for f in metrics._families.values()]
    metrics.release()
    gc.collect()
    assert not [r for r in gauges + families if r() is not None]
    hook(stats())  # a step that ends after the release sets nothing and does not fail


def test_an_engine_that_stopped_stepping_holds_no_request_in_its_gauges() -> None:
    """The LLM API yields iteration stats only while the engine steps: the last one may count a request aborted in
    it (a client gone), and no later one says it is gone. The model sets that one's `idle_iteration` once a read
    ended (no iteration for a second): no request active, queued or scheduled; the KV cache as it was."""
    from backend.models.engine_metrics import idle_iteration

    last = {
        "iter": 9,
        "numActiveRequests": 1,
        "numQueuedRequests": 2,
        "numCompletedRequests": 5,
        "inflightBatchingStats": {"numScheduledRequests": 1, "numGenRequests": 1, "numContextRequests": 0},
        "kvCacheStats": {"usedNumBlocks": 3, "maxNumBlocks": 8},
    }
    metrics = EngineMetrics(StubUtils, "tensorrt_llm", "1", None)
    metrics.update_from_iteration(last)
    metrics.update_from_iteration(idle_iteration(last))
    by_name = {(g.labels.get(FAMILIES[name][0]), name): g for (name, _), g in metrics._gauges.items()}
    for kind in ("active", "waiting", "scheduled"):
        assert by_name[(kind, "nv_trt_llm_request_metrics")].value == 0, kind
    assert by_name[("used", "nv_trt_llm_kv_cache_block_metrics")].value == 3
    assert by_name[("iteration_counter", "nv_trt_llm_general_metrics")].value == 9
    assert last["numActiveRequests"] == 1, "the engine's own stats are left as they were"
