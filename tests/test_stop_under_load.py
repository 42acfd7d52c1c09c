"""An ordered stop under continuous streaming load through the ensemble (the local executor, the real
tritonserver and CPU engine): `hpc-serve cancel` while 4 clients keep streaming must end the job CANCELLED with
the rank's tritonserver exiting 0, and every client stream must end, with its final response or a clear error.

Why the drain comes ahead of the SIGTERM (launcher/node/stop.py LeaderDrain): tritonserver's own stop refuses the
next `postprocessing` step of each streaming ensemble, which then stays "in flight" until the exit timeout, and
tritonserver exits 1 (or is SIGKILLed): the job would read FAILED (docs/decisions.md "Ordered stop").
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.e2e import (
    assert_streams_ended_clearly,
    cli,
    ensemble_clients,
    join_clients,
    kill_quietly,
    processes_under,
    rank_records,
    status,
    submit,
    wait_for,
    write_spec,
)

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]

CLIENTS = 4


@pytest.mark.parametrize("drain_by", ["model", "metrics"])
def test_cancel_under_streaming_load_is_clean(
    tmp_path: Path, tiny_gpt2, hpc_home, tritonserver, monkeypatch, drain_by: str
) -> None:
    """`drain_by` metrics: the launcher does not ask the model to report its drain (no drain file), so the
    SIGTERM waits for tritonserver's metrics to read nothing in flight: the path TensorRT-LLM's backend takes."""
    from hpc.jobs.local import job_processes
    from launcher.node.stop import DRAIN_BY_METRICS_ENV

    if drain_by == "metrics":
        monkeypatch.setenv(DRAIN_BY_METRICS_ENV, "1")  # the local job's ranks inherit it
    spec = write_spec(tmp_path, f"stop-{drain_by}", tiny_gpt2, triton={"decoupled": True})
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    deploy_dir = job_dir.parent.parent
    try:
        (endpoint,) = status(job)["endpoints"]
        stop = threading.Event()
        cancel_at: list[float] = []
        endings: list[tuple[float, float, str]] = []  # (started, ended, how), monotonic
        threads = ensemble_clients(endpoint, CLIENTS, stop, endings)
        wait_for(lambda: sum(how == "final" for *_, how in endings) >= 2 * CLIENTS, 60, "streams to complete")
        cancel_at.append(time.monotonic())
        out = cli("cancel", job, timeout=120).stdout
        cancel_s = time.monotonic() - cancel_at[0]
        stop.set()
        join_clients(threads, 90)
        print(f"cancel under {CLIENTS} streaming clients: {cancel_s:.2f} s; endings: {len(endings)}")

        assert out.startswith(f"{job} CANCELLED"), out
        assert status(job)["state"] == "CANCELLED"
        ranks = rank_records(job_dir)
        assert ranks[0].exit_code == 0, ranks[0].log_tail
        assert_streams_ended_clearly(endings, stop_at=cancel_at[0])
        leader_log = "".join(f.read_text(errors="replace") for f in job_dir.glob(f"{job}_0_log.*"))
        expected = "nothing in flight for" if drain_by == "metrics" else "the model drained"
        assert f"{expected}" in leader_log and "sending SIGTERM to tritonserver" in leader_log, leader_log[-3000:]
        wait_for(lambda: not processes_under(deploy_dir), 60, "every process of the job to exit", interval=0.2)
    finally:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(deploy_dir))
