"""A request's time inside the engine, from the llmapi model's perf metrics (`sampling_param_return_perf_metrics`,
TensorRT-LLM's RequestPerfMetrics): when the engine got the request (arrival), first scheduled it, made its
first token and its last. `hpc-serve bench` splits each request's latency with them into the time outside the
engine (the network, the gateway, the model's tokenizing and its IPC: the client's latency less the engine's),
queueing (arrival → first scheduled), prefill (→ first token) and decode (→ last token). Each part is a
difference of two clocks of one machine (the client's, or the engine's), so no clock needs to agree with another.

How the times reach a client: direct to a replica, in the generation's last response (hpc/serving/model_io.py
`Chunk.perf`); through the gateway, asked with the request header `TIMING_HEADER`, in the last event of the
stream (or the answer's JSON) as the field `TIMING_FIELD`. The field is hpc-serve's own, sent only to a client
that asked, so OpenAI clients see the answers they expect.
"""

from __future__ import annotations

from collections.abc import Mapping

#: the request header that asks the gateway for the engine's timestamps (any value)
TIMING_HEADER = "x-hpc-serve-engine-timing"
#: the answer's field (the last stream event's, or the JSON answer's) that carries them
TIMING_FIELD = "hpc_serve_engine_timing"
#: the engine's timestamps (ns since the epoch, on the engine's clock), in their order
TIMESTAMPS = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
#: the parts of a request's latency, in order (what bench's table, JSON and plot show)
PARTS = ("outside", "queue", "prefill", "decode")


def timestamps(perf: Mapping[str, float] | None) -> dict[str, int] | None:
    """The engine's four timestamps out of a generation's perf metrics; None when any is missing or unset (0)."""
    if not perf:
        return None
    found = {name: int(perf.get(name) or 0) for name in TIMESTAMPS}
    return found if all(found.values()) else None


def split(latency_s: float, stamps: Mapping[str, int]) -> dict[str, float]:
    """A request's latency (seconds, on the client's clock) in PARTS, seconds; `outside` is what the engine's own
    span (arrival → last token) leaves of it (never below 0: the two clocks tick alike, but a model that reports
    its last token before its last response left adds a little on its side)."""
    arrival, scheduled, first, last = (stamps[name] / 1e9 for name in TIMESTAMPS)
    return {
        "outside": max(0.0, latency_s - (last - arrival)),
        "queue": max(0.0, scheduled - arrival),
        "prefill": max(0.0, first - scheduled),
        "decode": max(0.0, last - first),
    }
