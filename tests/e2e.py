"""Helpers for the end-to-end tests: write specs, drive the real CLI, inspect real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from launcher.layout import JobPaths
from launcher.records import RankExitRecord, read_rank_records

CLI = [sys.executable, "-m", "hpc.cli"]


def write_spec(
    folder: Path,
    name: str,
    checkpoint: Path,
    *,
    tp: int = 1,
    nodes: int = 1,
    ntasks_per_node: int | None = None,
    slurm: dict | None = None,
    triton: dict | None = None,
) -> Path:
    """A CPU-engine spec for the tiny checkpoint; ranks talk TCP across the emulated nodes."""
    spec = {
        "name": name,
        "workdir": str(folder / "runs"),
        "slurm": {
            "nodes": nodes,
            "ntasks_per_node": ntasks_per_node or max(1, tp // nodes),
            "time": "00:10:00",
            "env": {"OMPI_MCA_btl": "self,tcp"},
            **(slurm or {}),
        },
        "model": {"backend": "cpu", "checkpoint_dir": str(checkpoint), "tp_size": tp},
        "triton": {"triton_max_batch_size": 8, "ready_timeout_s": 120, **(triton or {})},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def cli(*args: str, timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"hpc-serve {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def submit(spec: Path, *extra: str, timeout: float = 240) -> tuple[str, Path]:
    """`hpc-serve submit SPEC --wait` → (job id, job folder); asserts READY."""
    proc = cli("submit", str(spec), "--wait", "--timeout", str(timeout - 20), *extra, timeout=timeout, check=False)
    first = proc.stdout.splitlines()[0].split() if proc.stdout.strip() else ["?", "?"]
    assert proc.returncode == 0, f"submit did not reach READY:\n{proc.stdout}\n{proc.stderr}"
    return first[0], Path(first[1])


def rank_records(job_dir: Path) -> dict[int, RankExitRecord]:
    """Every rank's exit record in a job folder, by rank."""
    return {r.rank: r for r in read_rank_records(JobPaths.of_folder(job_dir))}


def status(job: str) -> dict:
    """`hpc-serve status JOB --json`; {} while the job is not known yet (exit 3, e.g. before rank 0 renders)."""
    proc = cli("status", job, "--json", check=False)
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def processes_under(path: Path) -> list[tuple[int, str]]:
    """Live processes whose command line mentions `path` (tritonserver, python stubs, launchers)."""
    from hpc.local import processes_mentioning

    return processes_mentioning(str(path))


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on (from `ss`, which names the owning pid)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    ports = set()
    for line in out.splitlines():
        if f"pid={pid}," in line:
            ports.add(int(line.split()[3].rsplit(":", 1)[1]))
    return ports


def kill_quietly(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
