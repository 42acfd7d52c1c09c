"""Tests that count the CPU engine's steps: the pace its steps run at, and its counters on a replica's metrics page."""

from __future__ import annotations

from tests.e2e import prometheus_samples

#: the least time a step of a test's CPU engine takes where a test counts its steps (the `min_step_ms` parameter):
#: a GPU's decode-step time. Why: the tiny model's steps take well under 1 ms, so while a stop crossed a gateway
#: starved of CPU for hundreds of ms (two busy loops on the 2 cores) the engine ran hundreds of steps; at this pace
#: the same delay is tens of steps, and a bound of "half the tokens asked" (100-120 steps) holds for any delay
#: under two seconds. 20 ms: the middle of a GPU's 10-50 ms.
GPU_PACE_MS = 20
#: a request long enough that a stop clearly lands mid-generation (the tiny checkpoint has 256 positions)
LONG_REQUEST = 200
#: the steps a request may still take once it was stopped (cancelled, its client gone): half of LONG_REQUEST,
#: 2 s at GPU_PACE_MS, which the stop's way through a contended machine (gateway, tritonserver, stub, leader
#: node) has never come near
STEPS_AFTER_STOP = LONG_REQUEST // 2


def engine_counters(metrics_url: str) -> tuple[float, float]:
    """The replica's engine decode steps so far (the CPU engine's `iteration_counter`, set at every step: one per
    generated token while it serves one request) and the requests it finished (`completed`: cancelled ones too).
    Why not a later model's count: under load the engine outruns postprocessing, whose queue still turns every
    token already made into text after a stop."""
    from backend.models.engine_metrics import FAMILIES, GENERAL, REQUEST

    samples = prometheus_samples(metrics_url.removesuffix("/metrics"))

    def gauge(family: str, kind: str) -> float:
        (value,) = [v for (n, labels), v in samples.items() if n == family and (FAMILIES[family][0], kind) in labels]
        return value

    return gauge(GENERAL, "iteration_counter"), gauge(REQUEST, "completed")
