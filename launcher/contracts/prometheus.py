"""The one parser of Prometheus' text format (what tritonserver's /metrics page sends), standard library only.

Two sides read that page: a stopping leader and the renewer count the requests still in flight
(`renew_plan.active_requests`), on a compute node where only the source tree may be mounted (no
prometheus_client); `hpc-serve metrics` and the benchmarks show every family (hpc/serving/metrics.py). Both read it
here, so a label value with a comma, a brace or an escaped quote reads the same on both sides.

What it reads (the text exposition format 0.0.4): `# HELP` and `# TYPE` lines (the type groups the samples
that follow into a family: a histogram's `_bucket`/`_sum`/`_count`, a summary's `_sum`/`_count`), other
comments (skipped), samples `name{label="value",…} value [timestamp]` with `\\\\`, `\\"` and `\\n` escaped in a
value, and NaN/+Inf/-Inf. A line it cannot read raises ValueError naming its number.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

#: TensorRT-LLM's backend's engine families (tensorrtllm_backend's custom metrics reporter; the CPU engine exports the
#: same names, backend/models/engine_metrics.py): who reads them (a stopping leader, the renewer, `hpc-serve
#: metrics`) and who writes them take the names from here
ENGINE_REQUEST_FAMILY = "nv_trt_llm_request_metrics"
ENGINE_KV_CACHE_FAMILY = "nv_trt_llm_kv_cache_block_metrics"
ENGINE_BATCHER_FAMILY = "nv_trt_llm_inflight_batcher_metrics"
ENGINE_GENERAL_FAMILY = "nv_trt_llm_general_metrics"
#: hpc-serve's llmapi model's own count of the requests it holds (submitted to the LLM, their end not yet seen): the
#: engine's stats can stop coming while requests run (backend/models/llmapi.py), so a drain reads both
MODEL_IN_FLIGHT_FAMILY = "hpc_serve_model_requests_in_flight"
#: requests tritonserver itself holds in a model's queue, not handed to the model yet (any model, any backend)
PENDING_FAMILY = "nv_inference_pending_request_count"

#: `name{labels} value [timestamp]`: the labels are everything to the last `}` (a value may hold one)
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?")
#: one `label="value"`, and the comma after it (optional after the last one)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}
#: the sample names of a family of each type besides the family's own
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


@dataclass(frozen=True)
class MetricSample:
    """One sample as the page says it: its family (`# TYPE`'s name, else its own) and that family's type
    (counter, gauge, histogram, summary; untyped without a TYPE line)."""

    name: str
    labels: dict[str, str]
    value: float
    family: str = ""
    kind: str = "untyped"


@dataclass
class _Family:
    name: str = ""
    kind: str = "untyped"
    names: set[str] = field(default_factory=set)  # the sample names that belong to it

    @classmethod
    def typed(cls, name: str, kind: str) -> _Family:
        return cls(name, kind, {name, *(name + suffix for suffix in _SUFFIXES.get(kind, ()))})


def parse_labels(text: str) -> dict[str, str]:
    """`a="x",b="y \\"z\\""` → {"a": "x", "b": 'y "z"'} (ValueError when it is not that shape)."""
    labels: dict[str, str] = {}
    at = 0
    while at < len(text.rstrip()):
        match = _LABEL.match(text, at)
        if match is None:
            raise ValueError(f"labels {text!r}: cannot read from column {at + 1}")
        labels[match.group(1)] = _ESCAPE.sub(lambda m: _UNESCAPED.get(m.group(1), m.group(0)), match.group(2))
        at = match.end()
    return labels


def samples(text: str) -> Iterator[MetricSample]:
    """Every sample of a page, in its order."""
    family = _Family()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            words = line[1:].split(None, 3)
            if len(words) >= 3 and words[0] == "TYPE":
                family = _Family.typed(words[1], words[2])
            elif len(words) >= 2 and words[0] == "HELP" and words[1] != family.name:
                family = _Family(words[1], "untyped", {words[1]})
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise ValueError(f"metrics line {number}: not a sample: {line[:200]!r}")
        name = match.group(1)
        if name not in family.names:
            family = _Family(name, "untyped", {name})
        try:
            labels = parse_labels(match.group(2) or "")
            value = float(match.group(3))
        except ValueError as exc:
            raise ValueError(f"metrics line {number}: {exc}") from None
        yield MetricSample(name, labels, value, family.name, family.kind)
