"""Fixtures for the real one-machine Slurm test cluster (ci/cluster/up.sh). Tests skip when it is not up, or
fail when CI=true (as tests/conftest.py does: on CI the cluster's absence is a broken setup)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cluster_smoke_helpers import PARTITION

from tests._env import unavailable

_durations: list[tuple[str, str, float]] = []


def _cluster_skip_reason() -> str | None:
    if shutil.which("sinfo") is None or shutil.which("scontrol") is None:
        return "Slurm client tools (sinfo/scontrol) not on PATH; start the test cluster with ci/cluster/up.sh"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "`scontrol ping` timed out; is the test cluster up? (ci/cluster/up.sh)"
    if "is UP" not in ping.stdout:
        said = ((ping.stdout + ping.stderr).strip().splitlines() or ["no output"])[0]
        return f"slurmctld is not up (`scontrol ping`: {said!r}); run ci/cluster/up.sh"
    info = subprocess.run(
        ["sinfo", "-h", "-p", PARTITION, "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=20
    )
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
        unavailable(reason)
    return PARTITION


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A per-test dir the jobs see (all emulated nodes are this host, so tmp_path is shared)."""
    return tmp_path


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "cluster_smoke" in report.nodeid:
        _durations.append((report.nodeid.split("::")[-1], report.outcome, report.duration))


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _durations:
        terminalreporter.section("cluster smoke timings")
        for name, outcome, secs in _durations:
            terminalreporter.write_line(f"{secs:7.2f}s  {outcome:8s} {name}")
