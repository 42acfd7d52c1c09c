"""Triton's HTTP API through the gateway: health, and the generate extension (`/generate`, `/generate_stream`),
so curl and clients written for Triton use the gateway's address unchanged.

Why forwarded as bytes and not parsed: the replica's answer (its JSON, its SSE events, its error codes) is the
Triton API; the gateway only picks the replica, and retries on another when the chosen one cannot be reached
(nothing has been sent back yet then). Health: `ready` is 200 when at least one replica is, `live` when the
gateway itself runs; both answer without a token, so a load balancer's probe needs none. `/gateway/replicas`
lists the replicas in use with their counters.
"""

from __future__ import annotations

import time
from dataclasses import asdict

import httpx
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from hpc.gateway.openai_api import gateway_of, require_token
from hpc.gateway.state import log

health = APIRouter()
router = APIRouter(dependencies=[Depends(require_token)])


@health.get("/v2/health/live")
async def live() -> Response:
    return Response(status_code=200)


@health.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if gateway_of(request).balancer.healthy() else 503)


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
    return await _forward(request, f"/v2/models/{model}/generate")


@router.post("/v2/models/{model}/generate_stream")
async def generate_stream(model: str, request: Request) -> Response:
    return await _forward(request, f"/v2/models/{model}/generate_stream")


async def _forward(request: Request, path: str) -> Response:
    gw = gateway_of(request)
    body = await request.body()
    headers = {"content-type": request.headers.get("content-type", "application/json")}
    tried: list[str] = []
    while True:
        replica = gw.pick(tried)
        send = gw.http.build_request("POST", replica.http_url + path, content=body, headers=headers, timeout=None)
        try:
            upstream = await gw.http.send(send, stream=True)
        except httpx.TransportError as exc:
            gw.balancer.mark_failed(replica)
            log.warning("replica %s failed before its first byte (%s); retried on another", replica.key, exc)
            continue
        break

    async def relay():
        with gw.balancer.track(replica):
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

    kept = {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "cache-control")}
    return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)
