"""A job's Prometheus metrics, scraped from the leader's published metrics port and parsed with
prometheus_client's parser: the TRT-LLM backend's `nv_trt_llm_*` families (the CPU engine exports the same
names) and Triton's own `nv_inference_*` counters, so one view serves GPU and CPU deployments alike."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from launcher.urls import open_direct

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
    with open_direct(url, timeout=timeout_s) as resp:  # not through $http_proxy (launcher/urls.py)
        return resp.read().decode()


def parse(text: str, prefixes: tuple[str, ...] = DEFAULT_PREFIXES, hide_zero_failures: bool = True) -> list[Sample]:
    """Samples of the families whose name starts with one of `prefixes` (all when empty). Failure counters
    that are zero (one per model and reason) are left out unless asked for: they are most of the page."""
    samples = []
    for family in text_string_to_metric_families(text):
        if prefixes and not family.name.startswith(prefixes):
            continue
        for sample in family.samples:
            if hide_zero_failures and "failure" in sample.name and sample.value == 0:
                continue
            samples.append(Sample(sample.name, dict(sample.labels), float(sample.value)))
    return samples
