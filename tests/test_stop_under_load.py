"""An ordered stop under continuous streaming load through the ensemble (the local executor, the real
tritonserver and CPU engine): `hpc-serve cancel` while 4 clients keep streaming must end the job CANCELLED with
the rank's tritonserver exiting 0, and every client stream must end, with its final response or a clear error.

Before the drain came ahead of the SIGTERM (launcher/stop.py LeaderDrain), tritonserver's own stop refused the
next `postprocessing` step of each streaming ensemble, the ensemble stayed "in flight" until the exit timeout,
and tritonserver exited 1 (or was SIGKILLed): the stop took ~18 s and the job read FAILED.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.e2e import cli, job_token, kill_quietly, processes_under, rank_records, status, submit, wait_for, write_spec

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]

CLIENTS = 4
#: an error that says why, which a client can act on (retry elsewhere); anything else is a failure
CLEAR = ("stopping", "no available versions", "UNAVAILABLE", "no longer in valid state")


def _stream_once(url: str, headers: dict[str, str], timeout: float) -> str:
    """One streaming request through the ensemble on a stream of its own → "final" or "error: why"; "HANG" when
    nothing ended it within ``timeout``."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    arrays = {
        "text_input": np.array([["hello world"]], dtype=object),
        "max_tokens": np.array([[48]], dtype=np.int32),
        "stream": np.array([[True]], dtype=bool),
    }
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    results: queue.Queue = queue.Queue()
    try:
        client = grpcclient.InferenceServerClient(url)
    except InferenceServerException as e:
        return f"error: {e}"
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)), headers=headers)
        try:
            client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
        except InferenceServerException as e:
            return f"error: {e}"
        while True:
            try:
                result, error = results.get(timeout=timeout)
            except queue.Empty:
                return "HANG"
            if error is not None:
                return f"error: {error}"
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "final"
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("drain_by", ["model", "metrics"])
def test_cancel_under_streaming_load_is_clean(
    tmp_path: Path, tiny_gpt2, hpc_home, tritonserver, monkeypatch, drain_by: str
) -> None:
    """`drain_by` metrics: the launcher does not ask the model to report its drain (no drain file), so the
    SIGTERM waits for tritonserver's metrics to read nothing in flight: the path TensorRT-LLM's backend takes."""
    from hpc.auth import grpc_headers
    from hpc.local import job_processes
    from launcher.stop import DRAIN_BY_METRICS_ENV

    if drain_by == "metrics":
        monkeypatch.setenv(DRAIN_BY_METRICS_ENV, "1")  # the local job's ranks inherit it
    spec = write_spec(tmp_path, f"stop-{drain_by}", tiny_gpt2, triton={"decoupled": True})
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    deploy_dir = job_dir.parent.parent
    try:
        (endpoint,) = status(job)["endpoints"]
        url = f"{endpoint['address']}:{endpoint['grpc_port']}"
        headers = grpc_headers(job_token(job))
        stop = threading.Event()
        cancel_at: list[float] = []
        endings: list[tuple[float, float, str]] = []  # (started, ended, how), monotonic

        def loop() -> None:
            while not stop.is_set():
                started = time.monotonic()
                how = _stream_once(url, headers, timeout=30)
                endings.append((started, time.monotonic(), how))
                if how != "final":
                    time.sleep(0.2)  # the server is going away: a real client would retry elsewhere

        threads = [threading.Thread(target=loop, daemon=True) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        wait_for(lambda: sum(how == "final" for *_, how in endings) >= 2 * CLIENTS, 60, "streams to complete")
        cancel_at.append(time.monotonic())
        out = cli("cancel", job, timeout=120).stdout
        cancel_s = time.monotonic() - cancel_at[0]
        stop.set()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a client stream never ended"
        print(f"cancel under {CLIENTS} streaming clients: {cancel_s:.2f} s; endings: {len(endings)}")

        assert out.startswith(f"{job} CANCELLED"), out
        assert status(job)["state"] == "CANCELLED"
        ranks = rank_records(job_dir)
        assert ranks[0].exit_code == 0, ranks[0].log_tail
        assert not [e for e in endings if e[2] == "HANG"], endings
        unclear = [how for *_, how in endings if how != "final" and not any(c in how for c in CLEAR)]
        assert not unclear, unclear
        in_flight = [how for started, ended, how in endings if started < cancel_at[0] < ended]
        assert in_flight, "no stream was in flight when the cancel came: the test proves nothing"
        # what was streaming when the stop began ends with its final response, or with the stop named
        assert all(how == "final" or "stopping" in how for how in in_flight), in_flight
        leader_log = "".join(f.read_text(errors="replace") for f in job_dir.glob(f"{job}_0_log.*"))
        expected = "nothing in flight for" if drain_by == "metrics" else "the model drained"
        assert f"{expected}" in leader_log and "sending SIGTERM to tritonserver" in leader_log, leader_log[-3000:]
        wait_for(lambda: not processes_under(deploy_dir), 15, "every process of the job to exit", interval=0.2)
    finally:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(deploy_dir))
