"""The sides bench_gateway.py compares: one request each way (direct gRPC, the gateway with httpx or aiohttp, the
relays, the passthrough), latency and throughput loops, and the statistics its lines print.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from gateway_procs import AIOHTTP

from launcher.contracts import model_names
from launcher.contracts.llmapi import ENGINE

PROMPT = "Once upon a time"
#: how long the clients keep an idle connection: less than the servers' (uvicorn's `timeout_keep_alive`, 5 s, the
#: gateway's and the relays'), so that a client never sends on a connection the server is closing. Why: a side
#: idle for about 5 s between its throughput rounds (short rounds) lost a request to that race, as aiohttp's
#: ServerDisconnectedError (httpx's default expiry is the same 5 s)
KEEPALIVE_S = 2.0
#: the Triton passthrough's model and body per workflow (`generate_stream`): the ensemble's inputs, or the llmapi
#: model's (upstream's names)
PASSTHROUGH = {
    "engine": (model_names.ENSEMBLE, lambda n: {"text_input": PROMPT, "max_tokens": n, "stream": True}),
    "llmapi": (
        model_names.TENSORRT_LLM,
        lambda n: {"text_input": PROMPT, "sampling_param_max_tokens": n, "streaming": True},
    ),
}


def engine_steps(metrics_url: str) -> float:
    """The replica's engine iterations so far (the CPU engine's `iteration_counter` gauge): steps per round and
    generated tokens per step tell whether a side's lower rate is the engine stepping slower or its batch
    holding fewer rows (requests spending their time outside the engine, in the client or the gateway)."""
    from backend.models.engine_metrics import GENERAL
    from hpc.serving.metrics import parse, scrape

    for sample in parse(scrape(metrics_url), prefixes=(GENERAL,)):
        if sample.labels.get("general_type") == "iteration_counter":
            return sample.value
    return float("nan")


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of process `pid` (Linux /proc), or of this process."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def added_interval(side: list[float], direct: list[float], q: float, draws: int = 1000) -> tuple[float, float]:
    """A 95 % bootstrap interval of `pct(side, q) - pct(direct, q)`. Why: one request's time varies by
    milliseconds with the engine's own steps, so with a few hundred requests a side the p50 difference itself
    moves by ~0.5 ms from run to run: a sub-millisecond overhead is read with its interval, not alone."""
    rng = random.Random(0)
    diffs = sorted(
        pct(rng.choices(side, k=len(side)), q) - pct(rng.choices(direct, k=len(direct)), q) for _ in range(draws)
    )
    return diffs[int(0.025 * draws)], diffs[int(0.975 * draws) - 1]


def paired_added(side: list[float], direct: list[float], draws: int = 1000) -> tuple[float, float, float]:
    """The median of the per-turn differences (the sides take turns, so request i of each side ran within
    milliseconds of the other's, in the same state of the engine) and its 95 % bootstrap interval. Why: the
    difference of two p50s carries both sides' spread of the engine's own jitter; pairs cancel most of it."""
    diffs = [s - d for s, d in zip(side, direct, strict=True)]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(draws))
    return statistics.median(diffs), medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


class Reading:
    """A client reading the gateway's SSE answer: when its first event came, and the tokens its `usage` counts."""

    def __init__(self) -> None:
        self.t0, self.tokens = time.perf_counter(), 0
        self.first: float | None = None

    def line(self, line: str) -> bool:
        """Take one line of the answer; True at `[DONE]`."""
        if self.first is None and line.startswith("data:"):
            self.first = time.perf_counter() - self.t0
        if line.startswith('data: {"id"') and '"usage": {' in line:
            self.tokens = json.loads(line[6:])["usage"]["completion_tokens"]
        return line == "data: [DONE]"

    def result(self) -> tuple[float, float, int]:
        """(seconds to the first event, seconds in all, tokens)."""
        return self.first or 0.0, time.perf_counter() - self.t0, self.tokens


class Sides:
    """One request, either way: (seconds to the first text, seconds in all, tokens generated). Every side asks
    with `ignore_eos`, so each generation runs to `max_tokens` whatever the random model's end token says: the
    same work each way, and a count for the llmapi model, which reports none (hpc/serving/model_io.py)."""

    def __init__(self, url: str, token: str | None, record: Any, model: str, max_tokens: int) -> None:
        from hpc.serving.triton import TritonEngine

        self.url, self.token, self.model, self.max_tokens = url, token, model, max_tokens
        #: the replica: its gRPC address and what its endpoint record says of its model (workflow, decoupled,
        #: which llmapi model), as the gateway reads them
        self.grpc_url = record.grpc_url
        self.how = (record.workflow, record.decoupled, record.llmapi_model)
        self.engine = TritonEngine()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024, keepalive_expiry=KEEPALIVE_S)
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits, trust_env=False)

        self.aio: Any = None  # an aiohttp session, made on the loop that uses it
        self.turn = 0  # gw_two's alternation
        self.floor_urls: dict[str, str] = {}  # benchmarks/minimal_relay.py's, plain and --fastapi, when they run

    async def close(self) -> None:
        await self.http.aclose()
        await self.engine.close()
        if self.aio is not None:
            await self.aio.close()

    def _body(self) -> dict:
        body = {"model": self.model, "prompt": PROMPT, "max_tokens": self.max_tokens, "stream": True}
        return body | {"stream_options": {"include_usage": True}, "ignore_eos": True}

    async def gateway(self) -> tuple[float, float, int]:
        reading = Reading()
        async with self.http.stream("POST", "/v1/completions", json=self._body()) as response:
            async for line in response.aiter_lines():
                if reading.line(line):
                    break
        return reading.result()

    async def gw_aiohttp(self) -> tuple[float, float, int]:
        """`gateway` with aiohttp as the client."""
        return await self._aiohttp(self.url + "/v1/completions")

    async def gw_two(self) -> tuple[float, float, int]:
        """`gw_aiohttp` spread over two gateway processes of this tree, request by request (throughput only):
        whether one gateway's event loop is what holds the rate back."""
        self.turn += 1
        url = self.url if self.turn % 2 else self.floor_urls["second"]
        return await self._aiohttp(url + "/v1/completions")

    async def floor(self) -> tuple[float, float, int]:
        """The same request to benchmarks/minimal_relay.py (aiohttp as the client): the least any Python HTTP
        relay of the replica's gRPC stream costs."""
        return await self._aiohttp(self.floor_urls["floor"])

    async def floor_late(self) -> tuple[float, float, int]:
        """The floor with its response head sent after the replica's first piece, as the gateway sends it."""
        return await self._aiohttp(self.floor_urls["floor_late"])

    async def floor_fastapi(self) -> tuple[float, float, int]:
        """The floor as one FastAPI route: what the web framework adds to it."""
        return await self._aiohttp(self.floor_urls["floor_fastapi"])

    async def _aiohttp(self, url: str) -> tuple[float, float, int]:
        import aiohttp

        if self.aio is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            connector = aiohttp.TCPConnector(limit=1024, keepalive_timeout=KEEPALIVE_S)
            self.aio = aiohttp.ClientSession(headers=headers, connector=connector)
        reading = Reading()
        async with self.aio.post(url, json=self._body()) as response:
            async for raw in response.content:
                if reading.line(raw.decode().rstrip("\r\n")):
                    break
        return reading.result()

    async def baseline(self) -> tuple[float, float, int]:
        """`gw_aiohttp` to the gateway of another source tree (`--baseline`), in the same run: a change to the
        gateway measured against the code before it, side by side, as the lent machines differ by more than the
        change from one lease to the next."""
        return await self._aiohttp(self.floor_urls["baseline"] + "/v1/completions")

    async def passthrough(self) -> tuple[float, float, int]:
        """Triton's generate_stream through the gateway: its relay alone (no OpenAI shapes, no gRPC)."""
        model, body = PASSTHROUGH.get(self.how[0], PASSTHROUGH[ENGINE])
        t0 = time.perf_counter()
        first, tokens = None, 0
        async with self.http.stream(
            "POST", f"/v2/models/{model}/generate_stream", json=body(self.max_tokens)
        ) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    if first is None and '"text_output":""' not in line.replace(" ", ""):
                        first = time.perf_counter() - t0
                    tokens += 1
        return first or 0.0, time.perf_counter() - t0, tokens

    async def direct(self) -> tuple[float, float, int]:
        from hpc.serving.model_io import GenerateParams

        t0 = time.perf_counter()
        first, tokens = None, 0
        params = GenerateParams(PROMPT, self.max_tokens, ignore_eos=True)
        async for chunk in self.engine.stream(self.grpc_url, params, self.token, *self.how):
            if first is None and chunk.text:  # as the gateway's first event: the first text, not the first token
                first = time.perf_counter() - t0
            tokens += chunk.tokens or 0
        # a model that counts no tokens (llmapi) ran to max_tokens: ignore_eos, as the gateway then counts
        return first or 0.0, time.perf_counter() - t0, tokens or self.max_tokens


#: the gateway with aiohttp as the client, where it is installed (an extra, not a dependency)
GW_SIDES = ("gateway", "gw_aiohttp") if AIOHTTP else ("gateway",)


#: the floor (benchmarks/minimal_relay.py) needs aiohttp as its client too
FLOOR = ("floor", "floor_late", "floor_fastapi") if AIOHTTP else ()


SIDES = ("direct", *GW_SIDES, *FLOOR, "passthrough")


async def latency(sides: Sides, n: int, names: tuple[str, ...] = SIDES) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {s: {"ttft": [], "total": []} for s in names}
    warm = min(20, n)  # unmeasured warm-up rounds: 20, fewer only in a run shorter than that (a smoke test)
    for i in range(n + warm):
        k = i % len(names)
        for side in names[k:] + names[:k]:  # each side first in turn
            ttft, total, _ = await getattr(sides, side)()
            if i >= warm:
                out[side]["ttft"].append(ttft)
                out[side]["total"].append(total)
    return out


async def throughput(
    call: Callable[[], Awaitable[tuple[float, float, int]]], streams: int, seconds: float, gateway_pid: int | None
) -> dict[str, float]:
    """`streams` requests always in flight for `seconds`: generated tokens per second, and CPU milliseconds per
    request of this process (the client) and of the gateway's (`gateway_pid`, when the gateway is used)."""
    deadline = time.perf_counter() + seconds
    requests = 0

    async def worker() -> int:
        nonlocal requests
        done = 0
        while time.perf_counter() < deadline:
            done += (await call())[2]
            requests += 1
        return done

    t0, client0, gw0 = time.perf_counter(), cpu_s(), cpu_s(gateway_pid) if gateway_pid else 0.0
    tokens = sum(await asyncio.gather(*(worker() for _ in range(streams))))
    wall = time.perf_counter() - t0
    gw = (cpu_s(gateway_pid) - gw0) if gateway_pid else 0.0
    client_ms = (cpu_s() - client0) / requests * 1e3
    return {"rate": tokens / wall, "wall": wall, "client_ms": client_ms, "gateway_ms": gw / requests * 1e3}
