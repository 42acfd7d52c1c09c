"""A client that closes its stream mid-way leaves nothing in flight in tritonserver (hpc/gateway/abandon.py).

tritonserver 2.51 never releases an ensemble request whose gRPC stream was cancelled while it generated; a
server whose clients closed streams early then waited out its exit timeout at its stop, exited 1, and the job
read FAILED (benchmarks/soak.py saw every renewed predecessor end so). The gateway now stops such a generation by
its request id and lets the stream end: after 5 streams closed early through it, the job's ordered stop finds
nothing in flight, and the leader exits 0.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.e2e import cli, gateway_process, kill_quietly, processes_under, rank_records, submit, wait_for, write_spec

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]


def test_streams_closed_early_leave_nothing_in_flight(tmp_path: Path, tiny_gpt2, hpc_home, tritonserver) -> None:
    from hpc.local import job_processes

    spec = write_spec(tmp_path, "abandon", tiny_gpt2, triton={"decoupled": True})
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    try:
        token = cli("token", job).stdout.strip()
        with gateway_process(str(spec), tmp_path / "gateway.log") as (_, record):
            body = {"model": "abandon", "prompt": "Once upon a time", "max_tokens": 200, "stream": True}
            headers = {"Authorization": f"Bearer {token}"}
            for _ in range(5):
                with httpx.stream("POST", record.url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
                    assert r.status_code == 200
                    next(line for line in r.iter_lines() if line.startswith("data: {"))
                # the connection is closed here, with the generation under way

            def settled() -> bool:
                text = httpx.get(record.url + "/metrics", timeout=5).text
                lines = [line for line in text.splitlines() if line.startswith("hpc_serve_gateway_replica_outstanding")]
                return bool(lines) and all(line.endswith(" 0.0") for line in lines)

            wait_for(settled, 30, "the gateway's requests in flight to end")
            time.sleep(1.0)  # the stop and the end of each stream
            started = time.monotonic()
            out = cli("cancel", job, timeout=120).stdout
            took = time.monotonic() - started
        assert out.startswith(f"{job} CANCELLED"), out
        log = (job_dir / f"{job}_0_log.err").read_text(errors="replace")
        assert "has 5 in-flight" not in log and "Exit timeout expired" not in log, log[-2000:]
        assert rank_records(job_dir)[0].exit_code == 0, log[-2000:]
        print(f"cancel after 5 streams closed early: {took:.1f} s")
    finally:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(job_dir.parent.parent))
