"""The gateway's own Prometheus metrics, served at `GET /metrics` (no token: see the module's last paragraph).

Why a registry per app and not prometheus_client's global one: a process may hold several gateways (the tests
make one app per deployment), and each must count only its own requests. Why the per-replica numbers are read
from the balancer at scrape time (a custom collector) and not kept in labelled counters: the balancer already
counts them, replicas come and go with jobs, and a replica that is gone drops out of the next scrape instead of
leaving a stale series behind.

No token on `/metrics`, like tritonserver's own metrics port: scrapers (Prometheus, a node exporter's textfile
collector) rarely carry bearer tokens. It tells counts and timings, the replicas' keys (`job_id/replica`) and
the model's name, never prompts, texts or addresses.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from hpc.serving.balancer import Balancer
from hpc.serving.routing import DEGRADED
from launcher.contracts.autoscale import KEEP_DECISIONS, Action, AutoscaleRecord

PREFIX = "hpc_serve_gateway"
#: prometheus_client's variable naming the folder of its multiprocess files (set by a gateway of several workers)
MULTIPROC_DIR_VAR = "PROMETHEUS_MULTIPROC_DIR"
#: whole requests: a short completion on a small model to minutes of generation
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: the first token: a warm small model answers in milliseconds, a long prompt's prefill in seconds
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


#: the balancer's per-replica counters (hpc/serving/balancer.py `Replica`) this collector shows
_COUNTED = ("outstanding", "served", "failures", "refusals", "kv_reused_blocks", "kv_missed_blocks")


class ReplicaCollector(Collector):
    """Per-replica numbers and the balancer's pick outcomes, as the balancer holds them at scrape time."""

    def __init__(
        self,
        balancer: Callable[[], Balancer | None],
        degraded: Callable[[], dict[str, str]] = dict,
        events_lost: Callable[[], dict[str, int]] = dict,
    ) -> None:
        self._balancer = balancer
        self._degraded = degraded
        self._events_lost = events_lost

    def collect(self) -> Iterator[Metric]:
        balancer = self._balancer()
        replicas = balancer.replicas if balancer is not None else []
        if balancer is not None:
            balancer.counts.load(replicas)  # every worker's, where the gateway has several
        healthy = {r.key for r in balancer.healthy()} if balancer is not None else set()
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "outstanding": GaugeMetricFamily(
                f"{PREFIX}_replica_outstanding", "Requests in flight on the replica", labels=["replica"]
            ),
            "served": CounterMetricFamily(
                f"{PREFIX}_replica_served", "Requests the replica finished (any outcome)", labels=["replica"]
            ),
            "failures": CounterMetricFamily(
                f"{PREFIX}_replica_failed",
                "Requests the replica failed before its first byte (it was benched, the request retried)",
                labels=["replica"],
            ),
            "refusals": CounterMetricFamily(
                f"{PREFIX}_replica_refused", "Requests the replica refused, its queue full", labels=["replica"]
            ),
            "draining": GaugeMetricFamily(
                f"{PREFIX}_replica_draining", "1 while the replica's job is stopping", labels=["replica"]
            ),
            "healthy": GaugeMetricFamily(
                f"{PREFIX}_replica_healthy", "1 unless the replica is benched after a failure", labels=["replica"]
            ),
            "restarts": GaugeMetricFamily(
                f"{PREFIX}_replica_restarts",
                "Times its job restarted the replica after it died (replica_policy restart)",
                labels=["replica"],
            ),
            "kv_reused_blocks": CounterMetricFamily(
                f"{PREFIX}_replica_kv_reused_blocks",
                "KV-cache blocks of its requests' prompts the replica's engine found cached (llmapi perf metrics)",
                labels=["replica"],
            ),
            "kv_missed_blocks": CounterMetricFamily(
                f"{PREFIX}_replica_kv_missed_blocks",
                "KV-cache blocks of its requests' prompts the replica's engine had to compute (llmapi perf metrics)",
                labels=["replica"],
            ),
        }
        for r in replicas:
            values = {k: getattr(r, k) for k in (*_COUNTED, "draining", "restarts")}
            values["healthy"] = r.key in healthy
            for name, family in families.items():
                family.add_metric([r.key], float(values[name]))
        yield from families.values()
        picks = CounterMetricFamily(
            f"{PREFIX}_picks",
            "Replica choices: least (no prefix key, or no replica holds the prompt), home (the prefix's own replica), "
            "cached (the replica holding most of the prompt), spilled (it was too busy), none (no replica was ready: "
            "a 503, or under autoscale: a request held while a job starts)",
            labels=["outcome"],
        )
        for outcome in ("least", "home", "cached", "spilled", "none"):
            picks.add_metric([outcome], float(balancer.outcomes[outcome] if balancer is not None else 0))
        yield picks
        degraded = GaugeMetricFamily(
            f"{PREFIX}_replica_routing_degraded",
            "1 while routing knows the replica's cache only from the prompts sent there, though it follows KV-cache "
            "events (routing: cache), by reason: " + ", ".join(DEGRADED),
            labels=["replica", "reason"],
        )
        for key, reason in sorted(self._degraded().items()):
            degraded.add_metric([key, reason], 1.0)
        yield degraded
        lost = CounterMetricFamily(
            f"{PREFIX}_replica_kv_events_lost",
            "Times KV-cache events of the replica were lost between two reads (routing's index of it started again)",
            labels=["replica"],
        )
        for key, times in sorted(self._events_lost().items()):
            lost.add_metric([key], float(times))
        yield lost


class AutoscaleCollector(Collector):
    """The autoscaling controller's decisions (`autoscale:`), read from its record (D/autoscale.json, which every
    gateway of the deployment and its successors share) at scrape time: nothing for a deployment without one."""

    def __init__(self, record: Callable[[], AutoscaleRecord | None]) -> None:
        self._record = record

    def collect(self) -> Iterator[Metric]:
        record = self._record()
        if record is None or not record.decisions:
            return
        counts = GaugeMetricFamily(
            "hpc_serve_autoscale_decisions",
            f"The controller's decisions of each action among its last {KEEP_DECISIONS} (its record's)",
            labels=["action"],
        )
        last_at = GaugeMetricFamily(
            "hpc_serve_autoscale_last_decision_timestamp_seconds",
            "When the controller last decided each action (Unix time)",
            labels=["action"],
        )
        for action in Action:
            rows = [d for d in record.decisions if d.action == action]
            counts.add_metric([action.value], float(len(rows)))
            if rows:
                last_at.add_metric([action.value], rows[-1].at)
        latest = record.decisions[-1]
        signal = GaugeMetricFamily(
            "hpc_serve_autoscale_signal", "The load signal at the last decision: requests in flight per READY replica"
        )
        signal.add_metric([], latest.signal)
        target = GaugeMetricFamily("hpc_serve_autoscale_target", "The signal's target (autoscale.target_outstanding)")
        target.add_metric([], latest.target)
        yield from (counts, last_at, signal, target)


class Metrics:
    """Every metric of one gateway, in its own registry."""

    def __init__(
        self,
        balancer: Callable[[], Balancer | None],
        degraded: Callable[[], dict[str, str]] = dict,
        events_lost: Callable[[], dict[str, int]] = dict,
        autoscale: Callable[[], AutoscaleRecord | None] | None = None,
    ) -> None:
        self.balancer = balancer
        self.degraded, self.events_lost = degraded, events_lost
        #: reads the controller's record (the deployment's folders: file-system work, so `/metrics` calls it on a
        #: worker thread before each page and the collector shows what it read); None: no `autoscale:`
        self.autoscale = autoscale
        self.autoscale_read: AutoscaleRecord | None = None
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "Requests answered", ["route", "status"], registry=r)
        self.errors = Counter(f"{PREFIX}_errors", "Error answers and failed streams, by kind", ["kind"], registry=r)
        self.latency = self._by_route(
            "request_duration_seconds", "From the request's arrival to the last byte of its answer", LATENCY_BUCKETS
        )
        self.ttft = self._by_route(
            "time_to_first_token_seconds", "From the request's arrival to the replica's first response", TTFT_BUCKETS
        )
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens", ["route"], registry=r)
        self.output_tokens = Counter(f"{PREFIX}_output_tokens", "Generated tokens", ["route"], registry=r)
        self.retries = Counter(
            f"{PREFIX}_retries",
            "Requests sent again to another replica: unavailable (failed before its first byte), busy (queue full), "
            "stopping, model_error (the model failed it before its first byte: tried once more), resumed (a stream its "
            "replica failed half-way, gone on on another)",
            ["reason"],
            registry=r,
        )
        r.register(ReplicaCollector(balancer, degraded, events_lost))
        r.register(AutoscaleCollector(lambda: self.autoscale_read))

    def first_token(self, route: str, seconds: float) -> None:
        """A request's time to first token: the histogram, and the gateway-wide totals the autoscaling controller
        reads (hpc/serving/replica_counts.py TOTALS: every worker's, where a gateway has several)."""
        self.ttft.labels(route).observe(seconds)
        balancer = self.balancer()
        if balancer is not None:
            balancer.counts.add_totals(ttft_sum_s=seconds, ttft_count=1)

    def kv_blocks(self, replica_key: str, reused: int, missed: int) -> None:
        """Add a request's KV-cache blocks to the replica that served it (kept by the balancer, as its other
        counters; a replica gone meanwhile is not counted)."""
        balancer = self.balancer()
        if balancer is None:
            return
        for replica in balancer.replicas:
            if replica.key == replica_key:
                balancer.counts.add(replica, kv_reused_blocks=reused, kv_missed_blocks=missed)
                return

    def _by_route(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(f"{PREFIX}_{name}", doc, ["route"], buckets=buckets, registry=self.registry)


router = APIRouter()


def share_between_workers() -> None:
    """From now on, this process's metrics are kept in prometheus_client's multiprocess files (the folder of
    $PROMETHEUS_MULTIPROC_DIR, which the gateway's parent made), so that `/metrics` of any worker of a gateway of
    several (hpc/gateway/workers.py) sums every worker's: called in each worker before its app is made."""
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue()


def page(metrics: Metrics) -> bytes:
    """The `/metrics` page: this gateway's registry; in a worker of several, every worker's metrics summed
    (prometheus_client's MultiProcessCollector) and the per-replica numbers, which the workers share already."""
    if not os.environ.get(MULTIPROC_DIR_VAR):
        return generate_latest(metrics.registry)
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(ReplicaCollector(metrics.balancer, metrics.degraded, metrics.events_lost))
    registry.register(AutoscaleCollector(lambda: metrics.autoscale_read))
    return generate_latest(registry)


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text format; no token (see the module docstring)."""
    m: Metrics = request.app.state.metrics
    if m.autoscale is not None:  # off the event loop: it reads the deployment's folders
        m.autoscale_read = await asyncio.to_thread(m.autoscale)
    return Response(page(m), media_type=CONTENT_TYPE_LATEST)
