"""What `hpc-serve gateway` adds, against direct gRPC streaming to the same replica, side by side in one run;
and what prefix affinity keeps of the KV-reuse opportunities of a shared-prefix workload over 2 replicas.

Part 1, one local CPU-engine job (tiny random GPT-2, one replica) and one gateway (`hpc-serve gateway`, its own
process) in front of it. The same generation (prompt, `max_tokens`, greedy) two ways:

  gateway  POST /v1/completions with `stream: true` over HTTP (httpx, one connection pool), read to `[DONE]`
           (latency also: `passthrough`, Triton's generate_stream through the gateway: its HTTP relay alone)
  gw_aiohttp  the same request with aiohttp as the client (when installed): what of the gateway side is the
           HTTP client's own cost (httpx, which the openai package uses, spends ~4x aiohttp's CPU per request)
  direct   the ensemble over Triton's gRPC streaming API to the replica the gateway uses (tritonclient's
           asyncio client, through hpc.gateway.triton.TritonEngine: the very request the gateway sends)

  latency      one stream at a time, the sides taking turns request by request: p50 / p99 of the whole
               request and of the time to the first token; the ratio and the milliseconds the gateway adds
  throughput   `--concurrency` streams at once, each sending requests back to back for `--seconds`; rounds
               alternate direct / gateway; generated tokens per second (median of the rounds) and the ratio

Part 2, one local job with 2 replicas: `--prefixes` documents of ~300 characters, `--questions` questions
about each, shuffled (fixed seed) and sent `--workers` at a time through a gateway with prefix affinity (the
default), then through one with `--prefix-chars 0` (least outstanding, turns among equals), each request's
replica read from `x-hpc-serve-replica`. A request *keeps* a KV-reuse opportunity when an earlier request
(in sending order) of its document went to the same replica; at best `requests - prefixes` are kept. Counted
twice: with caches that keep everything, and with caches that hold only the `--cache-docs` documents a
replica saw last (a KV cache smaller than the working set, where splitting the documents between replicas is
what counts). Pure round robin over the same order is computed, not run. The CPU engine does not reuse KV blocks across requests:
this counts opportunities (what TensorRT-LLM's `enable_kv_cache_reuse` could use), not time saved.

    python benchmarks/bench_gateway.py [--requests 200] [--concurrency 64] [--seconds 10] [--rounds 3]
                                       [--prefixes 16] [--questions 8] [--cache-docs 8] [--part overhead|prefix]
                                       [--baseline TREE]   (another commit's tree: `git archive COMMIT | tar x -C TREE`)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import yaml  # noqa: E402

CLI = [sys.executable, "-m", "hpc.cli"]
PROMPT = "Once upon a time"


#: `--cpus`: the cores of the engine's job, of the gateways and relays, and of this process (the clients)
CPUS: dict[str, set[int]] = {}


def parse_cpus(text: str) -> dict[str, set[int]]:
    """`--cpus ENGINE:GATEWAY:CLIENT`, each a list of cores as taskset writes them (`0-7:8-11:12-15`)."""

    def cores(part: str) -> set[int]:
        out: set[int] = set()
        for piece in part.split(","):
            low, _, high = piece.partition("-")
            out |= set(range(int(low), int(high or low) + 1))
        return out

    engine, gateway, client = text.split(":")
    return {"engine": cores(engine), "gateway": cores(gateway), "client": cores(client)}


def pin(role: str) -> None:
    """This process (and what it starts from now on) onto `role`'s cores, when `--cpus` gave them."""
    if role in CPUS:
        os.sched_setaffinity(0, CPUS[role])


def on_relay_cores() -> None:
    """A relay's (gateway's) preexec: its own cores, as it would have on a login node apart from the engine."""
    pin("gateway")


def cli(*args: str) -> str:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"hpc-serve {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def write_spec(work: Path, name: str, checkpoint: Path, replicas: int, auth: str) -> Path:
    spec = {
        "auth": auth,
        "name": name,
        "workdir": str(work / "runs"),
        "slurm": {"nodes": 1, "ntasks_per_node": replicas, "time": "00:30:00"},
        "model": {"backend": "cpu", "checkpoint_dir": str(checkpoint), "tp_size": 1},
        "triton": {"triton_max_batch_size": 64, "ready_timeout_s": 300},
        "replicas": replicas,
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@contextmanager
def job(spec: Path) -> Iterator[tuple[str, Path]]:
    """A READY local job: (job id, job folder); cancelled at the end."""
    first = cli("submit", str(spec), "--executor", "local", "--wait", "--timeout", "280").splitlines()[0].split()
    try:
        yield first[0], Path(first[1])
    finally:
        subprocess.run([*CLI, "cancel", first[0]], capture_output=True, timeout=120)


@contextmanager
def gateway(job_id: str, work: Path, *options: str, source: Path | None = None) -> Iterator[tuple[str, int, Path]]:
    """`hpc-serve gateway JOB` in its own process, once it found the job's replicas: (its URL, its pid, the file
    its stderr and so its access log go to). `source`: the gateway of another source tree (`--baseline`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = (work / f"gateway-{port}.log").open("w")
    env = os.environ | ({"PYTHONPATH": f"{source}:{os.environ.get('PYTHONPATH', '')}"} if source else {})
    proc = subprocess.Popen(
        [*CLI, "gateway", job_id, "--port", str(port), *options], stderr=log, env=env, preexec_fn=on_relay_cores
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/v2/health/ready", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, f"the gateway exited; see {log.name}"
            time.sleep(0.2)
        yield url, proc.pid, Path(log.name)
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


@contextmanager
def floor_relay(grpc_url: str, token: str | None, *options: str) -> Iterator[str]:
    """benchmarks/minimal_relay.py in its own process (where aiohttp, its client here, is installed): its URL."""
    if not FLOOR:
        yield ""
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    relay = Path(__file__).resolve().parent / "minimal_relay.py"
    command = [sys.executable, str(relay), grpc_url, str(port), *([token] if token else []), *options]
    proc = subprocess.Popen(command, preexec_fn=on_relay_cores)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "minimal_relay.py did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(15)


@contextmanager
def baseline(job_id: str, work: Path, source: Path | None) -> Iterator[str]:
    """The gateway of the `--baseline` source tree beside this one (its URL), or nothing without one."""
    if source is None or not FLOOR:  # its client is aiohttp's, as gw_aiohttp's
        yield ""
        return
    with gateway_beside(job_id, work, source.resolve()) as url:
        yield url


@contextmanager
def gateway_beside(job_id: str, work: Path, source: Path | None = None) -> Iterator[str]:
    """One more gateway of the job, started before the measured one (its URL): one gateway per deployment, so its
    address record goes, and the next gateway starts beside it."""
    from launcher.layout import gateway_record

    with gateway(job_id, work, source=source) as (url, _, _):
        gateway_record(work / "runs", "bench-gw").unlink()
        yield url


def engine_steps(metrics_url: str) -> float:
    """The replica's engine iterations so far (the CPU engine's `iteration_counter` gauge): steps per round and
    generated tokens per step tell whether a side's lower rate is the engine stepping slower or its batch
    holding fewer rows (requests spending their time outside the engine, in the client or the gateway)."""
    text = httpx.get(metrics_url, timeout=10, trust_env=False).text
    for line in text.splitlines():
        if line.startswith("nv_trt_llm_general_metrics") and 'general_type="iteration_counter"' in line:
            return float(line.rsplit(" ", 1)[1])
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
    """One request, either way: (seconds to the first text, seconds in all, tokens generated)."""

    def __init__(self, url: str, token: str | None, grpc_url: str, model: str, max_tokens: int) -> None:
        from hpc.gateway.triton import TritonEngine

        self.url, self.token, self.grpc_url, self.model, self.max_tokens = url, token, grpc_url, model, max_tokens
        self.engine = TritonEngine()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
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
        return body | {"stream_options": {"include_usage": True}}

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
            self.aio = aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=1024))
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
        body = {"text_input": PROMPT, "max_tokens": self.max_tokens, "stream": True}
        t0 = time.perf_counter()
        first, tokens = None, 0
        async with self.http.stream("POST", "/v2/models/ensemble/generate_stream", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    if first is None and '"text_output":""' not in line.replace(" ", ""):
                        first = time.perf_counter() - t0
                    tokens += 1
        return first or 0.0, time.perf_counter() - t0, tokens

    async def direct(self) -> tuple[float, float, int]:
        from hpc.gateway.triton import GenerateParams

        t0 = time.perf_counter()
        first, tokens = None, 0
        async for chunk in self.engine.stream(self.grpc_url, GenerateParams(PROMPT, self.max_tokens), self.token):
            if first is None and chunk.text:  # as the gateway's first event: the first text, not the first token
                first = time.perf_counter() - t0
            tokens += chunk.tokens
        return first or 0.0, time.perf_counter() - t0, tokens


#: the gateway with aiohttp as the client, where it is installed (an extra, not a dependency)
GW_SIDES = ("gateway", "gw_aiohttp") if importlib.util.find_spec("aiohttp") else ("gateway",)
#: the floor (benchmarks/minimal_relay.py) needs aiohttp as its client too
FLOOR = ("floor", "floor_late", "floor_fastapi") if importlib.util.find_spec("aiohttp") else ()
SIDES = ("direct", *GW_SIDES, *FLOOR, "passthrough")


async def latency(sides: Sides, n: int, names: tuple[str, ...] = SIDES) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {s: {"ttft": [], "total": []} for s in names}
    for i in range(n + 20):  # 20 unmeasured warm-up rounds
        k = i % len(names)
        for side in names[k:] + names[:k]:  # each side first in turn
            ttft, total, _ = await getattr(sides, side)()
            if i >= 20:
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
    return {"rate": tokens / wall, "client_ms": (cpu_s() - client0) / requests * 1e3, "gateway_ms": gw / requests * 1e3}


def workload(prefixes: int, questions: int, seed: int = 0) -> list[tuple[int, str]]:
    words = "the of river mountain report annual budget policy engine weather station harbor data".split()
    rng = random.Random(seed)
    docs = [f"Document {d}: " + " ".join(rng.choice(words) for _ in range(50)) for d in range(prefixes)]
    items = [
        (d, f"{docs[d][:300]}\nQuestion {q}: what is it about?") for d in range(prefixes) for q in range(questions)
    ]
    rng.shuffle(items)
    return items


def kept(docs: list[int], replicas: list[str], cache: int | None = None) -> int:
    """Requests whose document an earlier request (in sending order) had brought to the same replica, which
    holds the `cache` documents it saw last (None: every one it saw)."""
    held: dict[str, list[int]] = {}
    count = 0
    for doc, replica in zip(docs, replicas, strict=True):
        recent = held.setdefault(replica, [])
        if doc in recent:
            count += 1
            recent.remove(doc)
        recent.append(doc)
        if cache is not None and len(recent) > cache:
            recent.pop(0)
    return count


async def shared_prefix(url: str, token: str | None, model: str, items: list[tuple[int, str]], workers: int):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    replicas: list[str] = [""] * len(items)
    queue = iter(enumerate(items))
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, trust_env=False) as http:

        async def worker() -> None:
            for i, (_, prompt) in queue:
                body = {"model": model, "prompt": prompt, "max_tokens": 8}
                response = await http.post("/v1/completions", json=body)
                response.raise_for_status()
                replicas[i] = response.headers["x-hpc-serve-replica"]

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        return replicas, time.perf_counter() - t0


async def part1(
    args: argparse.Namespace,
    url: str,
    pid: int,
    log: Path,
    token: str | None,
    record: Any,
    floors: dict[str, str],
) -> None:
    """Part 1: latency one stream at a time (skipped with `--requests 0`), then throughput."""
    grpc_url, metrics_url = record.grpc_url, record.metrics_url
    sides = Sides(url, token, grpc_url, "bench-gw", args.max_tokens)
    sides.floor_urls = floors
    names = (*SIDES, "baseline") if "baseline" in floors else SIDES
    try:
        if args.requests:
            await latency_part(args, sides, names, log)
        await throughput_part(args, sides, pid, metrics_url)
    finally:
        await sides.close()


async def latency_part(args: argparse.Namespace, sides: Sides, names: tuple[str, ...], log: Path) -> None:
    """Part 1's latency: every side one request at a time, in turns."""
    lat = await latency(sides, args.requests, names)
    print(f"latency, 1 stream, {args.requests} requests each, max_tokens {args.max_tokens} (ms):")
    print(f"  {'':10} {'p50':>8} {'p99':>8} {'ttft p50':>9} {'ttft p99':>9}")
    for side in names:
        v = lat[side]
        print(
            f"  {side:10} {pct(v['total'], 50) * 1e3:8.2f} {pct(v['total'], 99) * 1e3:8.2f}"
            f" {pct(v['ttft'], 50) * 1e3:9.2f} {pct(v['ttft'], 99) * 1e3:9.2f}"
        )
    d = lat["direct"]
    for gw_side in (*GW_SIDES, *FLOOR):
        g = lat[gw_side]
        for what in ("total", "ttft"):
            for q in (50, 99):
                added = (pct(g[what], q) - pct(d[what], q)) * 1e3
                ratio = pct(g[what], q) / pct(d[what], q)
                low, high = (v * 1e3 for v in added_interval(g[what], d[what], q))
                print(
                    f"  {gw_side} {what} p{q}: {ratio:.3f}x direct, {added:+.2f} ms added"
                    f" (95 % interval {low:+.2f} .. {high:+.2f})"
                )
            median, low, high = (v * 1e3 for v in paired_added(g[what], d[what]))
            print(
                f"  {gw_side} {what}, turn by turn: {median:+.2f} ms added (median, 95 % interval {low:+.2f} .. {high:+.2f})"
            )
    if "baseline" in names and "gw_aiohttp" in names:
        g, b = lat["gw_aiohttp"], lat["baseline"]
        for what in ("total", "ttft"):
            change = (pct(g[what], 50) - pct(b[what], 50)) * 1e3
            low, high = (v * 1e3 for v in added_interval(g[what], b[what], 50))
            print(
                f"  this tree against --baseline, {what} p50: {change:+.2f} ms (95 % interval {low:+.2f} .. {high:+.2f})"
            )
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    inside = [line for line in lines if line["route"] == "/v1/completions"][-len(GW_SIDES) * args.requests :]
    first, last = pct([i["ttft_ms"] for i in inside], 50), pct([i["latency_ms"] for i in inside], 50)
    print(
        "  inside the gateway (its access log, p50 after the request arrived): the replica's first response "
        f"{first:.2f} ms, the last byte sent {last:.2f} ms"
    )


async def throughput_part(args: argparse.Namespace, sides: Sides, pid: int, metrics_url: str) -> None:
    """Part 1's throughput: `--concurrency` streams per side, rounds alternating, with the engine's steps."""
    order = ("direct", *GW_SIDES, *(("gw_two",) if "second" in sides.floor_urls and FLOOR else ()))
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in order}
    for side in order:  # warm-up at full batch
        await throughput(getattr(sides, side), args.concurrency, 2, None)
    for r in range(args.rounds):
        for side in order if r % 2 == 0 else order[::-1]:
            gw_pid = None if side == "direct" else pid
            steps0 = engine_steps(metrics_url)
            run = await throughput(getattr(sides, side), args.concurrency, args.seconds, gw_pid)
            run["steps"] = (engine_steps(metrics_url) - steps0) / args.seconds
            runs[side].append(run)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
    print(f"\nthroughput, {args.concurrency} concurrent streams, {args.rounds} rounds of {args.seconds:g} s:")
    for side in order:
        rounds = " ".join(f"{r['rate']:.0f}" for r in runs[side])
        print(f"  {side:10} {med[side]['rate']:9.0f} tokens/s   rounds: {rounds}")
    for side in order[1:]:
        print(f"  {side} / direct: {med[side]['rate'] / med['direct']['rate']:.3f}")
    print(
        "  the engine: "
        + "; ".join(
            f"{side} {med[side]['steps']:.1f} steps/s, {med[side]['rate'] / med[side]['steps']:.1f} tokens a step"
            for side in order
        )
    )
    print(f"  CPU per request (ms): direct client {med['direct']['client_ms']:.2f}", end="")
    for side in GW_SIDES:
        print(
            f"; {side}: its client {med[side]['client_ms']:.2f} + the gateway process {med[side]['gateway_ms']:.2f}",
            end="",
        )
    print()


def picks_of(url: str) -> dict[str, int]:
    """The gateway's `hpc_serve_gateway_picks_total` by outcome (least / home / spilled), from `/metrics`."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=5, trust_env=False).text
    return {
        s.labels["outcome"]: int(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "hpc_serve_gateway_picks_total" and s.value
    }


def part2(args: argparse.Namespace, work: Path, checkpoint: Path) -> None:
    items = workload(args.prefixes, args.questions)
    docs = [d for d, _ in items]
    best = len(items) - args.prefixes
    print(
        f"\nshared prefixes, 2 replicas: {args.prefixes} documents x {args.questions} questions, {args.workers} at a time"
    )
    cache = args.cache_docs
    print(f"  KV-reuse opportunities kept (at best {best} of {len(items)}), each replica's cache unbounded / holding")
    print(f"  the last {cache} documents it saw (a KV cache smaller than the whole working set):")
    with job(write_spec(work, "bench-gw2", checkpoint, replicas=2, auth=args.auth)) as (job_id, _):
        token = cli("token", job_id).strip() if args.auth == "token" else None
        for label, options in (("prefix affinity", ()), ("least outstanding", ("--prefix-chars", "0"))):
            with gateway(job_id, work, *options) as (url, _, _):
                replicas, wall = asyncio.run(shared_prefix(url, token, "bench-gw2", items, args.workers))
                picks = picks_of(url)
            share = {r: replicas.count(r) for r in sorted(set(replicas))}
            counts = f"{kept(docs, replicas):4d} / {kept(docs, replicas, cache):4d}"
            print(f"    {label:18} {counts}   requests per replica {share}   {wall:.2f} s   picks {picks}")
        names = sorted(set(replicas))
        rr = [names[i % 2] for i in range(len(items))]
        print(
            f"    {'round robin':18} {kept(docs, rr):4d} / {kept(docs, rr, cache):4d}   (computed over the same order)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="latency: measured requests per side (0: none)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput: one round's length")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefixes", type=int, default=16, help="shared prefixes: documents")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8, help="shared prefixes: requests in flight")
    parser.add_argument("--cache-docs", type=int, default=8, help="shared prefixes: documents a replica's cache holds")
    parser.add_argument("--auth", choices=["token", "none"], default="token", help="the jobs' `auth:`")
    parser.add_argument("--part", choices=["all", "overhead", "prefix"], default="all", help="run one part only")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint folder; default: a tiny random GPT-2")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (deployments, gateway logs)")
    parser.add_argument(
        "--baseline", type=Path, help="a source tree of another commit: its gateway is one more latency side"
    )
    parser.add_argument(
        "--cpus",
        type=parse_cpus,
        help="ENGINE:GATEWAY:CLIENT cores (e.g. 0-7:8-11:12-15): each side on cores of its own, as on a cluster, "
        "so that no side's CPU slows the engine's BLAS threads (which otherwise take every core)",
    )
    args = parser.parse_args()
    CPUS.update(args.cpus or {})

    from launcher.layout import JobPaths
    from launcher.records import read_endpoints

    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    os.environ["HPC_SERVE_HOME"] = str(work / "hpc-home")
    checkpoint = args.checkpoint
    if checkpoint is None:
        from backend.cpu_engine.init_model import create_checkpoint

        checkpoint = Path(create_checkpoint(work / "tiny-gpt2", family="gpt2", size="tiny", seed=0))
    print(f"checkpoint: {checkpoint}\nwork folder: {work}\n")
    try:
        if args.part in ("all", "overhead"):
            pin("engine")
            with job(write_spec(work, "bench-gw", checkpoint, replicas=1, auth=args.auth)) as (job_id, job_dir):
                pin("client")
                (record,) = read_endpoints(JobPaths.of_folder(job_dir))
                token = cli("token", job_id).strip() if args.auth == "token" else None
                with (
                    baseline(job_id, work, args.baseline) as base,  # first: it gives way to this tree's gateway
                    gateway_beside(job_id, work) as second,  # gw_two's other half
                    gateway(job_id, work) as (url, pid, log),
                    floor_relay(record.grpc_url, token) as floor,
                    floor_relay(record.grpc_url, token, "--late-head") as floor_late,
                    floor_relay(record.grpc_url, token, "--fastapi") as floor_fastapi,
                ):
                    floors = {"floor": floor, "floor_late": floor_late, "floor_fastapi": floor_fastapi} if FLOOR else {}
                    floors |= ({"baseline": base} if base else {}) | {"second": second}
                    asyncio.run(part1(args, url, pid, log, token, record, floors))
        if args.part in ("all", "prefix"):
            part2(args, work, checkpoint)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
