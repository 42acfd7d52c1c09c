"""Is `hpc-serve bench`'s load generator ever the bottleneck? Against a trivially fast model (one local job: a
tiny random GPT-2 on the CPU engine, `max_tokens` 1, a short prompt), the request rate it sustains against the
rate of a plain loop of tritonclient calls, side by side, as a ratio.

  loop     what NVIDIA's benchmark_core_model.py-style scripts do: one thread, tritonclient.grpc, one stream
           opened once; send a request to the ensemble, wait for its final response, send the next
  loadgen  hpc.bench's load generator (`hpc-serve bench JOB --concurrency C`, all at once), the same requests
           through hpc.client.AsyncClient straight to the replicas (no gateway runs; `--replicas`, default 1:
           with more, the server has capacity to spare on a machine with free cores, and the loop still
           talks to one replica, as such a script does)

The job serves the llmapi workflow (the spec's default: the loop sends to its `tensorrt_llm` model) unless
`--workflow engine` (the loop sends to the engine workflow's `ensemble`); the loop asks the model the replica's
endpoint record names, with the tensors hpc/serving/model_io.py makes for it, as hpc-serve's clients do.

Rounds alternate the two (loop first in odd rounds); the median of each side is reported, and the loadgen's
own CPU time per request (this process: getrusage), which is what would cap it: 1000 / that is the rate one
core of load generator can drive. When the measured ratio is lower than that capacity, the server (which shares
the machine) is the limit, not the generator.

    python benchmarks/bench_loadgen.py [--requests 300] [--concurrency 32] [--rounds 3] [--replicas 1]
                                       [--workflow llmapi|engine] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from launcher.contracts.job_index import HOME_ENV  # noqa: E402
from launcher.contracts.llmapi import ENGINE, LLMAPI, WORKFLOWS  # noqa: E402

CLI = [sys.executable, "-m", "hpc.cli.main"]


def cli(*args: str) -> str:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"hpc-serve {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def start_job(work: Path, replicas: int, workflow: str) -> tuple[str, Any]:
    """A READY local job of a tiny random GPT-2 on `workflow` with `replicas` replicas → (job id, the first
    replica's endpoint record: the loop's). More replicas give the server capacity to spare, so that on a machine
    with free cores the rate measured is the load generator's and not one replica's ceiling."""
    cli("init-model", str(work / "ckpt"))
    batch = {"triton_max_batch_size": 64} if workflow == ENGINE else {}  # llmapi's: llm_api.max_batch_size
    spec = {
        "auth": "none",
        "name": "loadgen",
        "workdir": str(work / "runs"),
        "replicas": replicas,
        "slurm": {"nodes": 1, "ntasks_per_node": replicas, "time": "00:30:00"},
        "model": {"backend": "cpu", "workflow": workflow, "checkpoint_dir": str(work / "ckpt"), "tp_size": 1},
        "triton": {**batch, "ready_timeout_s": 300},
        **({"llm_api": {"max_batch_size": 64}} if workflow == LLMAPI else {}),
    }
    (work / "loadgen.yaml").write_text(yaml.safe_dump(spec))
    job = cli("submit", str(work / "loadgen.yaml"), "--executor", "local", "--wait").split()[0]
    from hpc.client import job_endpoints

    endpoints = job_endpoints(job)
    if len(endpoints) != replicas:
        raise SystemExit(f"{job}: {len(endpoints)} of {replicas} replicas ready")
    return job, endpoints[0]


def plain_loop(replica: Any, prompt: str, count: int) -> float:
    """Requests per second of one thread sending the replica's generation model (the ensemble, or llmapi's
    `tensorrt_llm`) request after request over one gRPC stream."""
    import tritonclient.grpc as grpcclient

    from hpc.serving.model_io import GenerateParams, model_io

    io = model_io(replica.workflow, replica.decoupled, replica.llmapi_model)
    tensors = io.tensors(GenerateParams(prompt=prompt, max_tokens=1))
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(replica.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        start = time.perf_counter()
        for _ in range(count):
            client.async_stream_infer(io.model, tensors, enable_empty_final_response=True)
            while True:
                result, error = answers.get(timeout=60)
                if error is not None:
                    raise SystemExit(f"loop: {error}")
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
        return count / (time.perf_counter() - start)
    finally:
        client.stop_stream()
        client.close()


def loadgen(job: str, prompt: str, count: int, concurrency: int) -> tuple[float, float]:
    """(requests per second, this process's CPU ms per request) of hpc.bench's load generator."""
    from hpc.bench.loadgen import LoadSpec, client_sender, run_load
    from hpc.bench.workloads import BenchRequest, WordTokenizer
    from hpc.client import AsyncClient

    async def run() -> tuple[float, float]:
        async with AsyncClient(job, gateway=False) as client:
            send = client_sender(client, {})
            await run_load(
                [BenchRequest(prompt, 4, 1)], LoadSpec([0.0] * concurrency, concurrency), send, WordTokenizer()
            )
            cpu = resource.getrusage(resource.RUSAGE_SELF)
            start = time.perf_counter()
            records = await run_load(
                [BenchRequest(prompt, 4, 1)], LoadSpec([0.0] * count, concurrency), send, WordTokenizer()
            )
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
        failed = [r.error for r in records if not r.ok]
        if failed:
            raise SystemExit(f"loadgen: {len(failed)} requests failed: {sorted(set(failed))}")
        used = (after.ru_utime + after.ru_stime) - (cpu.ru_utime + cpu.ru_stime)
        return count / wall, used / count * 1000

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1, help="replicas of the served job (server capacity)")
    parser.add_argument("--workflow", choices=WORKFLOWS, default=LLMAPI, help="the job's (default: llmapi)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-loadgen-"))
    os.environ[HOME_ENV] = str(work / "hpc-home")
    prompt = "Once upon a time"
    job = ""
    try:
        job, replica = start_job(work, args.replicas, args.workflow)
        print(f"job {job}: {args.workflow} workflow, the loop asks {replica.grpc_url}", flush=True)
        plain_loop(replica, prompt, 20)  # warm-up
        loops, gens, cpus = [], [], []
        for i in range(1, args.rounds + 1):
            order = ("loop", "loadgen") if i % 2 else ("loadgen", "loop")
            for side in order:
                if side == "loop":
                    loops.append(plain_loop(replica, prompt, args.requests))
                else:
                    rate, cpu = loadgen(job, prompt, args.requests, args.concurrency)
                    gens.append(rate)
                    cpus.append(cpu)
            print(
                f"round {i}: loop {loops[-1]:.1f} req/s   loadgen {gens[-1]:.1f} req/s   loadgen CPU {cpus[-1]:.2f} ms/req"
            )
        loop, gen = statistics.median(loops), statistics.median(gens)
        print(f"plain tritonclient loop, median:           {loop:.1f} requests/s")
        print(
            f"hpc-serve bench load generator (conc {args.concurrency}, {args.replicas} replicas): {gen:.1f} requests/s"
        )
        print(f"ratio loadgen / loop: {gen / loop:.2f}   (target >= 3)")
        cpu = statistics.median(cpus)
        print(f"load generator CPU per request, median: {cpu:.2f} ms")
        print(
            f"load generator capacity on one core (1000 / CPU ms): {1000 / cpu:.0f} requests/s = "
            f"{1000 / cpu / loop:.1f}x the loop (where the measured ratio is lower, the server is the limit)"
        )
    finally:
        if job:
            subprocess.run([*CLI, "cancel", job], capture_output=True, timeout=120)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
