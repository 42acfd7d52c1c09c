"""`hpc-serve metrics TARGET`: every replica's Prometheus page (its endpoint record's `metrics_url`), parsed by
hpc/serving/metrics.py (launcher/contracts/prometheus.py's parser), per replica and summed; and the rates `--watch` shows.

The names are upstream's: the TensorRT-LLM backend's `nv_trt_llm_*` gauges (request_metrics by request_type:
active/scheduled/waiting/context/max/completed; kv_cache_block_metrics by kv_cache_block_type: used/free/max/
tokens_per; inflight_batcher_metrics; general_metrics) and Triton's `nv_inference_*` counters per model. The CPU
engine exports the same families, so one view serves both. Tokens: upstream's `nv_llm_output_token_len`
histogram (Triton ≥ 24.08 with the TRT-LLM backend) counts output tokens; where it is missing (the CPU engine,
older Triton), the postprocessing model's inference count is used: it runs once per streamed response, i.e.
per token of a stream (and once per whole answer otherwise), and the table says which it used.

With a gateway in front of the deployment (its live gateway record), the gateway's own per-replica families
(hpc/gateway/metrics.py `hpc_serve_gateway_replica_*`: requests in flight, KV-cache blocks its requests found
cached and not) join each replica's row: on the llmapi workflow they are the in-flight and reuse figures the
model itself does not publish.

Why summed over replicas: sizing asks what the deployment does, and a gauge such as used KV-cache blocks or
waiting requests adds up across replicas. Gauges whose sum means nothing (tokens per block, a timestamp, a
micro-batch id) are shown per replica only.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hpc.serving.deployment import replica_key  # the gateway's keys: `33@twin/0` (job ids are per cluster)
from hpc.serving.metrics import DEFAULT_PREFIXES, Sample, parse, scrape
from launcher.contracts import model_names
from launcher.contracts.prometheus import ENGINE_KV_CACHE_FAMILY as KV_CACHE
from launcher.contracts.prometheus import ENGINE_REQUEST_FAMILY as REQUEST
from launcher.contracts.records import EndpointRecord

#: upstream's output-token histogram (name without _sum / _count)
TOKEN_HISTOGRAM = "nv_llm_output_token_len"
PREFIXES = (*DEFAULT_PREFIXES, TOKEN_HISTOGRAM, "nv_inference_request_duration_us", "nv_inference_pending_request")
#: label values of gauges whose sum over replicas means nothing
NOT_SUMMED = frozenset({"tokens_per", "timestamp", "micro_batch_id", "iteration_counter", "max_num_sequences"})


def key_of(name: str, labels: dict[str, str]) -> str:
    """`name{label=value,…}` without `version` (always 1 here) and without the `_total` hpc/serving/metrics.py names a
    counter's samples with (as prometheus_client did): one row of the table, the same name as on the page."""
    name = name.removesuffix("_total")
    shown = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "version")
    return f"{name}{{{shown}}}" if shown else name


@dataclass
class Snapshot:
    """One scrape of every replica: replica key (`job/replica`) → metric key → value; `errors`: replica → why
    its page could not be read; `at`: time.monotonic() of the scrape."""

    at: float
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def to_json(self) -> list[dict]:
        """Every sample as hpc/serving/metrics.py parsed it, with its replica (`job/replica`)."""
        return [{"replica": r, **vars(s)} for r, found in sorted(self.samples.items()) for s in found]

    def total(self, key: str) -> float | None:
        found = [v[key] for v in self.values.values() if key in v]
        return sum(found) if found else None

    def keys(self) -> list[str]:
        return sorted({k for v in self.values.values() for k in v})


def summable(key: str) -> bool:
    return not any(f"={label}" in key for label in NOT_SUMMED)


#: the gateway's per-replica families (hpc/gateway/metrics.py), label `replica` = the replica's key
GATEWAY_PREFIX = "hpc_serve_gateway_replica_"
GATEWAY_IN_FLIGHT = f"{GATEWAY_PREFIX}outstanding"
GATEWAY_KV = (f"{GATEWAY_PREFIX}kv_reused_blocks", f"{GATEWAY_PREFIX}kv_missed_blocks")


def add_gateway(snapshot: Snapshot, gateway_url: str, timeout_s: float = 5.0) -> None:
    """The gateway's per-replica values, into the rows of the replicas scraped (a gateway that does not answer
    is noted in `errors` as "gateway")."""
    try:
        found = parse(scrape(f"{gateway_url.rstrip('/')}/metrics", timeout_s), prefixes=(GATEWAY_PREFIX,))
    except Exception as exc:  # noqa: BLE001 - shown, not fatal: the replicas' own pages were read
        snapshot.errors["gateway"] = f"{type(exc).__name__}: {exc}"
        return
    for sample in found:
        replica = sample.labels.get("replica", "")
        if replica not in snapshot.values:
            continue
        labels = {k: v for k, v in sample.labels.items() if k != "replica"}
        snapshot.values[replica][key_of(sample.name, labels)] = sample.value
        snapshot.samples[replica].append(Sample(sample.name, labels, sample.value))


def take(
    endpoints: Sequence[EndpointRecord],
    timeout_s: float = 5.0,
    everything: bool = False,
    gateway_url: str | None = None,
) -> Snapshot:
    """Scrape every replica at once (threads: each page is one blocking HTTP GET), and the gateway's page."""
    import time

    def one(endpoint: EndpointRecord) -> list[Sample]:
        return parse(scrape(endpoint.metrics_url, timeout_s), prefixes=() if everything else PREFIXES)

    snapshot = Snapshot(time.monotonic())
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(endpoints)))) as pool:
        futures = {replica_key(e): pool.submit(one, e) for e in endpoints}
        for key, future in futures.items():
            try:
                found = snapshot.samples[key] = future.result()
                snapshot.values[key] = {key_of(s.name, s.labels): s.value for s in found}
            except Exception as exc:  # noqa: BLE001 - a replica that does not answer is shown, not fatal
                snapshot.errors[key] = f"{type(exc).__name__}: {exc}"
    if gateway_url is not None:
        add_gateway(snapshot, gateway_url, timeout_s)
    return snapshot


def _value(values: dict[str, float], name: str, **labels: str) -> float | None:
    return values.get(key_of(name, labels))


def _model_counter(values: dict[str, float], name: str) -> float | None:
    """A per-model counter of the ensemble, else of tensorrt_llm (a deployment serving the BLS model)."""
    for model in (model_names.ENSEMBLE, model_names.TENSORRT_LLM):
        found = _value(values, name, model=model)
        if found:
            return found
    return _value(values, name, model=model_names.ENSEMBLE)


def token_count(values: dict[str, float]) -> tuple[float | None, str]:
    """Output tokens so far and where the number comes from."""
    histogram = [v for k, v in values.items() if k.startswith(f"{TOKEN_HISTOGRAM}_sum")]
    if histogram:
        return sum(histogram), TOKEN_HISTOGRAM
    responses = _value(values, "nv_inference_count", model=model_names.POSTPROCESSING)
    if responses is None:  # the llmapi model: no postprocessing, and no token counter of its own
        return None, "none (the llmapi model counts no tokens; the gateway's metrics do)"
    return responses, f"{model_names.POSTPROCESSING} responses"


@dataclass(frozen=True)
class Rates:
    """What one replica (or the sum) did between two snapshots, and its gauges now."""

    requests_per_s: float | None
    failures_per_s: float | None
    tokens_per_s: float | None
    queue_ms: float | None  # mean queue time of the requests that finished in the interval
    active: float | None
    waiting: float | None
    kv_used: float | None
    kv_max: float | None
    token_source: str
    in_flight: float | None = None  # the gateway's requests in flight on it
    kv_reuse: float | None = None  # the share of its requests' prompt blocks found cached, in the interval


def _delta(now: float | None, before: float | None) -> float | None:
    return None if now is None or before is None else max(0.0, now - before)


def _failures(values: dict[str, float]) -> float:
    """The generation model's failed requests, every reason's summed: the ensemble's, else (llmapi) those of
    tensorrt_llm (which on the engine workflow also counts the ensemble's failures once more)."""
    failed = [(k, v) for k, v in values.items() if k.startswith("nv_inference_request_failure{")]
    for model in (model_names.ENSEMBLE, model_names.TENSORRT_LLM):
        label = f"model={model}"
        if any(label in k for k, _ in failed):
            return sum(v for k, v in failed if label in k)
    return 0.0


def rates(now: dict[str, float], before: dict[str, float], seconds: float) -> Rates:
    """Rates of one replica's (or the summed) values between `before` and `now`, `seconds` apart."""
    done = _delta(
        _model_counter(now, "nv_inference_request_success"), _model_counter(before, "nv_inference_request_success")
    )
    failed_now, failed_before = _failures(now), _failures(before)
    tokens_now, source = token_count(now)
    tokens = _delta(tokens_now, token_count(before)[0])
    queue = _delta(
        _value(now, "nv_inference_queue_duration_us", model=model_names.TENSORRT_LLM),
        _value(before, "nv_inference_queue_duration_us", model=model_names.TENSORRT_LLM),
    )
    finished = _delta(
        _value(now, "nv_inference_request_success", model=model_names.TENSORRT_LLM),
        _value(before, "nv_inference_request_success", model=model_names.TENSORRT_LLM),
    )

    def per_s(amount: float | None) -> float | None:
        return None if amount is None or seconds <= 0 else amount / seconds

    return Rates(
        requests_per_s=per_s(done),
        failures_per_s=per_s(max(0.0, failed_now - failed_before)),
        tokens_per_s=per_s(tokens),
        queue_ms=(queue / finished / 1000) if queue is not None and finished else None,
        active=_value(now, REQUEST, model=model_names.TENSORRT_LLM, request_type="active"),
        waiting=_value(now, REQUEST, model=model_names.TENSORRT_LLM, request_type="waiting"),
        kv_used=_value(now, KV_CACHE, kv_cache_block_type="used", model=model_names.TENSORRT_LLM),
        kv_max=_value(now, KV_CACHE, kv_cache_block_type="max", model=model_names.TENSORRT_LLM),
        token_source=source,
        in_flight=now.get(GATEWAY_IN_FLIGHT),
        kv_reuse=_share(*(_delta(now.get(k), before.get(k)) for k in GATEWAY_KV)),
    )


def _share(reused: float | None, missed: float | None) -> float | None:
    return reused / (reused + missed) if reused is not None and missed is not None and reused + missed else None


def summed(snapshot: Snapshot) -> dict[str, float]:
    """Every summable metric added over the replicas that answered."""
    return {k: total for k in snapshot.keys() if summable(k) and (total := snapshot.total(k)) is not None}
