"""Every benchmark in benchmarks/ runs at HEAD: each script once at its smallest size, as a subprocess, checked for
its exit status and the result lines it prints (ratios, counts), never for how fast anything was. A benchmark is a
script nobody runs every day, so what rots in it (a spec field that moved, a model name that changed) shows here
and not on the day someone needs its numbers (as once `Request for unknown model: 'ensemble'`).

The helper modules are run through the scripts that import them: gateway_procs.py, gateway_sides.py and
gateway_prefix.py by bench_gateway.py, soak_jobs.py by soak.py, minimal_relay.py's apps by gateway_inprocess.py
(in one process) and, where aiohttp is installed, by bench_gateway.py (its `floor` sides, in a process of their own).
benchmarks/device/run.sh runs bench_loadgen.py and bench_gateway.py on a lent machine: its loadgen part runs here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: aiohttp is the client of bench_gateway.py's relay sides (an extra, not a dependency): without it they are left out
AIOHTTP = importlib.util.find_spec("aiohttp") is not None


def bench(script: str, *args: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """benchmarks/<script> with `args`, from the repository root: its output (stdout and stderr), once it exited 0."""
    environ = os.environ | {"PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"} | (env or {})
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} {' '.join(args)} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def number(pattern: str, out: str) -> float:
    """The number `pattern`'s one group matched in `out` (the assertion says what was printed instead)."""
    match = re.search(pattern, out, re.M)
    assert match, f"no line matching {pattern!r} in:\n{out[-6000:]}"
    return float(match.group(1))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_gateway_inprocess():
    out = bench("gateway_inprocess.py", "--requests", "10", "--tokens", "4", timeout=110)
    for app in ("gateway", "floor"):  # to the engine, first piece out, CPU: three microsecond p50s
        number(rf"^  {app} +(\d+) +\d+ +\d+$", out)
    number(r"the gateway's own code adds (-?\d+) us to the first token over the floor", out)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bench_cpu_engine(tiny_gpt2):
    args = ("--family", "gpt2", "--size", "tiny", "--model-dir", str(tiny_gpt2))
    out = bench("bench_cpu_engine.py", *args, "--new-tokens", "4", "--conc", "1", "2", "--repeats", "1", timeout=170)
    for conc in (1, 2):  # concurrent, engine tok/s, HF tok/s, ratio, greedy agreement
        assert number(rf"^ +{conc} +[\d.]+ +[\d.]+ +([\d.]+)x +\d+%$", out) > 0


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_startup_local(tritonserver, hpc_home):
    out = bench("bench_startup.py", "--rounds", "1", timeout=290)
    assert number(r"^ratio median\(hpc-serve\) / median\(bare\): ([\d.]+)", out) > 0
    number(r"tritonserver spawn → token back: +([\d.]+) s", out)


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("workflow", ["llmapi", "engine"])
def test_bench_loadgen(tritonserver, hpc_home, workflow):
    args = ("--requests", "10", "--rounds", "1", "--concurrency", "2", "--workflow", workflow)
    out = bench("bench_loadgen.py", *args, timeout=290)
    assert f"{workflow} workflow" in out
    assert number(r"^ratio loadgen / loop: ([\d.]+)", out) > 0
    number(r"^load generator CPU per request, median: ([\d.]+) ms", out)


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_device_run_sh_loadgen(tritonserver, hpc_home, tmp_path):
    """benchmarks/device/run.sh, its loadgen part (its gateway part is bench_gateway.py, run below), on this machine:
    without the lent machine's bundle (.whl/site.tar.xz) it uses what is installed."""
    env = os.environ | {"OUT": str(tmp_path), "PARTS": "loadgen", "REQUESTS": "10", "REPLICAS": "1"}
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "device" / "run.sh")], env=env, capture_output=True, text=True, timeout=290
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert number(r"^ratio loadgen / loop: ([\d.]+)", (tmp_path / "loadgen.txt").read_text()) > 0


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_bench_gateway_both_parts(tritonserver, hpc_home):
    """`--part all`: part 1 (latency and throughput, every side) and part 2 (shared prefixes) in one run."""
    sizes = ("--requests", "3", "--rounds", "1", "--seconds", "0.5", "--concurrency", "2", "--max-tokens", "2")
    prefix = ("--prefixes", "2", "--questions", "2", "--workers", "2", "--cache-docs", "1")
    out = bench("bench_gateway.py", *sizes, *prefix, timeout=410)
    sides = ("gateway", "gw_aiohttp", "floor", "floor_late", "floor_fastapi") if AIOHTTP else ("gateway",)
    for side in sides:
        assert number(rf"^  {side} total p50: ([\d.]+)x direct", out) > 0
        number(rf"^  {side} ttft, turn by turn: ([-+\d.]+) ms added", out)
    number(r"^  passthrough +([\d.]+) ", out)
    for side in ("gateway", "gw_aiohttp", "gw_two") if AIOHTTP else ("gateway",):
        assert number(rf"^  {side} / direct: ([\d.]+)$", out) > 0
    number(r"^  CPU per request \(ms\): direct client ([\d.]+)", out)
    for policy in ("cached prefix", "prefix affinity", "least outstanding", "round robin"):  # kept: unbounded / small
        number(rf"^    {policy} +(\d+) / +\d+ ", out)
    number(r"^    cached prefix .* engines +(\d+) ", out)


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_routing(tritonserver, hpc_home):
    """Every policy on one job of 2 replicas, the engines' own reuse counts and TTFT for each."""
    sizes = ("--replicas", "2", "--conversations", "2", "--turns", "2", "--workers", "2", "--system-words", "30")
    out = bench("bench_routing.py", *sizes, "--question-words", "8", "--answer-tokens", "2", timeout=290)
    for policy in ("pinned", "cache", "client", "prefix", "least", "round_robin"):
        number(rf"^    {policy} +reused +(\d+) computed +\d+ ", out)
        number(rf"^    {policy} .* TTFT p50 +([\d.]+) ms", out)


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_relay(tritonserver, hpc_home):
    """Two replicas, direct against through the gateway (one process, and one of two workers), the clients in two
    processes: the ratios and the gateway's CPU per relayed token."""
    sizes = ("--replicas", "2", "--concurrency", "2", "--max-tokens", "4", "--seconds", "0.5", "--rounds", "1")
    spread = ("--gateway-workers", "2", "--client-procs", "2")
    out = bench("bench_relay.py", *sizes, "--min-step-ms", "1", *spread, timeout=290)
    for side in ("gateway", "gateway_w2"):
        assert number(rf"^  {side} / direct: ([\d.]+)$", out) > 0
        assert number(rf"^  {side} CPU: [\d.]+ ms per request, ([\d.]+) us per relayed token", out) > 0


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_replica_path(tritonserver, hpc_home):
    """One simulated replica, direct gRPC: its tokens/s and each of its processes' CPU per streamed token."""
    sizes = ("--concurrency", "2", "--max-tokens", "4", "--seconds", "0.5", "--rounds", "1")
    out = bench("bench_replica_path.py", *sizes, timeout=290)
    assert number(r"^  this +([\d.]+) tokens/s", out) > 0
    per_token = r"^  this +CPU us per token: leader node [\d.]+, stub [\d.]+, tritonserver [\d.]+, all ([\d.]+);"
    assert number(per_token, out) > 0


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_startup_slurm(slurm_cluster, tritonserver, hpc_home):
    out = bench("bench_startup.py", "--rounds", "1", "--executor", "slurm", timeout=290, env=slurm_cluster["env"])
    assert number(r"^ratio median\(hpc-serve\) / median\(bare\): ([\d.]+)", out) > 0
    number(r"^sbatch → job start \(the scheduler's\), median: ([\d.]+) s", out)


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_soak(slurm_cluster, tritonserver, hpc_home, tmp_path):
    """One minute, the least soak.py takes (its renewal's `before` must leave the job 30 s of start-up): it exits
    1 on any failed request, so exit 0 is also 'no errors'."""
    report = tmp_path / "soak.json"
    out = bench("soak.py", "--minutes", "1", "--output", str(report), timeout=410, env=slurm_cluster["env"])
    assert number(r"^completed (\d+), cancelled by the client \d+, errors 0;", out) > 0
    assert re.search(r"^soak: 1 min, 4 workers; jobs \[", out, re.M), out[-6000:]
    assert report.is_file()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_sim_engine():
    out = bench(
        "bench_sim_engine.py",
        "--engines",
        "2",
        "--batch",
        "4",
        "--seconds",
        "1",
        "--isl",
        "64",
        "--osl",
        "16",
        timeout=110,
    )
    number(r"GPU time / wall time per engine: min ([\d.]+)", out)
    number(r"aggregate: ([\d,]+) tokens/s", out.replace(",", ""))
    number(r"CPU: ([\d.]+) cores", out)
