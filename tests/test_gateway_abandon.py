"""A client that closes its stream mid-way leaves nothing in flight in tritonserver (hpc/serving/abandon.py).

tritonserver 2.51 never releases an ensemble request whose gRPC stream was cancelled while it generated; a
server whose clients closed streams early then waited out its exit timeout at its stop, exited 1, and the job
read FAILED (benchmarks/soak.py saw every renewed predecessor end so). The gateway now stops such a generation by
its request id and lets the stream end: after 5 OpenAI streams and 5 of Triton's `generate_stream` closed early
through it, the job's ordered stop finds nothing in flight, and the leader exits 0.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher.contracts.layout import JobPaths
from launcher.contracts.records import read_endpoints
from tests._triton import tritonserver as triton_server
from tests.e2e import (
    cli,
    gateway_process,
    kill_quietly,
    processes_under,
    rank_records,
    submit,
    wait_for,
    write_spec,
)
from tests.steps import GPU_PACE_MS, engine_counters

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]


def _completed(job_dir: Path) -> float:
    """The requests the job's engine has ended (cancelled ones too)."""
    (replica,) = read_endpoints(JobPaths.of_folder(job_dir))
    return engine_counters(replica.metrics_url)[1]


def test_streams_closed_early_leave_nothing_in_flight(tmp_path: Path, tiny_gpt2, hpc_home, tritonserver) -> None:
    from hpc.jobs.local import job_processes

    spec = write_spec(tmp_path, "abandon", tiny_gpt2, triton={"decoupled": True})
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    try:
        token = cli("token", job).stdout.strip()
        before = _completed(job_dir)
        with gateway_process(str(spec), tmp_path / "gateway.log") as (_, record):
            body = {"model": "abandon", "prompt": "Once upon a time", "max_tokens": 200, "stream": True}
            headers = {"Authorization": f"Bearer {token}"}
            passthrough = {"text_input": "Once upon a time", "max_tokens": 200, "stream": True}
            streams = [("/v1/completions", body)] * 5 + [("/v2/models/ensemble/generate_stream", passthrough)] * 5
            for path, sent in streams:
                with httpx.stream("POST", record.url + path, json=sent, headers=headers, timeout=60) as r:
                    assert r.status_code == 200
                    next(line for line in r.iter_lines() if line.startswith("data: {"))
                # the connection is closed here, with the generation under way
            # read whole, a passthrough stream's events (and a `generate` answer) are the replica's own: the id
            # the gateway gave the request to stop it by is not in them, and a client's own id is
            for sent, ids in ((passthrough, set()), (passthrough | {"id": "mine"}, {"mine"})):
                with httpx.stream("POST", record.url + streams[-1][0], json=sent, headers=headers, timeout=60) as r:
                    events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
                assert len(events) == 200 and {e.get("id") for e in events} - {None} == ids, events[0]
                assert all(("id" in e) == bool(ids) for e in events)
                one = sent | {"stream": False}
                whole = httpx.post(record.url + "/v2/models/ensemble/generate", json=one, headers=headers, timeout=60)
                assert whole.status_code == 200 and whole.json().get("id") == next(iter(ids), None), whole.text

            def settled() -> bool:
                text = httpx.get(record.url + "/metrics", timeout=5).text
                lines = [line for line in text.splitlines() if line.startswith("hpc_serve_gateway_replica_outstanding")]
                return bool(lines) and all(line.endswith(" 0.0") for line in lines)

            wait_for(settled, 30, "the gateway's requests in flight to end")
            # and the engine's: each of the 14 requests ended there (abandoned ones by their stop)
            wait_for(lambda: _completed(job_dir) - before >= len(streams) + 4, 60, "the engine to end every request")
            assert _completed(job_dir) - before == len(streams) + 4, "a request the test did not send"
            started = time.monotonic()
            out = cli("cancel", job, timeout=120).stdout
            took = time.monotonic() - started
        assert out.startswith(f"{job} CANCELLED"), out
        log = (job_dir / f"{job}_0_log.err").read_text(errors="replace")
        assert re.search(r"has \d+ in-flight inferences", log) is None, log[-2000:]
        assert "Exit timeout expired" not in log, log[-2000:]
        assert rank_records(job_dir)[0].exit_code == 0, log[-2000:]
        print(f"cancel after 10 streams closed early: {took:.1f} s")
    finally:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(job_dir.parent.parent))


def test_the_passthrough_leaves_no_connection_that_holds_up_a_replicas_stop(
    tmp_path: Path, tiny_gpt2, hpc_home, tritonserver
) -> None:
    """Triton passthrough requests, then the job stopped at once, the gateway still running: tritonserver's
    ordered stop waits for every open HTTP connection, so a kept-alive connection of the gateway's from the last
    request would make it wait out its exit timeout and exit 1 (docs/decisions.md "Ordered stop";
    hpc/serving/discovery.py `CLOSED_AFTER`)."""
    from hpc.jobs.local import job_processes

    spec = write_spec(tmp_path, "keepalive", tiny_gpt2, triton={"decoupled": True})
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    try:
        headers = {"Authorization": f"Bearer {cli('token', job).stdout.strip()}"}
        # no health check meanwhile: it would go over the kept-alive connection and close it (it asks for that)
        with gateway_process(str(spec), tmp_path / "gateway.log", "--refresh", "60") as (_, record):
            body = {"text_input": "Once upon a time", "max_tokens": 4}
            for endpoint in ("generate", "generate_stream", "generate"):
                url = f"{record.url}/v2/models/ensemble/{endpoint}"
                assert httpx.post(url, json=body, headers=headers, timeout=60).status_code == 200
            out = cli("cancel", job, timeout=120).stdout
        assert out.startswith(f"{job} CANCELLED"), out
        log = (job_dir / f"{job}_0_log.err").read_text(errors="replace")
        assert "HTTP service connections" not in log.replace("Found 0 HTTP service connections", ""), log[-2000:]
        assert rank_records(job_dir)[0].exit_code == 0, log[-2000:]
    finally:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(job_dir.parent.parent))


ASKED = 240  # tokens: the tiny checkpoint's 256 positions less the prompt


async def _stop_before_the_request(grpc_url: str, log: Path) -> int:
    """Abandon a stream to `tensorrt_llm` whose request has not even been sent, let the engine settle the stop
    (it matches nothing: "matches nothing" in the server's log), then send the request. The tokens the engine
    made for it."""
    import tritonclient.grpc.aio as aiogrpc

    from hpc.serving.abandon import Reader, abandon, infer_inputs, stop_generation, stream_request
    from hpc.serving.model_io import EnsembleIO
    from hpc.serving.triton import CHANNEL_ARGS

    request_id = "stopped-before-it-came"
    prompt = np.array([[1, 50, 51, 52, 53, 54, 55, 56, 57]], dtype=np.int32)
    tensors = infer_inputs(
        {
            "input_ids": (prompt, "INT32"),
            "input_lengths": (np.array([[prompt.shape[1]]], dtype=np.int32), "INT32"),
            "request_output_len": (np.array([[ASKED]], dtype=np.int32), "INT32"),
            "streaming": (np.array([[True]], dtype=bool), "BOOL"),
        }
    )
    request = stream_request("tensorrt_llm", tensors, request_id)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    send = asyncio.Event()

    async def requests():
        await send.wait()
        yield request  # then half-closed, as the gateway's stream is when it is left

    client = aiogrpc.InferenceServerClient(grpc_url, channel_args=CHANNEL_ARGS)
    try:
        call = client._client_stub.ModelStreamInfer(requests(), metadata=())
        reader = Reader(call, call.cancel)
        ending = abandon(
            reader, functools.partial(stop_generation, client, request_id, (), EnsembleIO().stop_tensors())
        )
        assert ending is not None
        deadline = time.monotonic() + 60
        while f"'{request_id}' matches nothing" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            await asyncio.sleep(0.05)
        send.set()
        made = 0
        while (response := await reader.next()) is not None:
            made += len(response.infer_response.raw_output_contents) > 0
        await asyncio.wait_for(ending, 60)
        return made
    finally:
        await client.close()


def test_a_stop_that_came_before_its_request_is_sent_again_at_the_first_response(
    tmp_path: Path, tiny_gpt2, tritonserver
) -> None:
    """The race of a stream left before its first response: its stop can reach `tensorrt_llm` before the
    request does (the ensemble's preprocessing runs first); the engine, like TensorRT-LLM's backend, drops a stop
    for an id it does not hold. abandon() stops such a stream again until its first response shows the engine
    holds it (`stop_until`), so the engine makes a few of the tokens asked, not all. Made deterministic by sending
    the request only after the engine said the stop matched nothing; fails without the stops sent again (240 of
    240), and a stop sent again only at the first response comes late: under load the engine's responses queue on their
    way out while it goes on (docs/decisions.md "Abandoned streams"). The engine runs at a GPU's pace (tests/steps.py
    `GPU_PACE_MS`): the bound, half the tokens, leaves the stops more than two seconds."""
    from backend.repository import write_model_repository
    from tests.test_cpu_engine_triton import _params

    repo = tmp_path / "repo"
    write_model_repository(repo, "cpu", _params(str(tiny_gpt2), min_step_ms=GPU_PACE_MS))
    for other in ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm_bls"):
        shutil.rmtree(repo / other)
    with triton_server(repo, tmp_path) as server:
        made = asyncio.run(_stop_before_the_request(f"127.0.0.1:{server.grpc_port}", server.log))
    assert made < ASKED / 2, f"the engine made {made} of {ASKED} tokens after the second stop"
