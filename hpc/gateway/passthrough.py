"""Triton's HTTP API through the gateway: health, and the generate extension (`/generate`, `/generate_stream`),
so curl and clients written for Triton use the gateway's address unchanged.

Why forwarded as bytes and not parsed: the replica's answer (its JSON, its SSE events, its error codes) is the
Triton API; the gateway only picks the replica (prefix affinity on `text_input`), and tries another when the
chosen one cannot be reached or refuses the request because its queue is full (nothing has been sent back yet
then; all full: the gateway's 429), by the same retry rule as the OpenAI routes (`Gateway.routed`). Health: `ready` is 200 when at least one replica is, `live` when the
gateway itself runs; both answer without a token, so a load balancer's probe needs none. `/gateway/replicas`
lists the replicas in use with their counters.

A client that leaves is never cut off from the replica mid-answer (tritonserver 2.51 then keeps the ensemble's
request in flight for good, hpc/serving/abandon.py): its request is stopped by its id, one the gateway writes
into a body that has none and takes back out of the answer. Each request's connection to the replica closes
after its answer (`CLOSED_AFTER`: a kept-alive one holds up the replica's ordered stop).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict

import httpx
from fastapi import APIRouter, Depends, Request, Response
from starlette.types import Receive

from hpc.gateway.accesslog import record_of
from hpc.gateway.choices import REPLICA_HEADER
from hpc.gateway.openai_api import gateway_of, require_token
from hpc.gateway.streaming import EventStream, disconnected
from hpc.serving.abandon import ABANDON_S, Reader, Stop, abandon, keep, stop_until
from hpc.serving.auth import http_headers
from hpc.serving.balancer import Replica
from hpc.serving.discovery import CLOSED_AFTER
from hpc.serving.triton import ReplicaBusy, ReplicaStopping, ReplicaUnavailable, model_error

#: the id the gateway gives a generate request that has none (not the OpenAI routes' prefix: the
#: postprocessing model detokenizes those incrementally, and the passthrough's events are Triton's own)
PASSTHROUGH_ID_PREFIX = "hpc-serve-passthrough:"

log = logging.getLogger("hpc_serve.gateway")

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


#: what a Triton route the gateway does not forward answers (`infer`, model metadata, the repository API, ...):
#: Triton's error shape, so tritonclient raises it with these words instead of a bare "Not Found"
NOT_FORWARDED = (
    "the hpc-serve gateway forwards Triton's health and generate routes only (/v2/health/live|ready, "
    "/v2/models/<model>/generate, /v2/models/<model>/generate_stream); for {path} send the request to a replica "
    "directly: `hpc-serve endpoints TARGET` lists their HTTP and gRPC addresses"
)


@router.api_route("/v2/{path:path}", methods=["GET", "POST", "PUT", "DELETE"])
async def not_forwarded(path: str) -> Response:
    """Any other Triton route: a 404 that says what the gateway forwards and where the rest is served."""
    body = {"error": NOT_FORWARDED.format(path=f"/v2/{path}")}
    return Response(json.dumps(body), status_code=404, media_type="application/json")


class HiddenId:
    """Takes the id the gateway gave a `generate_stream` request back out of its events, which Triton writes it
    into (`"id":"<id>",` in each event's JSON): the client sent none, so its events have none, as from the
    replica itself. Events are cut whole (SSE: a blank line ends one), so one split across reads is not missed."""

    def __init__(self, request_id: str) -> None:
        quoted = json.dumps(request_id)
        self._forms = (f'"id":{quoted},'.encode(), f',"id":{quoted}'.encode())
        self._carry = b""

    def feed(self, chunk: bytes) -> bytes:
        """What can be sent of the stream so far: its whole events, without the id (b"" until one is whole)."""
        data = self._carry + chunk
        end = data.rfind(b"\n\n") + 2
        if end < 2:
            self._carry = data
            return b""
        self._carry = data[end:]
        return self._hide(data[:end])

    def flush(self) -> bytes:
        """The rest, at the stream's end."""
        rest, self._carry = self._carry, b""
        return self._hide(rest)

    def _hide(self, events: bytes) -> bytes:
        for form in self._forms:
            events = events.replace(form, b"")
        return events


def _parsed(body: bytes) -> dict | None:
    """The request's JSON object (None when the body is not what it should be: the replica's answer will say
    what is wrong)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _prompt(data: dict | None) -> str | None:
    """The request's `text_input`, for prefix affinity."""
    text = data.get("text_input") if data is not None else None
    return text if isinstance(text, str) else None


def _request_id(data: dict | None, body: bytes) -> tuple[str | None, HiddenId | None, bytes]:
    """The id a generate request is stopped by when its client leaves (hpc/serving/abandon.py), the id the
    gateway gave it to hide again (the client sent none, and Triton echoes it in its answer), and the body
    to send: with that id first in its object, written into the bytes as they came (not parsed and written
    again: a body may be megabytes, and the event loop relays every other stream meanwhile)."""
    if data is None or ("id" in data and not (isinstance(data["id"], str) and data["id"])):
        return None, None, body  # not JSON, or an id Triton will refuse: the replica says what is wrong
    if "id" in data:
        return data["id"], None, body  # the client's own (ids should be unique, as TensorRT-LLM's backend expects)
    request_id = f"{PASSTHROUGH_ID_PREFIX}{uuid.uuid4().hex}"
    opening = body.index(b"{") + 1  # a JSON object: only white space before its brace
    first = json.dumps({"id": request_id})[1:-1].encode() + (b", " if data else b"")
    return request_id, HiddenId(request_id), body[:opening] + first + body[opening:]


def _refusal(content: bytes) -> ReplicaBusy | ReplicaStopping | None:
    """An error answer that means "my queue is full" (tritonserver's generate endpoint says so with a 400) or "I am
    stopping": the request is tried on another replica, as over gRPC (hpc/serving/triton.py `model_error`)."""
    refusal = model_error(content.decode(errors="replace"))
    return refusal if isinstance(refusal, ReplicaBusy | ReplicaStopping) else None


async def _forward(request: Request, model: str, endpoint: str) -> Response:
    """The request sent to the replica the gateway's retry rule picks (`Gateway.routed`): one unreachable is
    benched and one whose queue is full skipped, both before anything went back; its answer relayed as it came.
    A request whose client leaves is stopped by its id: before its answer started (`_StopWhenGone`), or mid-way
    through a stream, which is then read to its end, never cut off (`_let_go`)."""
    gw = gateway_of(request)
    record = record_of(request)
    record.model, record.stream = model, endpoint == "generate_stream"
    body = await request.body()
    data = _parsed(body)
    request_id, hidden, body = _request_id(data, body)
    chosen: list[tuple[Replica, str | None]] = []  # the replica the request went to last, and its token

    async def stop() -> None:
        """Stop the request on the replica it went to (nothing without an id to stop it by)."""
        if request_id is not None and chosen:
            replica, token = chosen[-1]
            await gw.engine.stop(replica.grpc_url, request_id, token, replica.workflow)

    headers = {"content-type": request.headers.get("content-type", "application/json"), **CLOSED_AFTER}
    path = f"/v2/models/{model}/{endpoint}"

    async def attempt(replica: Replica) -> AsyncIterator[httpx.Response | bytes]:
        """The replica's answer (its head first, then its body as it comes, read on a task of its own)."""
        token = gw.discovery.token_for(replica)
        chosen.append((replica, token))
        sent = headers | http_headers(token)  # the replica's access token (auth: token)
        send = gw.http.build_request("POST", replica.http_url + path, content=body, headers=sent, timeout=None)
        try:
            upstream = await gw.http.send(send, stream=True)
        except httpx.TransportError as exc:
            raise ReplicaUnavailable(f"{replica.http_url}: {exc!r}") from None
        reader = None
        try:
            if upstream.status_code >= 400:  # an error answer is small: read it to tell a full queue
                content = await upstream.aread()
                if (refusal := _refusal(content)) is not None:
                    raise refusal
                yield upstream  # read: passed on whole
                return
            reader = Reader(upstream.aiter_raw(), upstream.aclose)
            yield upstream
            while (chunk := await reader.next()) is not None:
                if hidden is None or (chunk := hidden.feed(chunk)):
                    yield chunk
            if hidden is not None and (rest := hidden.flush()):
                yield rest
            reader = None  # read to its end: nothing left to stop
        finally:
            await _let_go(upstream, reader, stop if request_id is not None else None)

    answer = gw.routed(attempt, _prompt(data), record)
    watch = _StopWhenGone(request.receive, stop)
    try:
        upstream = await gw.first(answer)
    finally:
        watch.end()
    assert isinstance(upstream, httpx.Response)  # every attempt yields its head first
    if upstream.is_stream_consumed:
        await answer.aclose()
        return Response(upstream.content, status_code=upstream.status_code, headers=_kept(upstream, record.replica))

    async def relay() -> AsyncIterator[bytes]:
        async with aclosing(answer) as chunks:
            async for chunk in chunks:
                if record.stream:
                    record.first_token()
                yield chunk  # type: ignore[misc]  # after the head, only bytes

    return EventStream(relay(), status_code=upstream.status_code, headers=_kept(upstream, record.replica))


class _StopWhenGone:
    """Until a request's answer starts: when its client leaves, stop the request by its id, again and again until the
    answer comes (`stop_until`: a stop that came before the engine held the request is dropped, hpc/serving/abandon.py).
    Why: a `generate` answer starts only once it is whole, so without this a client gone meanwhile would be seen only
    then, after the replica made every token of it for no one (a stream's client is watched from its first event on,
    hpc/gateway/streaming.py). The request is not cut off: its answer, the shorter for the stop, comes back and goes to
    no one."""

    def __init__(self, receive: Receive, stop: Stop) -> None:
        self.seen = False
        self.answered = asyncio.Event()
        self.task = asyncio.ensure_future(self._watch(receive, stop))

    async def _watch(self, receive: Receive, stop: Stop) -> None:
        await disconnected(receive)
        self.seen = True
        try:
            await asyncio.wait_for(stop_until(stop, self.answered), ABANDON_S)
        except Exception as exc:  # noqa: BLE001 - a replica gone meanwhile: its request went with it
            log.debug("stopping a request whose client left: %r", exc)

    def end(self) -> None:
        """The answer started (or failed): stop watching; stops under way are kept to their end."""
        self.answered.set()
        if self.seen:
            keep(self.task)
        else:
            self.task.cancel()


async def _let_go(upstream: httpx.Response, reader: Reader | None, stop: Stop | None) -> None:
    """Done with a replica's answer. One left before its end (`reader`: its client went away) with an id to stop
    it by is stopped and read to its end in the background (hpc/serving/abandon.py), not cut off. Why:
    tritonserver 2.51 never releases an ensemble request whose HTTP stream was closed while it generated, as over
    gRPC: the replica's stop then waits out its exit timeout and exits 1 (docs/decisions.md "Abandoned streams")."""
    if reader is not None and stop is not None and abandon(reader, stop) is not None:
        return  # the background task closes it
    if reader is not None:
        reader.task.cancel()
    await upstream.aclose()


def _kept(upstream: httpx.Response, replica: str | None) -> dict[str, str]:
    """The replica's headers a client reads, and which replica answered (as on the OpenAI routes)."""
    kept = {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "cache-control")}
    return kept | {REPLICA_HEADER: replica or ""}
