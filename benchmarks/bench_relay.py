"""Whether one gateway keeps up with a cluster: the aggregate tokens/s of N replicas direct against through the
gateway, side by side in one run, and the gateway's CPU per request and per relayed token.

One local job of `--replicas` replicas (the llmapi workflow, `--backend`'s engine: `cpu`, paced by
`--min-step-ms` as a GPU would be, or `sim`, the simulated GPU engine where this tree has it) and one
`hpc-serve gateway` (its own process; with `--gateway-workers 2 4`, one more gateway side of 2 and of 4 worker
processes), then
`--concurrency` streaming clients, always a request in flight each, for `--seconds`, rounds alternating:

  direct   the replicas' gRPC stream (hpc.serving.triton.TritonEngine: the very request the gateway sends),
           each request to the replica with the fewest in flight, as the gateway's balancer spreads them
  gateway  POST /v1/completions with `stream: true` (aiohttp's client where installed, else httpx), read to
           `[DONE]`; tokens from the answer's usage

Per side: generated tokens per second (median of the rounds), and the ratio gateway / direct; for the gateway, the
CPU seconds of its processes (/proc/<pid>/stat, the gateway and every process under it) per request and per
relayed token (the relay's own cost, whatever the engine's pace).

    python benchmarks/bench_relay.py [--replicas 2] [--concurrency 64] [--max-tokens 200] [--seconds 10]
                                     [--rounds 3] [--backend cpu|sim] [--min-step-ms 20] [--gateway-workers N ...]
                                     [--set model.key=value ...] [--cpus ENGINE:GATEWAY:CLIENT] [--client-procs N]
                                     [--baseline TREE] (another commit's gateway, one more side: `git archive`)
                                     [--profile FILE] (the gateway under cProfile)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gateway_procs  # noqa: E402
from gateway_procs import AIOHTTP, CPUS, cli, gateway, job, parse_cpus, pin, write_spec  # noqa: E402
from gateway_sides import KEEPALIVE_S, PROMPT  # noqa: E402

from launcher.contracts.job_index import HOME_ENV  # noqa: E402
from launcher.contracts.llmapi import CPU_MIN_STEP_VAR  # noqa: E402


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` and every process under it, alive now (Linux /proc): a
    gateway's worker processes count as the gateway."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        here = todo.pop()
        total += times.get(here, 0.0)
        todo += [child for child, parent in parents.items() if parent == here]
    return total


class Sides:
    """One request each way: the tokens it generated."""

    def __init__(self, token: str | None, records: list[Any], model: str, max_tokens: int) -> None:
        from hpc.serving.triton import TritonEngine

        self.token, self.model, self.max_tokens = token, model, max_tokens
        self.urls: dict[str, str] = {}  # each gateway side's URL
        self.records = records
        self.in_flight = [0] * len(records)
        self.engine = TritonEngine()
        self.session: Any = None
        #: SSE events of text the gateway sides received (the finish's and the usage's aside): several tokens each
        #: when the gateway fell behind its replicas
        self.events = 0
        self.http: Any = None

    async def close(self) -> None:
        await self.engine.close()
        if self.session is not None:
            await self.session.close()
        if self.http is not None:
            await self.http.aclose()

    async def direct(self) -> int:
        from hpc.serving.model_io import GenerateParams

        slot = min(range(len(self.records)), key=self.in_flight.__getitem__)  # least outstanding
        record = self.records[slot]
        self.in_flight[slot] += 1
        try:
            params = GenerateParams(PROMPT, self.max_tokens, ignore_eos=True)
            how = (record.workflow, record.decoupled, record.llmapi_model)
            tokens = 0
            async for chunk in self.engine.stream(record.grpc_url, params, self.token, *how):
                tokens += chunk.tokens or 0
        finally:
            self.in_flight[slot] -= 1
        return tokens or self.max_tokens  # a model that counts none (llmapi) ran to max_tokens: ignore_eos

    def _body(self) -> dict:
        body = {"model": self.model, "prompt": PROMPT, "max_tokens": self.max_tokens, "stream": True}
        return body | {"stream_options": {"include_usage": True}, "ignore_eos": True}

    def call(self, side: str) -> Callable[[], Awaitable[int]]:
        """One request of `side`: `direct`, or a gateway side (this tree's with each `--gateway-workers` count,
        `baseline`: another tree's) by its URL."""
        if side == "direct":
            return self.direct
        return functools.partial(self.relayed, self.urls[side])

    async def relayed(self, url: str) -> int:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        usage: dict[str, int] = {}
        if AIOHTTP:
            import aiohttp

            if self.session is None:
                connector = aiohttp.TCPConnector(limit=4096, keepalive_timeout=KEEPALIVE_S)
                self.session = aiohttp.ClientSession(headers=headers, connector=connector)
            async with self.session.post(url + "/v1/completions", json=self._body()) as response:
                async for raw in response.content:
                    usage = _usage(raw) or usage
                    self.events += raw.startswith(b'data: {"id"') and b'"finish_reason": null' in raw
        else:
            import httpx

            if self.http is None:
                limits = httpx.Limits(max_connections=4096, keepalive_expiry=KEEPALIVE_S)
                self.http = httpx.AsyncClient(headers=headers, timeout=300, limits=limits, trust_env=False)
            async with self.http.stream("POST", url + "/v1/completions", json=self._body()) as response:
                async for line in response.aiter_lines():
                    usage = _usage(line.encode()) or usage
                    self.events += line.startswith('data: {"id"') and '"finish_reason": null' in line
        return usage.get("completion_tokens", 0)


def _usage(line: bytes) -> dict[str, int] | None:
    """An SSE line's `usage`, if it is the usage event."""
    if line.startswith(b'data: {"id"') and b'"usage": {' in line:
        return json.loads(line[6:])["usage"]
    return None


async def _clients(sides: Sides, side: str, streams: int, deadline: float) -> tuple[int, int]:
    """`streams` clients of `side`, each sending its next request as its last one ends, until `deadline`
    (time.time()): (tokens, requests)."""
    call = sides.call(side)
    requests = 0

    async def client() -> int:
        nonlocal requests
        done = 0
        while time.time() < deadline:
            done += await call()
            requests += 1
        return done

    return sum(await asyncio.gather(*(client() for _ in range(streams)))), requests


def _client_process(setup: dict[str, Any], side: str, streams: int, start: float, seconds: float) -> dict[str, float]:
    """One client process of `--client-procs`: its share of the streams from `start` (time.time(), the same in
    every process) for `seconds`; its tokens, requests, events and CPU seconds."""
    sides = Sides(setup["token"], setup["records"], setup["model"], setup["max_tokens"])
    sides.urls = setup["urls"]

    async def run() -> tuple[int, int]:
        try:
            await asyncio.sleep(max(0.0, start - time.time()))
            return await _clients(sides, side, streams, start + seconds)
        finally:
            await sides.close()

    cpu0 = tree_cpu_s(os.getpid())
    tokens, requests = asyncio.run(run())
    return {"tokens": tokens, "requests": requests, "events": sides.events, "cpu": tree_cpu_s(os.getpid()) - cpu0}


async def throughput(
    sides: Sides, side: str, streams: int, seconds: float, pid: int | None, pool: Any = None
) -> dict[str, float]:
    """`streams` requests always in flight for `seconds` (spread over `pool`'s client processes when given, so
    that the clients' own CPU is not what limits the rate): tokens per second, and the gateway's CPU (`pid`'s tree)
    per request and per token."""
    if pool is None:
        t0, cpu0, own0 = time.perf_counter(), tree_cpu_s(pid) if pid else 0.0, tree_cpu_s(os.getpid())
        events0 = sides.events
        tokens, requests = await _clients(sides, side, streams, time.time() + seconds)
        wall = time.perf_counter() - t0
        own, events = tree_cpu_s(os.getpid()) - own0, sides.events - events0
    else:
        loop = asyncio.get_running_loop()
        setup = {"token": sides.token, "records": sides.records, "model": sides.model, "urls": sides.urls}
        setup["max_tokens"] = sides.max_tokens
        start, procs = time.time() + 1.0, pool._max_workers
        shares = [streams // procs + (i < streams % procs) for i in range(procs)]
        done = [
            loop.run_in_executor(pool, _client_process, setup, side, share, start, seconds) for share in shares if share
        ]
        await asyncio.sleep(max(0.0, start - time.time()))
        t0, cpu0 = time.perf_counter(), tree_cpu_s(pid) if pid else 0.0
        results = await asyncio.gather(*done)
        wall = time.perf_counter() - t0
        tokens, requests = sum(int(r["tokens"]) for r in results), sum(int(r["requests"]) for r in results)
        own, events = sum(r["cpu"] for r in results), sum(int(r["events"]) for r in results)
    cpu = (tree_cpu_s(pid) - cpu0) if pid else 0.0
    return {
        "rate": tokens / wall,
        "ms_request": cpu / max(requests, 1) * 1e3,
        "us_token": cpu / max(tokens, 1) * 1e6,
        "cpu_share": cpu / wall,
        "client_us_token": own / max(tokens, 1) * 1e6,
        "tokens_event": tokens / max(events, 1),
    }


async def measure(args: argparse.Namespace, sides: Sides, pids: dict[str, int], pool: Any) -> None:
    order = ("direct", *pids)
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in order}
    for side in order:  # warm-up at full concurrency
        await throughput(sides, side, args.concurrency, min(2.0, args.seconds), None, pool)
    for r in range(args.rounds):
        for side in order if r % 2 == 0 else order[::-1]:
            runs[side].append(await throughput(sides, side, args.concurrency, args.seconds, pids.get(side), pool))
    med = {k: {m: statistics.median(run[m] for run in v) for m in v[0]} for k, v in runs.items()}
    print(
        f"{args.replicas} replicas ({args.backend}), {args.concurrency} streams of {args.max_tokens} tokens, "
        f"{args.rounds} rounds of {args.seconds:g} s (gateway: 1 worker; gateway_wN: N workers):"
    )
    for side in order:
        rounds = " ".join(f"{run['rate']:.0f}" for run in runs[side])
        print(f"  {side:8} {med[side]['rate']:9.0f} tokens/s   rounds: {rounds}")
    for side in pids:
        print(f"  {side} / direct: {med[side]['rate'] / med['direct']['rate']:.3f}")
    for side in pids:
        g = med[side]
        print(
            f"  {side} CPU: {g['ms_request']:.2f} ms per request, {g['us_token']:.1f} us per relayed token, "
            f"{g['cpu_share']:.2f} cores busy, {g['tokens_event']:.2f} tokens an event"
        )
    print(
        f"  the clients' CPU per token: direct (hpc.serving.triton, the gateway's gRPC half) "
        f"{med['direct']['client_us_token']:.1f} us; through the gateway (aiohttp's SSE reading) "
        f"{med['gateway']['client_us_token']:.1f} us"
    )
    for side in pids:
        if side.startswith("gateway_w"):
            print(f"  {side} / gateway: {med[side]['rate'] / med['gateway']['rate']:.3f}")
    if "baseline" in pids:
        print(
            f"  CPU per relayed token, gateway / baseline: {med['gateway']['us_token'] / med['baseline']['us_token']:.3f}"
        )


def _give_way(record: Path, pid: int) -> None:
    """Remove gateway `pid`'s address record, once it wrote it (a gateway of workers writes it once they all
    serve, maybe after its health route answered), so that the next gateway of the deployment starts."""
    from launcher.contracts.records import read_gateway

    deadline = time.monotonic() + 60
    while (found := read_gateway(record)) is None or found.pid != pid:
        assert time.monotonic() < deadline, f"gateway {pid} wrote no address record"
        time.sleep(0.1)
    record.unlink()


def apply_sets(spec_path: Path, sets: list[str]) -> None:
    """`--set a.b=value` into the spec (value read as YAML): a backend's own settings, e.g. the simulated engine's
    profile."""
    spec = yaml.safe_load(spec_path.read_text())
    for item in sets:
        key, _, value = item.partition("=")
        *parents, last = key.split(".")
        node = spec
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = yaml.safe_load(value)
    spec_path.write_text(yaml.safe_dump(spec))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64, help="streams in flight, each side")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0, help="one round's length")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--backend",
        default="cpu",
        help="the spec's model.backend: cpu, or sim (configs/sim-h200.yaml's Llama 3.1 8B on a simulated H200, "
        "unless --set says otherwise)",
    )
    parser.add_argument(
        "--min-step-ms",
        type=float,
        default=20.0,
        help=f"the CPU engine's least step time (${CPU_MIN_STEP_VAR}): a GPU's pace, not the CPU's (0: as fast as it goes)",
    )
    parser.add_argument(
        "--gateway-workers",
        type=int,
        nargs="+",
        default=[1],
        help="a gateway side for each count of worker processes beside the one of 1 (e.g. 2 4)",
    )
    parser.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="processes the streaming clients are spread over (a Python client spends ~100 us of CPU a token: "
        "one process cannot read 8 GPU replicas' aggregate)",
    )
    parser.add_argument("--set", action="append", default=[], help="KEY.PATH=VALUE into the spec (repeatable)")
    parser.add_argument("--auth", choices=["token", "none"], default="token", help="the job's `auth:`")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint folder; default: a tiny random GPT-2")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (deployment, gateway log)")
    parser.add_argument(
        "--baseline", type=Path, help="a source tree of another commit: its gateway is one more side (`git archive`)"
    )
    parser.add_argument("--profile", type=Path, help="run the gateway under cProfile, its stats written to this file")
    parser.add_argument("--cpus", type=parse_cpus, help="ENGINE:GATEWAY:CLIENT cores (e.g. 0-7:8-11:12-15)")
    args = parser.parse_args()
    CPUS.update(args.cpus or {})
    from launcher.contracts.layout import JobPaths, gateway_record
    from launcher.contracts.records import read_endpoints

    work = Path(tempfile.mkdtemp(prefix="bench-relay-"))
    os.environ[HOME_ENV] = str(work / "hpc-home")
    if args.min_step_ms:
        os.environ[CPU_MIN_STEP_VAR] = f"{args.min_step_ms:g}"
    checkpoint = args.checkpoint
    sets = list(args.set)
    if checkpoint is None and args.backend == "sim":  # configs/sim-h200.yaml's model, its checkpoint made by submit
        checkpoint = work / "sim-llama"
        sets = ["model.init={model: llama-3.1-8b}", "model.sim={gpu: h200}", *sets]
    elif checkpoint is None:
        from backend.cpu_engine.init_model import create_checkpoint

        checkpoint = Path(create_checkpoint(work / "tiny-gpt2", family="gpt2", size="tiny", seed=0))
    print(f"checkpoint: {checkpoint}\nwork folder: {work}\n")
    try:
        pin("engine")
        batch = {"max_batch_size": max(64, -(-args.concurrency // args.replicas))}  # each replica its share
        spec = write_spec(work, "bench-relay", checkpoint, args.replicas, args.auth, batch, backend=args.backend)
        apply_sets(spec, sets)
        with job(spec) as (job_id, job_dir):
            pin("client")
            records = read_endpoints(JobPaths.of_folder(job_dir))
            token = cli("token", job_id).strip() if args.auth == "token" else None
            stop = signal.SIGINT if args.profile else signal.SIGTERM  # cProfile writes its stats at a SIGINT
            command = list(gateway_procs.CLI)
            with contextlib.ExitStack() as stack:
                pool = None
                if args.client_procs > 1:  # started now, before this process opens any gRPC channel
                    context = multiprocessing.get_context("spawn")
                    pool = stack.enter_context(ProcessPoolExecutor(args.client_procs, mp_context=context))
                pids: dict[str, int] = {}
                sides = Sides(token, records, "bench-relay", args.max_tokens)
                # one gateway per deployment: each one's address record goes, and the next starts beside it
                kinds = [("baseline", (), args.baseline.resolve())] if args.baseline is not None else []
                kinds += [(f"gateway_w{n}", ("--workers", str(n)), None) for n in args.gateway_workers if n > 1]
                for name, options, source in kinds:
                    sides.urls[name], pids[name], _ = stack.enter_context(
                        gateway(job_id, work, *options, source=source)
                    )
                    _give_way(gateway_record(work / "runs", "bench-relay"), pids[name])
                if args.profile:  # the gateway's command (its alone) under cProfile
                    gateway_procs.CLI[1:1] = ["-m", "cProfile", "-o", str(args.profile.resolve())]
                sides.urls["gateway"], pids["gateway"], _ = stack.enter_context(gateway(job_id, work, stop=stop))

                async def run() -> None:
                    try:
                        await measure(args, sides, pids, pool)
                    finally:
                        await sides.close()

                asyncio.run(run())
            gateway_procs.CLI[:] = command
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
