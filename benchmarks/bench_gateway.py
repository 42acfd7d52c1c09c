"""What `hpc-serve gateway` adds, against direct gRPC streaming to the same replica, side by side in one run;
and what prefix affinity keeps of the KV-reuse opportunities of a shared-prefix workload over 2 replicas.

Part 1, one local CPU-engine job (tiny random GPT-2, one replica) and one gateway (`hpc-serve gateway`, its own
process) in front of it. The same generation (prompt, `max_tokens`, greedy) two ways:

  gateway  POST /v1/completions with `stream: true` over HTTP (httpx, one connection pool), read to `[DONE]`
           (latency also: `passthrough`, Triton's generate_stream through the gateway: its HTTP relay alone)
  gw_aiohttp  the same request with aiohttp as the client (when installed): what of the gateway side is the
           HTTP client's own cost (httpx, which the openai package uses, spends several times aiohttp's CPU per request)
  direct   the ensemble over Triton's gRPC streaming API to the replica the gateway uses (tritonclient's
           asyncio client, through hpc.serving.triton.TritonEngine: the very request the gateway sends)

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
                                       [--cpus ENGINE:GATEWAY:CLIENT]

Beside it: gateway_procs.py (the processes measured, and their cores), gateway_sides.py (one request each way, the
latency and throughput loops, the statistics), gateway_prefix.py (part 2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway_prefix import part2  # noqa: E402
from gateway_procs import CPUS, baseline, cli, floor_relay, gateway, gateway_beside, job, parse_cpus, pin, write_spec  # noqa: E402
from gateway_sides import (  # noqa: E402
    FLOOR,
    GW_SIDES,
    SIDES,
    Sides,
    added_interval,
    engine_steps,
    latency,
    paired_added,
    pct,
    throughput,
)

from launcher.contracts.job_index import HOME_ENV  # noqa: E402
from launcher.contracts.llmapi import LLMAPI, WORKFLOWS  # noqa: E402


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
    sides = Sides(url, token, record, "bench-gw", args.max_tokens)
    sides.floor_urls = floors
    names = (*SIDES, "baseline") if "baseline" in floors else SIDES
    try:
        if args.requests:
            await latency_part(args, sides, names, log)
        await throughput_part(args, sides, pid, record.metrics_url)
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
    order = ("direct", *GW_SIDES, *(("gw_two",) if "second" in sides.floor_urls else ()))
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in order}
    for side in order:  # warm-up at full batch: 2 s, or a round where rounds are shorter (a smoke test)
        await throughput(getattr(sides, side), args.concurrency, min(2.0, args.seconds), None)
    for r in range(args.rounds):
        for side in order if r % 2 == 0 else order[::-1]:
            gw_pid = None if side == "direct" else pid
            steps0 = engine_steps(metrics_url)
            run = await throughput(getattr(sides, side), args.concurrency, args.seconds, gw_pid)
            run["steps"] = (engine_steps(metrics_url) - steps0) / run["wall"]  # the rate's seconds, its tail too
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
    parser.add_argument(
        "--workflow",
        choices=WORKFLOWS,
        default=LLMAPI,
        help="part 1's job: the llmapi workflow (the spec's default) or the engine workflow's ensemble; part 2 "
        "is llmapi's (its KV cache is sized by llm_api.kv_cache_config)",
    )
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

    from launcher.contracts.layout import JobPaths
    from launcher.contracts.records import read_endpoints

    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    os.environ[HOME_ENV] = str(work / "hpc-home")
    checkpoint = args.checkpoint
    if checkpoint is None:
        from backend.cpu_engine.init_model import create_checkpoint

        checkpoint = Path(create_checkpoint(work / "tiny-gpt2", family="gpt2", size="tiny", seed=0))
    print(f"checkpoint: {checkpoint}\nwork folder: {work}\n")
    try:
        if args.part in ("all", "overhead"):
            pin("engine")
            spec = write_spec(work, "bench-gw", checkpoint, replicas=1, auth=args.auth, workflow=args.workflow)
            with job(spec) as (job_id, job_dir):
                pin("client")
                (record,) = read_endpoints(JobPaths.of_folder(job_dir))
                token = cli("token", job_id).strip() if args.auth == "token" else None
                with (
                    baseline(job_id, work, args.baseline) as base,  # first: it gives way to this tree's gateway
                    gateway_beside(job_id, work) as second,  # gw_two's other half
                    gateway(job_id, work) as (url, pid, log),
                    floor_relay(record, token) as floor,
                    floor_relay(record, token, "--late-head") as floor_late,
                    floor_relay(record, token, "--fastapi") as floor_fastapi,
                ):
                    floors = {"floor": floor, "floor_late": floor_late, "floor_fastapi": floor_fastapi} if FLOOR else {}
                    floors |= ({"baseline": base} if base else {}) | ({"second": second} if second else {})
                    asyncio.run(part1(args, url, pid, log, token, record, floors))
        if args.part in ("all", "prefix"):
            pin("engine")  # part 2's job, as part 1's
            part2(args, work, checkpoint)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
