"""What one `hpc-serve bench` run measured: a record per request, and the summary the table, the JSON and the
plots show.

Definitions (the ones vLLM's and genai-perf's reports use, so numbers compare): latency = send → last piece;
TTFT = send → first piece; ITL = the gaps between consecutive pieces of a stream (every gap of every request is
one sample: a stream that stalls shows up in p99); TPOT = (latency - TTFT) / (output tokens - 1) per request.
"send" is when the request went out, after `--concurrency` let it (vLLM's benchmark does the same): a bound
models that many users each waiting for an answer before asking again, and their wait for a turn is the
client's, not the deployment's; the scheduled time is kept for the timeline. Throughput is over the run's wall time, first send to last
answer. Goodput: requests per second that finished without error within `--slo-ttft` and `--slo-itl` (ms; a
request meets the ITL SLO when its mean gap, TPOT, is within it: DistServe's and vLLM's definition; an answer
with no text, which a model that emits its end token first gives, meets the TTFT SLO when its latency does).
Percentiles are numpy's linear interpolation between closest ranks (numpy.percentile's default). Where the
engine reports its timestamps (the llmapi workflow), each request's latency is split into the time outside the
engine, queueing, prefill and decode (hpc/serving/engine_timing.py), each part's distribution in ms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hpc.serving.engine_timing import PARTS, TIMESTAMPS, split

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request as the load generator saw it; times in seconds from the run's start."""

    index: int
    scheduled: float
    input_tokens: int
    max_tokens: int
    sent: float = 0.0
    first: float | None = None
    end: float | None = None
    output_tokens: int = 0
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive pieces
    error: str | None = None  # the kind (ClientError subclass, timeout, …); None: it succeeded
    #: the engine's timestamps of the request (engine_timing.TIMESTAMPS), empty where it reports none
    engine: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.sent

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def tpot(self) -> float | None:
        if self.end is None or self.first is None or self.output_tokens < 2:
            return None
        return (self.end - self.first) / (self.output_tokens - 1)

    @property
    def parts(self) -> dict[str, float] | None:
        """Its latency split (engine_timing.PARTS, seconds), None without the engine's timestamps."""
        if not self.ok or self.latency is None or len(self.engine) != len(TIMESTAMPS):
            return None
        return split(self.latency, self.engine)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row.pop("gaps")
        row.pop("engine")
        row.update(
            latency=self.latency, ttft=self.ttft, tpot=self.tpot, pieces=len(self.gaps) + (self.first is not None)
        )
        parts = self.parts or {}
        row.update({part: parts.get(part) for part in PARTS})
        return row


def distribution(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """mean and p50/p90/p99 of `values` × `scale` (seconds → ms by default); None each when there are none."""
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    array = np.asarray(values, dtype=float) * scale
    return {"mean": float(array.mean()), **{f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES}}


def meets_slo(record: RequestRecord, slo_ttft_ms: float | None, slo_itl_ms: float | None) -> bool:
    if not record.ok:
        return False
    first = record.ttft if record.ttft is not None else record.latency  # an empty answer: its end is its first
    if slo_ttft_ms is not None and (first is None or first * 1000 > slo_ttft_ms):
        return False
    tpot = record.tpot
    return slo_itl_ms is None or tpot is None or tpot * 1000 <= slo_itl_ms


def summarize(
    records: list[RequestRecord], slo_ttft_ms: float | None = None, slo_itl_ms: float | None = None
) -> dict[str, Any]:
    """The run's numbers (JSON-ready): counts, throughput, latency / TTFT / ITL / TPOT distributions in ms,
    errors by kind, and goodput when an SLO was given."""
    done = [r for r in records if r.ok]
    started = [r.sent for r in records]
    ended = [r.end for r in records if r.end is not None]
    wall = (max(ended) - min(started)) if ended and started else 0.0
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    output = sum(r.output_tokens for r in done)
    summary: dict[str, Any] = {
        "requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration_s": wall,
        "requests_per_s": len(done) / wall if wall else 0.0,
        "input_tokens": sum(r.input_tokens for r in done),
        "output_tokens": output,
        "output_tokens_per_s": output / wall if wall else 0.0,
        "latency_ms": distribution([r.latency for r in done if r.latency is not None]),
        "ttft_ms": distribution([r.ttft for r in done if r.ttft is not None]),
        "itl_ms": distribution([g for r in done for g in r.gaps]),
        "tpot_ms": distribution([t for r in done if (t := r.tpot) is not None]),
        "errors": errors,
    }
    split_up = [parts for r in done if (parts := r.parts) is not None]
    if split_up:
        summary["latency_split_ms"] = {
            "requests": len(split_up),
            **{part: distribution([parts[part] for parts in split_up]) for part in PARTS},
        }
    if slo_ttft_ms is not None or slo_itl_ms is not None:
        good = sum(meets_slo(r, slo_ttft_ms, slo_itl_ms) for r in records)
        summary["goodput"] = {
            "slo_ttft_ms": slo_ttft_ms,
            "slo_itl_ms": slo_itl_ms,
            "good_requests": good,
            "requests_per_s": good / wall if wall else 0.0,
            "share": good / len(records) if records else 0.0,
        }
    return summary
