"""The processes bench_gateway.py measures, each in its own process and, with `--cpus`, on cores of its own: the
local CPU-engine job, `hpc-serve gateway` (this tree's, another commit's), benchmarks/minimal_relay.py.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from launcher.contracts.llmapi import ENGINE, LLMAPI

CLI = [sys.executable, "-m", "hpc.cli.main"]
#: aiohttp is the client of the relays and of the other gateways (an extra, not a dependency)
AIOHTTP = importlib.util.find_spec("aiohttp") is not None


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


def write_spec(
    work: Path,
    name: str,
    checkpoint: Path,
    replicas: int,
    auth: str,
    llm_api: dict | None = None,
    workflow: str = LLMAPI,
    backend: str = "cpu",
) -> Path:
    """A local deployment of `backend`'s engine (default the CPU engine) on `workflow` (default llmapi, the spec's
    default), a batch of 64 (`llm_api.max_batch_size`, or the engine workflow's `triton.triton_max_batch_size`),
    with `llm_api:` when given (llmapi only)."""
    batch = {"triton_max_batch_size": 64} if workflow == ENGINE else {}
    spec = {
        "auth": auth,
        "name": name,
        "workdir": str(work / "runs"),
        "slurm": {"nodes": 1, "ntasks_per_node": replicas, "time": "00:30:00"},
        "model": {"backend": backend, "workflow": workflow, "checkpoint_dir": str(checkpoint), "tp_size": 1},
        "triton": {**batch, "ready_timeout_s": 300},
        "replicas": replicas,
        **({"llm_api": llm_api or {"max_batch_size": 64}} if workflow == LLMAPI else {}),
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
def gateway(
    job_id: str, work: Path, *options: str, source: Path | None = None, stop: int = signal.SIGTERM
) -> Iterator[tuple[str, int, Path]]:
    """`hpc-serve gateway JOB` in its own process, once it found the job's replicas: (its URL, its pid, the file
    its stderr and so its access log go to). `source`: the gateway of another source tree (`--baseline`). `stop`:
    the signal that ends it (SIGINT under cProfile, which then writes its stats)."""
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
        proc.send_signal(stop)
        proc.wait(30)
        log.close()


@contextmanager
def floor_relay(record: Any, token: str | None, *options: str) -> Iterator[str]:
    """benchmarks/minimal_relay.py in its own process (where aiohttp, its client here, is installed) in front of
    the replica of endpoint record `record`, on its workflow: its URL."""
    if not AIOHTTP:
        yield ""
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    relay = Path(__file__).resolve().parent / "minimal_relay.py"
    command = [sys.executable, str(relay), record.grpc_url, str(port), *([token] if token else []), *options]
    command += ["--workflow", record.workflow]
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
    if source is None or not AIOHTTP:  # its client is aiohttp's, as gw_aiohttp's
        yield ""
        return
    with gateway_beside(job_id, work, source.resolve()) as url:
        yield url


@contextmanager
def gateway_beside(job_id: str, work: Path, source: Path | None = None) -> Iterator[str]:
    """One more gateway of the job, started before the measured one (its URL): one gateway per deployment, so its
    address record goes, and the next gateway starts beside it."""
    from launcher.contracts.layout import gateway_record

    if not AIOHTTP:  # its client is aiohttp's, as gw_aiohttp's
        yield ""
        return
    with gateway(job_id, work, source=source) as (url, _, _):
        gateway_record(work / "runs", "bench-gw").unlink()
        yield url
