"""Triton's HTTP API through the gateway: health, and the generate extension (`/generate`, `/generate_stream`),
so curl and clients written for Triton use the gateway's address unchanged.

Why forwarded as bytes and not parsed: the replica's answer (its JSON, its SSE events, its error codes) is the
Triton API; the gateway only picks the replica (prefix affinity on `text_input`), and tries another when the
chosen one cannot be reached or refuses the request because its queue is full (nothing has been sent back yet
then; all full: the gateway's 429), by the same retry rule as the OpenAI routes (`Gateway.routed`). Health: `ready` is 200 when at least one replica is, `live` when the
gateway itself runs; both answer without a token, so a load balancer's probe needs none. `/gateway/replicas`
lists the replicas in use with their counters.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict

import httpx
from fastapi import APIRouter, Depends, Request, Response

from hpc.auth import http_headers
from hpc.gateway.accesslog import record_of
from hpc.gateway.openai_api import gateway_of, require_token
from hpc.gateway.streaming import EventStream
from hpc.gateway.triton import ReplicaBusy, ReplicaStopping, ReplicaUnavailable, model_error
from hpc.routing.balancer import Replica

health = APIRouter()
router = APIRouter(dependencies=[Depends(require_token)])


@health.get("/v2/health/live")
async def live() -> Response:
    return Response(status_code=200)


@health.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if gateway_of(request).balancer.takers() else 503)


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


def _refusal(content: bytes) -> ReplicaBusy | ReplicaStopping | None:
    """An error answer that means "my queue is full" (tritonserver's generate endpoint says so with a 400) or "I am
    stopping": the request is tried on another replica, as over gRPC (hpc/gateway/triton.py `model_error`)."""
    refusal = model_error(content.decode(errors="replace"))
    return refusal if isinstance(refusal, ReplicaBusy | ReplicaStopping) else None


async def _forward(request: Request, model: str, endpoint: str) -> Response:
    """The request sent to the replica the gateway's retry rule picks (`Gateway.routed`): one unreachable is
    benched and one whose queue is full skipped, both before anything went back; its answer relayed as it came."""
    gw = gateway_of(request)
    record = record_of(request)
    record.model, record.stream = model, endpoint == "generate_stream"
    body = await request.body()
    headers = {"content-type": request.headers.get("content-type", "application/json")}
    path = f"/v2/models/{model}/{endpoint}"

    async def attempt(replica: Replica) -> AsyncIterator[httpx.Response | bytes]:
        """The replica's answer (its head first, then its body as it comes)."""
        sent = headers | http_headers(gw.discovery.token_for(replica))  # the replica's access token (auth: token)
        send = gw.http.build_request("POST", replica.http_url + path, content=body, headers=sent, timeout=None)
        try:
            upstream = await gw.http.send(send, stream=True)
        except httpx.TransportError as exc:
            raise ReplicaUnavailable(f"{replica.http_url}: {exc!r}") from None
        try:
            if upstream.status_code >= 400:  # an error answer is small: read it to tell a full queue
                content = await upstream.aread()
                if (refusal := _refusal(content)) is not None:
                    raise refusal
                yield upstream  # read: passed on whole
                return
            yield upstream
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()

    answer = gw.routed(attempt, _prompt(body), record)
    upstream = await gw.first(answer)
    assert isinstance(upstream, httpx.Response)  # every attempt yields its head first
    if upstream.is_stream_consumed:
        await answer.aclose()
        return Response(upstream.content, status_code=upstream.status_code, headers=_kept(upstream))

    async def relay() -> AsyncIterator[bytes]:
        async with aclosing(answer) as chunks:
            async for chunk in chunks:
                if record.stream:
                    record.first_token()
                yield chunk  # type: ignore[misc]  # after the head, only bytes

    return EventStream(relay(), status_code=upstream.status_code, headers=_kept(upstream))


def _kept(upstream: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "cache-control")}
