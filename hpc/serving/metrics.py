"""A job's Prometheus metrics, scraped from the leader's published metrics port and parsed by the one parser of
the page (launcher/contracts/prometheus.py, which the launcher's drain reads it with too): the TRT-LLM backend's
`nv_trt_llm_*` families (the CPU engine exports the same names) and Triton's own `nv_inference_*` counters, so
one view serves GPU and CPU deployments alike.

Names are those prometheus_client's parser gave, which `hpc-serve metrics --json` has always shown: a counter's
samples end in `_total` (OpenMetrics' name for them) and its family is named without it."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.contracts.prometheus import MetricSample, samples
from launcher.contracts.urls import open_direct

#: Families shown by default: what tells whether a deployment is busy, queued or out of KV cache.
DEFAULT_PREFIXES = (
    "nv_trt_llm_",
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def scrape(url: str, timeout_s: float = 10.0) -> str:
    with open_direct(url, timeout=timeout_s) as resp:  # not through $http_proxy (launcher/contracts/urls.py)
        return resp.read().decode()


def parse(text: str, prefixes: tuple[str, ...] = DEFAULT_PREFIXES, hide_zero_failures: bool = True) -> list[Sample]:
    """Samples of the families whose name starts with one of `prefixes` (all when empty). Failure counters
    that are zero (one per model and reason) are left out unless asked for: they are most of the page."""
    found = []
    for sample in samples(text):
        family, name = _names(sample)
        if prefixes and not family.startswith(prefixes):
            continue
        if hide_zero_failures and "failure" in name and sample.value == 0:
            continue
        found.append(Sample(name, sample.labels, sample.value))
    return found


def _names(sample: MetricSample) -> tuple[str, str]:
    """(family, sample name): a counter's as OpenMetrics names them (`x` and `x_total`), the others as sent."""
    if sample.kind != "counter":
        return sample.family, sample.name
    family = sample.family.removesuffix("_total")
    return family, f"{family}_total"
