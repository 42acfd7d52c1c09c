"""The load generator of `hpc-serve bench`: one asyncio loop, one task per request in flight, streaming, so one
process keeps thousands of streams open and times every piece.

Why asyncio and not threads: a stream spends nearly all its life waiting on the network; a task costs a few KB
and no thread switch, so the generator stays far below the server's cost per request (benchmarks/
bench_loadgen.py measures it against a plain loop of tritonclient calls). Why the work per piece is one clock
read and a list append: tokens are counted after the run (the tokenizer is the expensive part), so a busy
generator does not delay the pieces it is timing.

Two ways to send, both the project's own clients: `client_sender` (hpc.client.AsyncClient: the deployment's
gateway when one runs, else its replicas with the shared balancer) and `gateway_sender` (a gateway URL: its
OpenAI `/v1/completions` stream, through hpc.client.transport.gateway_stream and httpx).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import httpx

from hpc.bench.stats import RequestRecord
from hpc.bench.workloads import BenchRequest, Tokenizer
from hpc.client.transport import Sampling, gateway_stream, generate_params
from hpc.compat import TIMEOUT_ERRORS

#: sends one request and yields its text piece by piece; fills the dict with the engine's timestamps where it has
#: them (hpc/serving/engine_timing.py)
Sender = Callable[[BenchRequest, dict[str, int]], AsyncIterator[str]]


@dataclass(frozen=True)
class LoadSpec:
    """How requests are sent: at `times` (seconds from the start; all 0 = all at once), at most `concurrency` in
    flight (None: no bound), none sent after `duration_s` (None: until every request was sent)."""

    times: Sequence[float]
    concurrency: int | None = None
    duration_s: float | None = None


def error_kind(exc: BaseException) -> str:
    """How an error is counted in "errors by kind": the client's error class (Busy, NotReady, RequestError,
    ServerError, AuthError…), `timeout`, or the transport's exception class."""
    if isinstance(exc, TIMEOUT_ERRORS):
        return "timeout"
    if isinstance(exc, httpx.HTTPError):
        return f"http:{type(exc).__name__}"
    return type(exc).__name__


async def _one(send: Sender, request: BenchRequest, record: RequestRecord, start: float, texts: dict[int, str]) -> None:
    clock = time.perf_counter
    record.sent = clock() - start
    last = 0.0
    parts: list[str] = []
    try:
        async with aclosing(send(request, record.engine)) as pieces:  # type: ignore[type-var]
            async for piece in pieces:
                now = clock() - start
                if record.first is None:
                    record.first = now
                else:
                    record.gaps.append(now - last)
                last = now
                parts.append(piece)
        record.end = clock() - start
    except Exception as exc:  # noqa: BLE001 - every failure is a result here, counted by kind
        record.error = error_kind(exc)
    texts[record.index] = "".join(parts)


async def run_load(
    requests: Sequence[BenchRequest],
    load: LoadSpec,
    send: Sender,
    tokenizer: Tokenizer,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Send `requests[i]` at `load.times[i]` (the list cycled when there are more times than requests) and
    return one record per request sent, in sending order, output tokens counted with `tokenizer` after the run."""
    gate = asyncio.Semaphore(load.concurrency) if load.concurrency else None
    texts: dict[int, str] = {}
    records: list[RequestRecord] = []
    in_flight: set[asyncio.Task] = set()
    deadline = math.inf if load.duration_s is None else load.duration_s
    start = time.perf_counter()

    async def go(request: BenchRequest, record: RequestRecord) -> None:
        try:
            await _one(send, request, record, start, texts)
        finally:
            if gate is not None:
                gate.release()
        if on_done is not None:
            on_done(record)

    try:
        # one producer sends in schedule order; a task exists only while its request is in flight, so memory
        # follows the concurrency, not the number of requests (a --duration run may schedule millions)
        for i, at in enumerate(load.times):
            if at > deadline:
                break
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if gate is not None:
                await gate.acquire()
            if time.perf_counter() - start > deadline:  # held back past --duration: not sent
                if gate is not None:
                    gate.release()
                break
            request = requests[i % len(requests)]
            record = RequestRecord(i, at, request.input_tokens, request.max_tokens)
            records.append(record)
            task = asyncio.create_task(go(request, record))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        await asyncio.gather(*in_flight)
    finally:
        for task in list(in_flight):
            task.cancel()
    for record in records:
        if record.ok:
            record.output_tokens = len(tokenizer.encode(texts.get(record.index, ""), add_special_tokens=False))
    return records


def client_sender(client: Any, sampling: Sampling) -> Sender:
    """Requests through an hpc.client.AsyncClient (a deployment or a job: its gateway, else its replicas)."""

    def send(request: BenchRequest, timing: dict[str, int]) -> AsyncIterator[str]:
        return client.stream(request.prompt, request.max_tokens, timing, **sampling)

    return send


def gateway_sender(http: httpx.AsyncClient, url: str, model: str, token: str | None, sampling: Sampling) -> Sender:
    """Requests to a gateway URL's `/v1/completions`, streamed (the client's own gateway transport)."""

    def send(request: BenchRequest, timing: dict[str, int]) -> AsyncIterator[str]:
        params = generate_params(request.prompt, request.max_tokens, sampling)
        return gateway_stream(http, url.rstrip("/"), model, params, token, stream=True, timing=timing)

    return send
