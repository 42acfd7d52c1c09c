"""One record per request, filled by the routes and closed by one ASGI middleware: the metrics and a structured
access log line (JSON) to the `hpc_serve.gateway.access` logger.

Why a middleware and not code in each route: a request ends when the last byte of its answer left, which for a
stream is long after the route returned; only the ASGI `send` sees that, and only one place then needs to know
every metric. The routes add what only they know (model, replica, tokens, time to first token, retries) to
`request.state.record`.

Not logged, and their 503s not counted as errors (still counted as requests): `GET /metrics` and the health
probes, which a scraper or a load balancer sends every few seconds. Never logged: prompts, generated text, tokens of access.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hpc.gateway.errors import error_kind
from hpc.gateway.metrics import Metrics
from hpc.serving.engine_timing import TIMING_HEADER

log = logging.getLogger("hpc_serve.gateway.access")

#: routes counted but not logged (probes and scrapes)
QUIET_ROUTES = frozenset({"/metrics", "/v2/health/live", "/v2/health/ready", "/gateway/health"})


@dataclass
class RequestRecord:
    """What one request did; `route` is the route's path template (bounded label values)."""

    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    at: float = field(default_factory=time.time)
    route: str = "unmatched"
    model: str | None = None
    replica: str | None = None
    status: int = 0
    stream: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    retried: int = 0
    #: times the stream went on on another replica after its replica failed it half-way (`Gateway.resumed`)
    resumed: int = 0
    #: the replicas that failed the stream half-way, left out of its continuation
    failed_replicas: tuple[str, ...] = ()
    error: str | None = None  # an error kind; set by a route for a stream that failed after its status was sent
    #: KV-cache blocks of the request's prompt the replica's engine found in its cache, and those it did not (the
    #: llmapi model's perf metrics; None from a model that reports none)
    kv_reused_blocks: int | None = None
    kv_missed_blocks: int | None = None
    #: the client asked for the engine's timestamps (hpc/serving/engine_timing.py TIMING_HEADER)
    timing_asked: bool = False

    def kv_blocks(self, perf: Mapping[str, float] | None) -> None:
        """Add a generation's KV-cache blocks (its perf metrics; several choices add up)."""
        if perf is None or "kv_cache_reused_block" not in perf:
            return
        self.kv_reused_blocks = (self.kv_reused_blocks or 0) + int(perf["kv_cache_reused_block"])
        self.kv_missed_blocks = (self.kv_missed_blocks or 0) + int(perf.get("kv_cache_missed_block", 0))

    def first_token(self) -> None:
        """The replica's first response came (only the first call counts)."""
        if self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self.started

    def line(self) -> str:
        when = datetime.fromtimestamp(self.at, tz=timezone.utc).isoformat(timespec="milliseconds")
        out: dict[str, Any] = {
            "time": when,
            "method": self.method,
            "route": self.route,
            "model": self.model,
            "replica": self.replica,
            "status": self.status,
            "stream": self.stream,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 3),
            "latency_ms": None if self.latency_s is None else round(self.latency_s * 1000, 3),
            "retried": self.retried,
            "resumed": self.resumed,
            "error": self.error,
            "kv_reused_blocks": self.kv_reused_blocks,
            "kv_missed_blocks": self.kv_missed_blocks,
        }
        return json.dumps(out)


_TIMING_HEADER = TIMING_HEADER.encode()


def record_of(request: Any) -> RequestRecord:
    """The request's record (a detached one where no middleware made it, e.g. a route called directly)."""
    record = getattr(request.state, "record", None)
    return record if isinstance(record, RequestRecord) else RequestRecord(request.method, request.url.path)


class AccessLog:
    """ASGI middleware: a RequestRecord per HTTP request, closed at the last byte of the answer (or when the
    app gave up on it: a client gone, an exception) with its metrics and its log line."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(scope["method"], scope["path"])
        record.timing_asked = any(key == _TIMING_HEADER for key, _ in scope["headers"])
        scope.setdefault("state", {})["record"] = record
        closed = False

        def close() -> None:
            nonlocal closed
            if closed:
                return
            closed = True
            route = scope.get("route")
            record.route = getattr(route, "path", record.route)
            record.latency_s = time.perf_counter() - record.started
            observe(self.metrics, record)

        async def send_and_watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                close()

        try:
            await self.app(scope, receive, send_and_watch)
        except BaseException:
            record.status = record.status or 500
            raise
        finally:
            close()


def observe(m: Metrics, record: RequestRecord) -> None:
    """A request's metrics and its access log line, once it ended."""
    status = record.status or 499  # the client left before an answer started (nginx's code for it)
    m.requests.labels(record.route, str(status)).inc()
    m.latency.labels(record.route).observe(record.latency_s or 0.0)
    quiet = record.route in QUIET_ROUTES
    kind = record.error = record.error or error_kind(status)  # the access log's line says it too (a 503: no_replica)
    if kind is not None and not quiet:  # a probe's 503 says "not ready", it is no failed request
        m.errors.labels(kind).inc()
    if record.ttft_s is not None:
        m.first_token(record.route, record.ttft_s)
    if record.prompt_tokens:
        m.prompt_tokens.labels(record.route).inc(record.prompt_tokens)
    if record.completion_tokens:
        m.output_tokens.labels(record.route).inc(record.completion_tokens)
    if record.kv_reused_blocks is not None and record.replica:
        m.kv_blocks(record.replica, record.kv_reused_blocks, record.kv_missed_blocks or 0)
    if not quiet and log.isEnabledFor(logging.INFO):
        record.status = status
        log.info(record.line())


def observe_head_timeout(m: Metrics, waited_s: float) -> None:
    """A connection closed with 408 because its request's head did not come in time (hpc/gateway/connections.py):
    counted and logged as a request of no route, so a slowloris, or clients cut off by a network, show."""
    record = RequestRecord("-", "-", status=408, latency_s=waited_s, error=error_kind(408))
    observe(m, record)


def log_to_stderr() -> None:
    """Access lines as bare JSON lines on stderr (not prefixed like the gateway's other log lines), for the
    `hpc-serve gateway` command; a program embedding the app configures the logger its own way."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.INFO)
