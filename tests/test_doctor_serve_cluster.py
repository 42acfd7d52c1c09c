"""`hpc-serve doctor SPEC --serve` on the Slurm test cluster, on a tp 2 llmapi CPU spec across node1 and node2
(the embedded default's model on the launch a GPU cluster runs): every row ok and exit 0; a job that cannot be
READY within the bound exits 1; Ctrl-C while the job runs cancels it. Each time, no job of it is left."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e import cli, private_job_index, wait_for, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parent.parent
ROWS = ("ready", "unary", "streamed", "stop string", "ignore_eos length", "client gone", "16 concurrent",
        "bad request", "engine metrics", "ordered stop")  # fmt: skip


@pytest.fixture
def doctor_spec(slurm_cluster, tritonserver, tiny_gpt2, tmp_path, monkeypatch):
    """(spec path, the name its doctor job runs under) of a tp 2 llmapi spec across node1/node2."""
    monkeypatch.setenv("COLUMNS", "400")  # one line per row
    with private_job_index(tmp_path):
        yield write_spec(tmp_path, "dserve", tiny_gpt2, tp=2, nodes=2, workflow="llmapi"), "dserve-doctor"


#: the CLI as a terminal's foreground process gets Ctrl-C: with SIGINT's default Python handler, even when this test
#: runs in a shell's background job, whose children inherit SIGINT ignored (and a Python started so never installs
#: its KeyboardInterrupt handler: a test command started with `&` lost this test's SIGINT 3 runs of 3)
AT_A_TERMINAL = [
    sys.executable,
    "-c",
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('hpc.cli.main', run_name='__main__', alter_sys=True)",
]


def jobs_named(name: str) -> list[str]:
    """`squeue`'s lines of the jobs of that name (queued or running)."""
    out = subprocess.run(["squeue", "-h", "--name", name, "-o", "%i %T"], capture_output=True, text=True).stdout
    return out.split("\n") if out.strip() else []


def test_serve_passes_on_tp2_across_two_nodes_and_leaves_no_job(doctor_spec):
    spec, name = doctor_spec
    proc = cli("doctor", str(spec), "--serve", "--serve-timeout", "150", timeout=280, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for (
        row
    ) in ROWS:  # the ordered stop's time is a warning past 10 s, never a failure: a loaded machine may take longer
        result = "(ok|warn)" if row == "ordered stop" else "ok"
        assert re.search(rf"│ {re.escape(row)}\s+│ {result} ", out), f"{row} not ok:\n{out}"
    assert "FAIL" not in out and not jobs_named(name)


def test_the_embedded_default_as_written_passes(slurm_cluster, tritonserver, tmp_path, monkeypatch):
    """`hpc-serve doctor configs/tiny-cpu.yaml --serve`, the spec as the README shows it (its workdir, its
    checkpoint made by model.init when missing): every row ok, exit 0, no job left; the deployment folder the
    doctor keeps is removed after."""
    import shutil

    monkeypatch.setenv("COLUMNS", "400")
    runs = ROOT / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    with private_job_index(tmp_path):
        try:
            proc = cli(
                "doctor",
                str(ROOT / "configs" / "tiny-cpu.yaml"),
                "--serve",
                "--serve-timeout",
                "150",
                timeout=280,
                check=False,
            )
        finally:
            for made in (set(runs.iterdir()) if runs.exists() else set()) - before:
                shutil.rmtree(made, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for row in ROWS:
        result = "(ok|warn)" if row == "ordered stop" else "ok"
        assert re.search(rf"│ {re.escape(row)}\s+│ {result} ", out), f"{row} not ok:\n{out}"
    assert "FAIL" not in out and not jobs_named("tiny-cpu-doctor")


def test_a_job_not_ready_within_the_bound_fails_and_is_cancelled(doctor_spec):
    spec, name = doctor_spec
    proc = cli("doctor", str(spec), "--serve", "--serve-timeout", "0", timeout=200, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert re.search(r"│ ready\s+│ fail .*after 0 s; cancelled", out), out
    assert not jobs_named(name)


def test_ctrl_c_while_the_job_runs_cancels_it(doctor_spec):
    """SIGINT once the CLI said which job it submitted (it then waits for READY and runs the battery, seconds at
    least): exit 130, the job cancelled. Each line the CLI printed is kept with when it came, for a failure."""
    spec, name = doctor_spec
    proc = subprocess.Popen(
        [*AT_A_TERMINAL, "doctor", str(spec), "--serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    start = time.monotonic()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:  # the CLI's own lines, as it prints them: the event to interrupt at
            lines.append(f"[{time.monotonic() - start:6.2f} s] {raw.decode(errors='replace')}")
            if re.search(r"job \d+ submitted", lines[-1]):
                proc.send_signal(signal.SIGINT)
                lines.append(f"[{time.monotonic() - start:6.2f} s] (the test sent SIGINT)\n")
                break
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + out.decode(errors="replace")
    assert proc.returncode == 130, text
    assert "cancelling job" in text, text
    # the cancel returned once Slurm said the job ended; squeue may list it COMPLETING a moment longer
    wait_for(lambda: not jobs_named(name), 60, "squeue without the job", 0.2)
