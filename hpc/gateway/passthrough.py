"""Triton's HTTP API through the gateway: health, and the generate extension (`/generate`, `/generate_stream`),
so curl and clients written for Triton use the gateway's address unchanged.

Why forwarded as bytes and not parsed: the replica's answer (its JSON, its SSE events, its error codes) is the
Triton API; the gateway only picks the replica (prefix affinity on `text_input`), and tries another when the
chosen one cannot be reached or refuses the request because its queue is full (nothing has been sent back yet
then; all full: the gateway's 429). Health: `ready` is 200 when at least one replica is, `live` when the
gateway itself runs; both answer without a token, so a load balancer's probe needs none. `/gateway/replicas`
lists the replicas in use with their counters.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict

import httpx
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from hpc.auth import http_headers
from hpc.gateway.accesslog import record_of
from hpc.gateway.openai_api import gateway_of, require_token
from hpc.gateway.triton import BUSY_MARKERS

health = APIRouter()
router = APIRouter(dependencies=[Depends(require_token)])


@health.get("/v2/health/live")
async def live() -> Response:
    return Response(status_code=200)


@health.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if gateway_of(request).balancer.available() else 503)


@router.get("/gateway/replicas")
async def replicas(request: Request) -> list[dict]:
    """The replicas the gateway uses now, with their counters (not Triton's API: the gateway's own)."""
    now = time.monotonic()
    return [
        {k: v for k, v in asdict(r).items() if k != "benched_until"} | {"healthy": r.benched_until <= now}
        for r in gateway_of(request).balancer.replicas
    ]


@router.post("/v2/models/{model}/generate")
async def generate(model: str, request: Request) -> Response:
    return await _forward(request, model, "generate")


@router.post("/v2/models/{model}/generate_stream")
async def generate_stream(model: str, request: Request) -> Response:
    return await _forward(request, model, "generate_stream")


def _prompt(body: bytes) -> str | None:
    """The request's `text_input`, for prefix affinity (None when the body is not the JSON it should be: the
    replica's answer will say what is wrong)."""
    try:
        text = json.loads(body).get("text_input")
    except (ValueError, AttributeError):
        return None
    return text if isinstance(text, str) else None


def _refused(content: bytes) -> bool:
    """An error answer that means "my queue is full" (tritonserver's generate endpoint says so with a 400)."""
    return any(m in content.decode(errors="replace").lower() for m in BUSY_MARKERS)


async def _forward(request: Request, model: str, endpoint: str) -> Response:
    gw = gateway_of(request)
    record = record_of(request)
    record.model, record.stream = model, endpoint == "generate_stream"
    body = await request.body()
    headers = {"content-type": request.headers.get("content-type", "application/json")}
    path = f"/v2/models/{model}/{endpoint}"
    prompt = _prompt(body)
    tried: list[str] = []
    busy = False
    while True:
        replica = gw.pick(tried, prompt, busy)
        record.replica, record.retried = replica.key, len(tried) - 1
        tracking = gw.balancer.track(replica)
        tracking.__enter__()  # left when the relay ends (below), or at once when this replica is given up
        sent = headers | http_headers(gw.discovery.token_for(replica))  # the replica's access token (auth: token)
        send = gw.http.build_request("POST", replica.http_url + path, content=body, headers=sent, timeout=None)
        try:
            upstream = await gw.http.send(send, stream=True)
        except httpx.TransportError as exc:
            tracking.__exit__(None, None, None)
            gw.retried(replica, "unavailable", exc)
            continue
        if upstream.status_code >= 400:  # an error answer is small: read it to tell a full queue
            content = await upstream.aread()
            await upstream.aclose()
            tracking.__exit__(None, None, None)
            if _refused(content):
                busy = True
                gw.retried(replica, "busy", RuntimeError(content.decode(errors="replace")))
                continue
            return Response(content, status_code=upstream.status_code, headers=_kept(upstream))
        break

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                if record.stream:
                    record.first_token()
                yield chunk
        finally:
            tracking.__exit__(None, None, None)
            await upstream.aclose()

    return StreamingResponse(relay(), status_code=upstream.status_code, headers=_kept(upstream))


def _kept(upstream: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "cache-control")}
