"""`hpc-serve gateway` in front of real jobs (local executor, tritonserver, CPU engine), with the `openai`
package as the client: a client gone mid-stream ends the replica's generation, admission (429 with Retry-After
at `max_outstanding` 1), prefix affinity and full Triton queues over a job of two replicas, a second job picked
up and a killed replica's requests retried. One job and one CLI gateway for the module (tests/conftest.py
`gateway`; gateways with other options run in this process, on the same job); one more small job of two
replicas. The OpenAI API itself, errors and metrics: tests/test_gateway_e2e.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from launcher.layout import JobPaths
from launcher.records import read_endpoints
from tests.e2e import cli, kill_quietly, processes_under, prometheus_samples, submit, wait_for, write_spec

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]

openai = pytest.importorskip("openai")


def _engine_steps(metrics_url: str) -> float:
    """The replica's engine decode steps so far (the CPU engine's `iteration_counter`, set at every step): one
    per generated token while it serves one request. Why not a later model's count: under load the engine
    outruns postprocessing, whose queue still turns every token already made into text after a stop."""
    samples = prometheus_samples(metrics_url.removesuffix("/metrics"))
    (steps,) = [
        v
        for (name, labels), v in samples.items()
        if name == "nv_trt_llm_general_metrics" and ("general_type", "iteration_counter") in labels
    ]
    return steps


def test_a_client_gone_before_its_generate_answer_ends_the_replicas_generation(gateway):
    """Triton's `generate` (through the gateway's passthrough) answers only once the whole text is made, so a
    client that leaves meanwhile (curl's --max-time, a client timeout) was seen only then, after the replica had
    made every token for no one. Now the gateway stops the request by its id when its client leaves: the engine
    makes a part of the tokens asked, not all. A full request first shows how many steps it takes; then clients
    leave once the engine has made a few steps of theirs (up to 5 tries: on a loaded machine a stop can come
    late, and a try whose request ended before its client left does not count)."""
    (job, job_dir) = gateway["jobs"][0]
    (record,) = read_endpoints(JobPaths.of_folder(job_dir))
    url = gateway["url"] + "/v2/models/ensemble/generate"
    body = {"text_input": "Once upon a time", "max_tokens": 200}
    headers = {"Authorization": f"Bearer {gateway['token']}"}
    before = _engine_steps(record.metrics_url)
    assert httpx.post(url, json=body, headers=headers, timeout=60).status_code == 200
    full = _engine_steps(record.metrics_url) - before
    assert full >= 150, f"the full request must be long enough to tell ({full} steps)"

    def settled() -> bool:
        samples = prometheus_samples(gateway["url"])
        return all(v == 0 for (name, _), v in samples.items() if name == "hpc_serve_gateway_replica_outstanding")

    host, port = gateway["url"].removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = (
        f"POST /v2/models/ensemble/generate HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {gateway['token']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    tries = []  # (steps made when the client left, steps in all)
    for _ in range(5):
        before = _engine_steps(record.metrics_url)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head.encode() + data)
            wait_for(lambda b=before: _engine_steps(record.metrics_url) - b >= 10, 30, "the engine to work on it")
            left_at = _engine_steps(record.metrics_url) - before
        wait_for(settled, 30, "the gateway's request to the replica to end")
        time.sleep(1.0)  # what the engine would still make, had the request been left running
        tries.append((left_at, _engine_steps(record.metrics_url) - before))
        if left_at <= full / 4 and tries[-1][1] <= full * 3 / 4:
            break
    assert tries[-1][1] <= full * 3 / 4, f"steps made after the client left a {full}-step request: {tries}"


def test_a_client_gone_mid_stream_ends_the_replicas_generation(gateway):
    """A client that closes its connection after the first event stops the replica's generation at once (the
    gateway's watcher for `http.disconnect`, hpc/gateway/streaming.py, and the stop by request id,
    hpc/gateway/abandon.py): the engine makes a few of the tokens asked, not all of them, and the gateway's
    count of the replica's requests in flight returns to 0. A full stream of the same request first shows how
    many it would be."""
    (job, job_dir) = gateway["jobs"][0]
    (record,) = read_endpoints(JobPaths.of_folder(job_dir))
    body = {"model": gateway["model"], "prompt": "Once upon a time", "max_tokens": 200, "stream": True}
    headers = {"Authorization": f"Bearer {gateway['token']}"}
    before = _engine_steps(record.metrics_url)
    with httpx.stream("POST", gateway["url"] + "/v1/completions", json=body, headers=headers, timeout=60) as r:
        full_events = sum(1 for line in r.iter_lines() if line.startswith("data: {"))
    full = _engine_steps(record.metrics_url) - before
    assert full >= 150, f"the full stream must be long enough to tell ({full} steps, {full_events} events)"
    metrics = gateway["url"]

    def settled() -> bool:
        samples = prometheus_samples(metrics)
        return all(v == 0 for (name, _), v in samples.items() if name == "hpc_serve_gateway_replica_outstanding")

    # Under load the engine can make every token before the first one has been through postprocessing and the
    # gateway: the client then leaves a generation that is over, and its stop finds nothing to stop (the replica's
    # log: "stop for request id ...: it finished ... ago"). So the steps made by the time the client has its first
    # event are read too; a try counts when by then the engine had made at most a quarter of them, and up to 5
    # tries are made to get one that counts. When none does, each try that ran all its steps must have had its stop
    # reach the engine after all (its log names each such stop). The stop itself is proven without timing in tests/test_gateway_abandon.py and
    # tests/test_cpu_engine_triton.py.
    replica_log = job_dir / f"{job}_0_log.err"
    stops_before = replica_log.read_text(errors="replace").count("stop for request id")
    tries = []  # (steps made when the first event came, steps in all)
    for _ in range(5):
        before = _engine_steps(record.metrics_url)
        with httpx.stream("POST", gateway["url"] + "/v1/completions", json=body, headers=headers, timeout=60) as r:
            assert r.status_code == 200
            next(line for line in r.iter_lines() if line.startswith("data: {"))
            made = _engine_steps(record.metrics_url) - before
        # the connection is closed here, with the generation under way
        wait_for(settled, 30, "the gateway's requests in flight to the replica to end")
        time.sleep(1.0)  # what the engine would still make, had its generation been left running
        tries.append((made, _engine_steps(record.metrics_url) - before))
        if made <= full / 4:
            break
    made, steps = tries[-1]
    if made > full / 4:  # no try came in time to be cut; each that ran to its end got its stop too late, logged
        stops = replica_log.read_text(errors="replace").count("stop for request id") - stops_before
        uncut = sum(1 for _, steps in tries if steps >= full)
        assert stops >= uncut, f"{stops} late stops logged by the engine for {uncut} streams that ran out: {tries}"
        return
    assert steps < full / 2, f"the replica went on after the client left: {tries} of {full} engine steps"


def test_a_full_replica_is_429_with_retry_after_and_the_access_log_says_so(serve_app, gateway, caplog):
    """A gateway that lets one request in flight per replica: a second request while a stream runs is refused
    (OpenAI and Triton routes alike) and the stream is not disturbed; one JSON access line per request."""
    caplog.set_level(logging.INFO, logger="hpc_serve.gateway.access")
    url = serve_app(gateway["job"], max_outstanding=1)
    client = openai.OpenAI(base_url=url + "/v1", api_key=gateway["token"], max_retries=0)
    model = gateway["model"]
    headers = {"Authorization": f"Bearer {gateway['token']}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:  # made before: no setup in the window
        stream = client.completions.create(model=model, prompt="Once upon a time", max_tokens=200, stream=True)
        chunks = iter(stream)
        first = next(chunks)  # the request is in flight now, for ~0.5 s
        passthrough = http.post("/v2/models/ensemble/generate", json={"text_input": "x", "max_tokens": 1})
        with pytest.raises(openai.RateLimitError) as exc:
            client.completions.create(model=model, prompt="x", max_tokens=1)
    assert passthrough.status_code == 429 and passthrough.headers["retry-after"] == "1"
    assert exc.value.response.headers["retry-after"] == "1" and exc.value.body["code"] == "replicas_busy"
    rest = list(chunks)
    assert [c.choices[0].finish_reason for c in [first, *rest] if c.choices][-1] == "length"
    assert client.completions.create(model=model, prompt="x", max_tokens=1).choices[0].text is not None

    assert prometheus_samples(url)[("hpc_serve_gateway_errors_total", (("kind", "saturated"),))] == 2
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "hpc_serve.gateway.access"]
    assert [(line["route"], line["status"]) for line in lines] == [
        ("/v2/models/{model}/generate", 429),  # logged when it ended: before the stream it overtook
        ("/v1/completions", 429),
        ("/v1/completions", 200),
        ("/v1/completions", 200),
    ]
    long = lines[2]
    assert long["stream"] and long["completion_tokens"] == 200 and long["replica"].startswith(gateway["job"])
    assert 0 < long["ttft_ms"] < long["latency_ms"] and long["model"] == model and long["retried"] == 0
    assert long["prompt_tokens"] > 0 and lines[1]["replica"] is None


@pytest.fixture(scope="module")
def two_replicas(gateway, tmp_path_factory, tiny_gpt2, tritonserver) -> Iterator[dict]:
    """A second deployment: one job of 2 replicas whose queues hold a single request (max_queue_size 1, batch
    size 1), so a burst fills them. {"job", "spec", "token", "model"}."""
    from hpc.local import job_processes

    folder = tmp_path_factory.mktemp("gateway-queue")
    spec = write_spec(
        folder, "gwq", tiny_gpt2, ntasks_per_node=2, triton={"max_queue_size": 1, "triton_max_batch_size": 1}
    )
    data = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**data, "replicas": 2}))
    job, job_dir = submit(spec, "--executor", "local")
    try:
        yield {"job": job, "token": cli("token", job).stdout.strip(), "model": "gwq"}
    finally:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(job_dir.parent.parent))


def test_a_shared_prefix_stays_on_one_replica(serve_app, two_replicas):
    url = serve_app(two_replicas["job"])
    client = openai.OpenAI(base_url=url + "/v1", api_key=two_replicas["token"], max_retries=0)
    shared = "You are a terse assistant who answers questions about the weather in one short sentence. " * 3

    def served_by(prompt: str) -> str:
        raw = client.completions.with_raw_response.create(model="gwq", prompt=prompt, max_tokens=2)
        return raw.headers["x-hpc-serve-replica"]

    assert len({served_by(shared + q) for q in ("Rain?", "Sun?", "Snow?", "Wind?")}) == 1
    assert len({served_by(q) for q in ("Rain?", "Sun?", "Snow?", "Wind?")}) == 2, "no prefix: they take turns"


def test_a_full_triton_queue_is_tried_on_another_replica_then_429(serve_app, two_replicas):
    """Triton's own refusal ("Exceeds maximum queue size") is no failure: the request goes to the other replica,
    and when that one is full too, the client gets 429 with Retry-After; no 5xx, no replica benched."""
    url = serve_app(two_replicas["job"], max_outstanding=None)
    headers = {"Authorization": f"Bearer {two_replicas['token']}"}

    async def burst() -> list[httpx.Response]:
        body = {"model": "gwq", "prompt": "Once upon a time", "max_tokens": 30}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
            return await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(24)))

    responses = asyncio.run(burst())
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) == {200, 429}, statuses
    assert all(r.headers["retry-after"] == "1" for r in responses if r.status_code == 429)
    samples = prometheus_samples(url)
    assert samples[("hpc_serve_gateway_retries_total", (("reason", "busy"),))] >= 1
    refused = [v for (name, _), v in samples.items() if name == "hpc_serve_gateway_replica_refused_total"]
    assert len(refused) == 2 and sum(refused) >= statuses.count(429)
    assert all(v == 1 for (name, _), v in samples.items() if name == "hpc_serve_gateway_replica_healthy")


def test_a_job_cancelled_under_load_loses_no_request_to_a_gateway_that_has_not_looked_since(serve_app, gateway):
    """`hpc-serve cancel` of one of two jobs while clients keep sending, through a gateway that does not look
    at the deployment again during the test (its draining marks unseen): the stopping replica refuses new
    requests ("the server is stopping"), then goes away; each such request goes to the other job. No client
    sees an error, and the gateway counts retries for a replica that was stopping."""
    job2, job_dir2 = submit(gateway["spec"], "--executor", "local")
    gateway["jobs"].append((job2, job_dir2))
    url = serve_app(str(gateway["spec"]), refresh_s=300)
    headers = {"Authorization": f"Bearer {gateway['token']}"}
    wait_for(
        lambda: len(httpx.get(url + "/gateway/replicas", headers=headers, timeout=5).json()) == 2,
        30,
        "the in-process gateway to see both jobs",
    )
    failures: list[str] = []
    served = 0

    async def load(stop: asyncio.Event) -> None:
        nonlocal served
        body = {"model": gateway["model"], "prompt": "Once upon a time", "max_tokens": 4}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:

            async def client() -> None:
                nonlocal served
                while not stop.is_set():
                    answer = await http.post("/v1/completions", json=body)
                    if answer.status_code == 200:
                        served += 1
                    else:
                        failures.append(f"{answer.status_code} {answer.text[:200]}")

            await asyncio.gather(*(client() for _ in range(4)))

    async def cancel_under_load() -> None:
        stop = asyncio.Event()
        clients = asyncio.ensure_future(load(stop))
        await asyncio.sleep(1)
        await asyncio.to_thread(cli, "cancel", job2)
        await asyncio.sleep(1)
        stop.set()
        await clients

    asyncio.run(cancel_under_load())
    assert failures == [], failures[:5]
    samples = prometheus_samples(url)
    assert samples.get(("hpc_serve_gateway_retries_total", (("reason", "stopping"),)), 0) >= 1, "no stop was met"
    assert served > 20


def test_a_new_job_is_used_without_restart_and_a_killed_replica_is_not_seen(client, gateway):
    """Last in the module: it kills the first job. A second job of the same spec joins the gateway's replicas;
    its first job's tritonserver SIGKILLed, every request still succeeds (retried before its first byte) and
    discovery drops the dead replica."""
    headers = {"Authorization": f"Bearer {gateway['token']}"}

    def replicas() -> dict[str, dict]:
        response = httpx.get(gateway["url"] + "/gateway/replicas", headers=headers, timeout=5)
        return {r["key"]: r for r in response.json()}

    job2, job_dir2 = submit(gateway["spec"], "--executor", "local")
    gateway["jobs"].append((job2, job_dir2))
    wait_for(lambda: len(replicas()) == 2, 30, "the gateway to use the second job")
    before = {key: r["served"] for key, r in replicas().items()}
    for _ in range(4):
        assert client.completions.create(model=gateway["model"], prompt="Hello", max_tokens=2).choices[0].text
    served = {key: r["served"] - before[key] for key, r in replicas().items()}
    assert set(served.values()) == {2}, f"sequential requests alternate between idle replicas: {served}"

    # kill the replica whose turn is next, so the next request goes to it (unless discovery was quicker)
    victim = min(replicas().values(), key=lambda r: r["last_pick"])["key"]
    victim_dir = next(d for j, d in gateway["jobs"] if victim.startswith(f"{j}/"))
    (record,) = read_endpoints(JobPaths.of_folder(victim_dir))
    mark = len(gateway["log"].read_text())
    os.kill(record.pid, signal.SIGKILL)
    for _ in range(4):
        out = client.completions.create(model=gateway["model"], prompt="Hello", max_tokens=2)
        assert out.choices[0].text
    since = gateway["log"].read_text()[mark:]
    retried = f"replica {victim} failed before its first byte" in since
    assert retried or "replicas ready:" in since, f"no retry, and discovery had not dropped it either:\n{since}"
    survivor = next(k for k in served if k != victim)
    wait_for(lambda: set(replicas()) == {survivor}, 30, "the killed replica to be dropped")
