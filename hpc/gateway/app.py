"""`create_app(target)`: the FastAPI application, with discovery running for as long as the app does.

Why everything is built in the lifespan and not at import: the app owns an event-loop-bound HTTP client,
gRPC channels and a background refresh task, which must be made inside uvicorn's loop and closed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from hpc.gateway import liveness, metrics, openai_api, passthrough
from hpc.gateway.accesslog import AccessLog
from hpc.gateway.bodylimit import BodyLimit
from hpc.gateway.errors import (
    APIError,
    api_error_handler,
    client_gone_handler,
    http_error_handler,
    unexpected_error_handler,
    validation_error_handler,
    without_422,
)
from hpc.gateway.fastpath import FastPath
from hpc.gateway.metrics import Metrics
from hpc.gateway.state import Gateway
from hpc.jobs.autoscale import autoscale_record
from hpc.serving.balancer import Balancer, Replica
from hpc.serving.deployment import Target
from hpc.serving.discovery import Discovery
from hpc.serving.kv_events import KvEventsFollower
from hpc.serving.replica_counts import ReplicaCounts
from hpc.serving.routing import CachedPrefix, routing_mode
from hpc.serving.text import ChatTemplate
from hpc.serving.triton import TritonEngine
from hpc.serving.warmup import Warmer
from hpc.spec.limits import MAX_BODY_MB, MAX_OUTSTANDING, PREFIX_CHARS, ROUTING
from launcher.contracts.config import DISCOVERY_REFRESH_S


def create_app(
    target: Target,
    refresh_s: float = DISCOVERY_REFRESH_S,
    max_outstanding: int | None = MAX_OUTSTANDING,
    prefix_chars: int = PREFIX_CHARS,
    fast_path: bool = True,
    max_body_mb: int = MAX_BODY_MB,
    routing: str = ROUTING,
    counts: ReplicaCounts | None = None,
    warm_up: bool = True,
) -> FastAPI:
    """The gateway for `target` (hpc.serving.deployment.resolve_target). `max_outstanding`: requests in flight
    per replica before 429 (None: no bound); `prefix_chars`: the prefix affinity key's length (0: off);
    `fast_path`: serve the two generation routes around FastAPI's machinery (hpc/gateway/fastpath.py; off, every
    request takes FastAPI's way: the same answers, which the tests compare, and what the benchmark measures it
    against); `max_body_mb`: the largest request body taken (hpc/spec/limits.py; 0: no bound); `routing`: how a
    replica is chosen (hpc/serving/routing.py; `cache` follows the replicas' KV-cache events meanwhile); `counts`:
    where the balancer's per-replica counts live (hpc/serving/replica_counts.py; shared by a gateway's worker
    processes); `warm_up`: this app warms the replicas that join, with `cache` routing (hpc/serving/warmup.py; a
    gateway of several workers warms them in one)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from backend.models.tokenizer import load_tokenizer

        tokenizer = await asyncio.to_thread(load_tokenizer, target.tokenizer_dir)
        # the gateway's own tokenization (`Gateway.token_ids`): each prompt encoded once for routing and usage
        mode = routing_mode(routing, prefix_chars, lambda prompt: app.state.gateway.token_ids(prompt))
        balancer = Balancer(max_outstanding=max_outstanding, round_robin=mode.round_robin, counts=counts)
        # trust_env=False: replicas are cluster nodes, never behind the user's $http_proxy (launcher/contracts/urls.py)
        async with httpx.AsyncClient(trust_env=False) as http:
            engine = TritonEngine()
            warmer: Warmer | None = None

            async def retain(ready: list[Replica]) -> None:
                await engine.retain({r.grpc_url for r in ready})
                if warmer is not None:
                    warmer.joined(ready)  # a replica that joined gets the hottest shared prefixes first

            discovery = Discovery(target, balancer, http, refresh_s=refresh_s, on_update=retain)
            app.state.gateway = Gateway(
                target,
                balancer,
                discovery,
                engine,
                http,
                tokenizer,
                ChatTemplate.from_tokenizer_dir(target.tokenizer_dir),
                prefix_chars=prefix_chars,
                metrics=app.state.metrics,
                routing=mode,
            )
            follower = None
            if isinstance(mode, CachedPrefix):
                follower = KvEventsFollower(mode, balancer, discovery.token_for)
                warmer = Warmer(mode, balancer, engine, discovery.token_for) if warm_up else None
            app.state.warmer = warmer  # None: this app warms no replica (another worker does, or no `cache` routing)
            try:
                async with discovery.running(), follower.running() if follower else contextlib.nullcontext():
                    yield
            finally:
                for task in list(warmer.tasks) if warmer is not None else []:  # before the channels they use close
                    task.cancel()
                await engine.close()

    app = FastAPI(title=f"hpc-serve gateway: {target.name}", lifespan=lifespan, **_no_telemetry())
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(ClientDisconnect, client_gone_handler)  # a client gone while sending its body
    app.add_exception_handler(HTTPException, http_error_handler)
    app.add_exception_handler(Exception, unexpected_error_handler)  # Starlette's last resort: a 500 of ours
    app.state.metrics = Metrics(
        lambda: _balancer(app),
        lambda: _degraded(app),
        lambda: _events_lost(app),
        (lambda: autoscale_record(target)) if target.autoscaled else None,
    )
    app.include_router(metrics.router)
    app.include_router(openai_api.router)
    app.include_router(passthrough.health)
    app.include_router(liveness.router)
    app.include_router(passthrough.router)
    # the last added runs first: the access log sees every request, the fast path's too
    if fast_path:
        app.add_middleware(FastPath, routes=openai_api.router.routes)
    app.add_middleware(BodyLimit, limit=max_body_mb * 2**20 if max_body_mb else None)
    app.add_middleware(AccessLog, metrics=app.state.metrics)

    def openapi() -> dict[str, Any]:
        """FastAPI's, with the streamed answers' schemas and without the 422 the gateway never answers."""
        if app.openapi_schema is None:
            app.openapi_schema = without_422(openai_api.describe_streams(FastAPI.openapi(app)))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's way to extend its schema
    return app


def _balancer(app: FastAPI) -> Balancer | None:
    """The app's balancer, once its lifespan made it (a scrape before that sees no replica)."""
    gateway = getattr(app.state, "gateway", None)
    return gateway.balancer if gateway is not None else None


def _degraded(app: FastAPI) -> dict[str, str]:
    """Replica key → why cache-aware routing knows its cache only from the prompts sent there
    (hpc/serving/routing.py `DEGRADED`)."""
    gateway = getattr(app.state, "gateway", None)
    mode = gateway.routing if gateway is not None else None
    return mode.degraded_reasons() if isinstance(mode, CachedPrefix) else {}


def _events_lost(app: FastAPI) -> dict[str, int]:
    """Replica key → times its KV-cache events were lost between two reads."""
    gateway = getattr(app.state, "gateway", None)
    mode = gateway.routing if gateway is not None else None
    return dict(mode.events_lost) if isinstance(mode, CachedPrefix) else {}


def _no_telemetry() -> dict[str, Any]:
    """FastAPI's native OpenTelemetry off, where FastAPI has it (recent versions): the gateway has its own
    Prometheus metrics and access log (hpc/gateway/accesslog.py), and with it on FastAPI looks for OpenTelemetry
    providers on every request, a few environment look-ups each (docs/decisions.md "The gateway's own time")."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
