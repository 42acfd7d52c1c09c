"""Soak: minutes of mixed load through `hpc-serve gateway` against 2 replicas on the Slurm test cluster, with one
renewal (a successor job taking over) in the middle. Not a test: it prints what it saw and writes JSON.

Why: the unit and cluster tests each prove one thing in seconds; a service that lives for days also needs to
show that nothing accumulates (memory of tritonserver and its python stubs) and that a handover under varied
load (streams cut by their client, long and short outputs, whole answers) fails nothing.

The deployment (CPU engine, tiny random GPT-2, `replicas: 2` over node1/node2, tp 1) gets `slurm.time` =
ceil(N/2) + 3 minutes and `renew: {before: T - N/2, max_jobs: 2}`: its first job A submits its successor B
N/2 minutes after it started, B takes over once READY, and B (the last of a 2-job chain) renews no more and
outlives the window by a couple of minutes, so exactly one handover happens. `--concurrency` workers send,
back to back, requests of these kinds (seeded choice):

  stream-short / stream-long   `/v1/completions` streamed (SSE) to `[DONE]`, 8 / 96 tokens
  whole-short / whole-long     the same, not streamed
  chat                         `/v1/chat/completions`, streamed, 16 tokens
  cancelled                    streamed, 96 tokens; the client closes the stream after 3 events (counted apart)
  pt-stream / pt-cancelled     Triton's `generate_stream` through the gateway's passthrough, 32 tokens read to
                               the end / 96 tokens closed by the client after 3 events

Anything else than a complete answer is an error (an HTTP error, a stream without `[DONE]`, a timeout).
Memory: every `SLURM_PROCS_INTERVAL` seconds, the resident set (VmRSS) of each tritonserver and python stub of
each job, found by the job (processes whose environment has `SLURM_JOB_ID=<job>`, the leader named by its
endpoint record's pid), and of the gateway process; the first and last sample of each are reported.

    source ci/cluster/env.sh
    python benchmarks/soak.py [--minutes 10] [--concurrency 4] [--seed 0] [--output soak.json] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import yaml  # noqa: E402
from soak_jobs import Memory, job_servers, rank_ends, sacct  # noqa: E402

from launcher.contracts.job_index import HOME_ENV  # noqa: E402
from launcher.contracts.layout import JobPaths  # noqa: E402
from launcher.contracts.records import read_chain, read_endpoints  # noqa: E402

CLI = [sys.executable, "-m", "hpc.cli.main"]
NAME = "soak"
#: kind → (weight, streamed, max_tokens); "cancelled" kinds are closed by the client after CANCEL_AFTER events;
#: "pt-" kinds go through the gateway's Triton passthrough (`/v2/models/<ensemble or tensorrt_llm>/generate_stream`)
KINDS: dict[str, tuple[float, bool, int]] = {
    "stream-short": (0.25, True, 8),
    "stream-long": (0.15, True, 96),
    "whole-short": (0.25, False, 8),
    "whole-long": (0.1, False, 96),
    "chat": (0.1, True, 16),
    "cancelled": (0.15, True, 96),
    "pt-stream": (0.1, True, 32),
    "pt-cancelled": (0.1, True, 96),
}
CANCEL_AFTER = 3
PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "Write a long story about a dragon who lived in a library and read every book twice, then",
    "Q: What is 2 + 2?\nA:",
    "In the beginning " * 12,
]
SLURM_PROCS_INTERVAL = 15.0


@dataclass
class Tally:
    """What the load saw: per kind, answers, errors (with a few samples) and latencies."""

    ok: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    cancelled: Counter = field(default_factory=Counter)  # by kind: streams the client closed on purpose
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    replicas: Counter = field(default_factory=Counter)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def error(self, kind: str, at: float, what: str) -> None:
        self.errors[kind] += 1
        if len(self.samples) < 20:
            self.samples.append({"kind": kind, "at_s": round(at, 1), "error": what[:300]})


def _cli(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise SystemExit(f"hpc-serve {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_spec(folder: Path, checkpoint: Path, minutes: float) -> Path:
    """A 2-replica CPU-engine spec whose first job renews once, N/2 minutes in (module docstring)."""
    time_min = math.ceil(minutes / 2) + 3
    spec = {
        "name": NAME,
        "workdir": str(folder / "runs"),
        "slurm": {
            "nodes": 2,
            "ntasks_per_node": 1,
            "time": f"00:{time_min:02d}:00",
            "env": {"OMPI_MCA_btl": "self,tcp"},
        },
        "model": {"backend": "cpu", "workflow": WORKFLOW["name"], "checkpoint_dir": str(checkpoint), "tp_size": 1},
        "replicas": 2,
        "triton": {"ready_timeout_s": 180, **({"triton_max_batch_size": 8} if WORKFLOW["name"] == "engine" else {})},
        **({"llm_api": {"max_batch_size": 8}} if WORKFLOW["name"] == "llmapi" else {}),
        "renew": {"before": f"{int((time_min - minutes / 2) * 60)}s", "max_jobs": 2},
    }
    path = folder / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


#: the passthrough's model and body per workflow: the ensemble's inputs, or upstream's llmapi model's
PASSTHROUGH = {
    "engine": (
        "ensemble",
        lambda prompt, n: {"text_input": prompt, "max_tokens": n, "stream": True, "temperature": 0.8},
    ),
    "llmapi": (
        "tensorrt_llm",
        lambda prompt, n: {
            "text_input": prompt,
            "sampling_param_max_tokens": n,
            "streaming": True,
            "sampling_param_temperature": 0.8,
        },
    ),
}
WORKFLOW = {"name": "llmapi"}  # set from --workflow


async def passthrough(http: httpx.AsyncClient, kind: str, prompt: str, max_tokens: int, tally: Tally) -> bool:
    """A Triton `generate_stream` through the gateway: True when it was read to its end (Triton's stream has no
    `[DONE]`: it ends), False when the client left it (`pt-cancelled`)."""
    model, make = PASSTHROUGH[WORKFLOW["name"]]
    body = make(prompt, max_tokens)
    async with http.stream("POST", f"/v2/models/{model}/generate_stream", json=body) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"HTTP {answer.status_code}: {(await answer.aread())[:200]!r}")
        tally.replicas[answer.headers.get("x-hpc-serve-replica", "?")] += 1
        events = 0
        async for line in answer.aiter_lines():
            if line.startswith("data: ") and '"error"' in line:
                raise RuntimeError(f"error event: {line[:200]}")
            events += line.startswith("data: ")
            if kind == "pt-cancelled" and events >= CANCEL_AFTER:
                return False
    if not events:
        raise RuntimeError("stream ended without an event")
    return True


async def one_request(http: httpx.AsyncClient, kind: str, rng: random.Random, tally: Tally, t0: float) -> None:
    _, stream, max_tokens = KINDS[kind]
    prompt = rng.choice(PROMPTS)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}]} if kind == "chat" else {"prompt": prompt}
    url = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    body.update(model=NAME, max_tokens=max_tokens, stream=stream, seed=rng.randrange(1 << 30), temperature=0.8)
    start = time.monotonic()
    try:
        if kind.startswith("pt-"):
            if not await passthrough(http, kind, prompt, max_tokens, tally):
                tally.cancelled[kind] += 1
                return
        elif not stream:
            answer = await http.post(url, json=body)
            if answer.status_code != 200 or not answer.json().get("choices"):
                raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:200]}")
            tally.replicas[answer.headers.get("x-hpc-serve-replica", "?")] += 1
        else:
            async with http.stream("POST", url, json=body) as answer:
                if answer.status_code != 200:
                    raise RuntimeError(f"HTTP {answer.status_code}: {(await answer.aread())[:200]!r}")
                tally.replicas[answer.headers.get("x-hpc-serve-replica", "?")] += 1
                events, done = 0, False
                async for line in answer.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    if '"error"' in line and '"choices"' not in line:
                        raise RuntimeError(f"error event: {line[:200]}")
                    events += 1
                    if kind == "cancelled" and events >= CANCEL_AFTER:
                        break  # leaving the block closes the connection: the gateway sees the client go
                if kind == "cancelled" and not done:
                    tally.cancelled[kind] += 1
                    return
                if not done:
                    raise RuntimeError(f"stream ended without [DONE] after {events} events")
    except Exception as exc:  # noqa: BLE001 - every failure is counted, whatever it is
        tally.error(kind, time.monotonic() - t0, f"{type(exc).__name__}: {exc}")
        return
    tally.ok[kind] += 1
    tally.latency[kind].append(time.monotonic() - start)


async def load(url: str, token: str, seconds: float, workers: int, seed: int, tally: Tally, t0: float) -> None:
    kinds, weights = list(KINDS), [w for w, _, _ in KINDS.values()]
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=workers * 2)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, trust_env=False, limits=limits) as http:
        end = time.monotonic() + seconds

        async def worker(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            while time.monotonic() < end:
                await one_request(http, rng.choices(kinds, weights)[0], rng, tally, t0)

        await asyncio.gather(*(worker(i) for i in range(workers)))


def watch(deploy: Path, first: str, gateway_pid: int, memory: Memory, t0: float, stop: asyncio.Event) -> dict:
    """The chain's moments (successor submitted / READY, A's ends) and the memory samples, until `stop`."""
    events: dict[str, Any] = {"jobs": [first]}

    async def run() -> None:
        next_sample = 0.0
        while not stop.is_set():
            now = time.monotonic() - t0
            record = read_chain(JobPaths(deploy, first))
            if record is not None and record.successor and len(events["jobs"]) == 1:
                events["jobs"].append(record.successor)
                events["successor_submitted_s"] = round(now, 1)
            for job in events["jobs"]:
                ready = read_endpoints(JobPaths(deploy, job))
                if len(ready) == 2:
                    events.setdefault(f"{job}_ready_s", round(now, 1))
                elif f"{job}_ready_s" in events:
                    events.setdefault(f"{job}_withdrawn_s", round(now, 1))
                if JobPaths(deploy, job).draining.exists():
                    events.setdefault(f"{job}_draining_s", round(now, 1))
            if now >= next_sample:
                for job in events["jobs"]:  # from READY on: a loading server's memory is not its start
                    if f"{job}_ready_s" in events and f"{job}_withdrawn_s" not in events:
                        memory.sample(job, job_servers(deploy, job), now)
                memory.sample("gateway", {gateway_pid: "hpc-serve gateway"}, now)
                next_sample = now + SLURM_PROCS_INTERVAL
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass

    events["task"] = asyncio.ensure_future(run())
    return events


def pct(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))], 3) if values else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workflow", choices=sorted(PASSTHROUGH), default="llmapi", help="the deployment's (default llmapi)"
    )
    parser.add_argument("--checkpoint", type=Path, help="default: a tiny random GPT-2 made in the work folder")
    parser.add_argument("--output", type=Path, default=Path("soak.json"))
    parser.add_argument("--keep", action="store_true", help="keep the work folder (deployments, logs)")
    args = parser.parse_args()
    WORKFLOW["name"] = args.workflow
    if not shutil.which("sbatch"):
        raise SystemExit("needs the Slurm test cluster: bash ci/cluster/up.sh && source ci/cluster/env.sh")
    folder = Path(tempfile.mkdtemp(prefix="hpc-serve-soak-"))
    os.environ[HOME_ENV] = str(folder / "hpc-home")  # a private job index
    if args.checkpoint is None:
        from backend.cpu_engine.init_model import create_checkpoint

        args.checkpoint = Path(create_checkpoint(folder / "tiny-gpt2", family="gpt2", size="tiny", seed=0))
    spec = write_spec(folder, args.checkpoint, args.minutes)
    print(f"work folder {folder}; spec:\n{spec.read_text()}", flush=True)
    submitted = _cli("submit", str(spec), "--wait", "--timeout", "280", timeout=300)
    first, job_dir = submitted.stdout.split()[0], Path(submitted.stdout.split()[1])
    deploy = job_dir.parent.parent
    token = _cli("token", str(spec)).stdout.strip()
    log = (folder / "gateway.log").open("w")
    gateway = subprocess.Popen(
        [*CLI, "gateway", str(spec), "--port", "auto", "--refresh", "1"], stdout=log, stderr=subprocess.STDOUT
    )
    result: dict[str, Any] = {"minutes": args.minutes, "concurrency": args.concurrency, "seed": args.seed}
    try:
        from hpc.serving.deployment import resolve_target
        from hpc.serving.gateway_record import live_gateway

        target = resolve_target(str(spec))
        deadline = time.monotonic() + 60
        while (record := live_gateway(target)) is None:
            if gateway.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the gateway did not come up:\n{(folder / 'gateway.log').read_text()}")
            time.sleep(0.5)
        print(f"job {first} READY, gateway {record.url}; {args.minutes:g} min of load", flush=True)
        tally, memory = Tally(), Memory()

        async def soak() -> dict:
            t0, stop = time.monotonic(), asyncio.Event()
            events = watch(deploy, first, gateway.pid, memory, t0, stop)
            await load(record.url, token, args.minutes * 60, args.concurrency, args.seed, tally, t0)
            stop.set()
            await events.pop("task")
            for job in events["jobs"]:  # the last sample: at the end of the load (of the jobs still serving)
                if f"{job}_withdrawn_s" not in events:
                    memory.sample(job, job_servers(deploy, job), time.monotonic() - t0)
            memory.sample("gateway", {gateway.pid: "hpc-serve gateway"}, time.monotonic() - t0)
            return events

        result["chain"] = asyncio.run(soak())
    finally:
        _cli("cancel", str(spec), check=False)
        gateway.terminate()
        gateway.wait(15)
        log.close()
    jobs = result["chain"]["jobs"]
    time.sleep(2)
    result["states"] = sacct(jobs)
    result["ranks"] = {job: rank_ends(deploy, job) for job in jobs}
    result["requests"] = {
        kind: {"ok": tally.ok[kind], "errors": tally.errors[kind], "p50_s": pct(tally.latency[kind], 0.5),
               "p99_s": pct(tally.latency[kind], 0.99)}
        for kind in KINDS
    }  # fmt: skip
    for kind, count in tally.cancelled.items():
        result["requests"][kind]["cancelled_by_client"] = count
    result["totals"] = {
        "completed": sum(tally.ok.values()),
        "cancelled_by_client": sum(tally.cancelled.values()),
        "errors": sum(tally.errors.values()),
        "by_job": dict(Counter(replica.split("/")[0] for replica in tally.replicas.elements())),
        "by_replica": dict(tally.replicas),
    }
    result["error_samples"] = tally.samples
    result["memory"] = memory.report()
    args.output.write_text(json.dumps(result, indent=2))
    print_summary(result)
    print(f"\nJSON: {args.output}")
    if args.keep:
        print(f"kept {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if result["totals"]["errors"] else 0


def print_summary(result: dict[str, Any]) -> None:
    chain, totals = result["chain"], result["totals"]
    print(
        f"\nsoak: {result['minutes']:g} min, {result['concurrency']} workers; jobs {chain['jobs']} → {result['states']}"
    )
    for job, ends in result["ranks"].items():
        print(f"  job {job} ranks: " + "; ".join(
            f"rank {e['rank']} exit {e['exit_code']}{' ' + e['signal'] if e['signal'] else ''}"
            + (f", tritonserver still counted {e['in_flight_at_exit']} in flight" if e["in_flight_at_exit"] else "")
            for e in ends))  # fmt: skip
    moments = {k: v for k, v in chain.items() if k.endswith("_s")}
    print("chain (s since the load began): " + ", ".join(f"{k} {v}" for k, v in moments.items()))
    print(f"{'kind':<14}{'ok':>7}{'errors':>8}{'p50 s':>8}{'p99 s':>8}")
    for kind, row in result["requests"].items():
        print(f"{kind:<14}{row['ok']:>7}{row['errors']:>8}{row['p50_s']:>8}{row['p99_s']:>8}")
    print(
        f"completed {totals['completed']}, cancelled by the client {totals['cancelled_by_client']}, "
        f"errors {totals['errors']}; served by job {totals['by_job']}"
    )
    for sample in result["error_samples"]:
        print(f"  error at {sample['at_s']} s ({sample['kind']}): {sample['error']}")
    print(f"\n{'job':<10}{'pid':>8}  {'process':<34}{'start MiB':>10}{'end MiB':>9}{'growth':>8}  (s: start-end)")
    for row in result["memory"]:
        print(
            f"{row['job']:<10}{row['pid']:>8}  {row['process']:<34}{row['start_mib']:>10}{row['end_mib']:>9}"
            f"{row['growth_mib']:>8}  ({row['start_s']}-{row['end_s']})"
        )
    print(
        f"median per process: {statistics.median(r['growth_mib'] for r in result['memory']) if result['memory'] else 0} MiB growth"
    )


if __name__ == "__main__":
    sys.exit(main())
