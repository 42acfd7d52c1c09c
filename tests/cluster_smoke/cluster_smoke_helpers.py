"""Helpers for the cluster smoke tests (a plain module, so the test file need not import conftest)."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

from launcher.contracts.slurm import ended

REPO = Path(__file__).resolve().parents[2]
ENV_SH = REPO / "ci" / "cluster" / "env.sh"
PARTITION = os.environ.get("HPC_CLUSTER_PARTITION", "debug")


def cluster_env() -> dict[str, str]:
    """os.environ plus the exports of ci/cluster/env.sh (OMPI_MCA_btl=self,tcp, PMIX_MCA_gds=hash, ...)."""
    env = dict(os.environ)
    for line in ENV_SH.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            env[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    return env


def run(cmd: list[str], timeout: float = 120, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if proc.returncode != 0:
        raise AssertionError(
            f"{shlex.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc.stdout


def sacct_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-j", job_id, "-n", "-X", "-P", "-o", "State"], capture_output=True, text=True, timeout=30
    )
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[0].split()[0] if lines else ""


def wait_sacct(job_id: str, timeout: float = 120) -> str:
    """Poll sacct until the job reaches a terminal state; return it."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = sacct_state(job_id)
        if ended(state):
            return state
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not finished after {timeout}s (sacct State={state!r})")
