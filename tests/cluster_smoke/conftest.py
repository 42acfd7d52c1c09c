"""Fixtures for the real one-machine Slurm test cluster (ci/cluster/up.sh). Tests skip when it is not up."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV_SH = REPO / "ci" / "cluster" / "env.sh"
PARTITION = os.environ.get("HPC_CLUSTER_PARTITION", "debug")

_durations: list[tuple[str, str, float]] = []


def cluster_env() -> dict[str, str]:
    """os.environ plus the exports of ci/cluster/env.sh (OMPI_MCA_btl=self,tcp, PMIX_MCA_gds=hash, ...)."""
    env = dict(os.environ)
    for line in ENV_SH.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export "):].partition("=")
            env[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    return env


def _cluster_skip_reason() -> str | None:
    if shutil.which("sinfo") is None or shutil.which("scontrol") is None:
        return "Slurm client tools (sinfo/scontrol) not on PATH; start the test cluster with ci/cluster/up.sh"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "`scontrol ping` timed out; is the test cluster up? (ci/cluster/up.sh)"
    if "is UP" not in ping.stdout:
        return f"slurmctld is not up (`scontrol ping`: {(ping.stdout + ping.stderr).strip()!r}); run ci/cluster/up.sh"
    info = subprocess.run(["sinfo", "-h", "-p", PARTITION, "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=20)
    nodes = dict(line.split() for line in info.stdout.splitlines() if line.strip())
    usable = [n for n, s in nodes.items() if s.rstrip("*") == s and s in ("idle", "mixed", "allocated", "completing")]
    if len(usable) < 2:
        return f"partition {PARTITION!r} needs 2 responding nodes, sinfo says {nodes or info.stderr.strip()!r}"
    return None


@pytest.fixture(scope="session")
def cluster() -> str:
    """The partition to use; skips the test when the cluster is not up."""
    reason = _cluster_skip_reason()
    if reason:
        pytest.skip(reason)
    return PARTITION


@pytest.fixture
def shared_tmp(tmp_path: Path) -> Path:
    """A job-visible working dir (all emulated nodes are this host, so tmp_path is shared)."""
    return tmp_path


def run(cmd: list[str], timeout: float = 120, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if proc.returncode != 0:
        raise AssertionError(f"{shlex.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc.stdout


def sacct_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-j", job_id, "-n", "-X", "-P", "-o", "State"], capture_output=True, text=True, timeout=30)
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[0].split()[0] if lines else ""


TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def wait_sacct(job_id: str, timeout: float = 120) -> str:
    """Poll sacct until the job reaches a terminal state; return it."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = sacct_state(job_id)
        if state in TERMINAL:
            return state
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not finished after {timeout}s (sacct State={state!r})")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "cluster_smoke" in report.nodeid:
        _durations.append((report.nodeid.split("::")[-1], report.outcome, report.duration))


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _durations:
        terminalreporter.section("cluster smoke timings")
        for name, outcome, secs in _durations:
            terminalreporter.write_line(f"{secs:7.2f}s  {outcome:8s} {name}")
