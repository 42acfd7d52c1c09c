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
from collections.abc import Iterator

import httpx
import pytest
import yaml

from launcher.contracts.layout import JobPaths
from launcher.contracts.records import read_endpoints
from tests.e2e import (
    cli,
    kill_quietly,
    processes_under,
    prometheus_samples,
    submit,
    wait_for,
    write_spec,
)
from tests.steps import GPU_PACE_MS, engine_counters

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]

openai = pytest.importorskip("openai")


#: bursts the full-queue test sends at most, until one fills both replicas' Triton queues
BURSTS = 3


@pytest.fixture(scope="module")
def gateway(paced_gateway) -> dict:
    """tests/conftest.py's `gateway`, its engine at a GPU's pace (tests/steps.py `GPU_PACE_MS`): these tests count
    engine steps after a client left, and need a stream that is still running while other requests come."""
    return paced_gateway


def _steps_until_it_ended(metrics_url: str, before: tuple[float, float]) -> float:
    """The steps the engine made since `before` (`_engine`), read once it finished the one request sent since:
    its end is the event waited for, so nothing it would still have made is missed."""
    wait_for(lambda: engine_counters(metrics_url)[1] > before[1], 60, "the engine to end the request")
    return engine_counters(metrics_url)[0] - before[0]


def _full_request_steps(metrics_url: str, send) -> float:
    """How many steps a request takes when its client stays (`send()` makes it and reads it whole)."""
    before = engine_counters(metrics_url)
    send()
    full = _steps_until_it_ended(metrics_url, before)
    assert full >= 150, f"the full request must be long enough to tell ({full} steps)"
    return full


def test_a_client_gone_before_its_generate_answer_ends_the_replicas_generation(gateway):
    """Triton's `generate` (through the gateway's passthrough) answers only once the whole text is made, so a
    client that leaves meanwhile (curl's --max-time, a client timeout) would be seen only then, after the replica
    made every token for no one. The gateway stops the request by its id when its client leaves (and again until
    the answer comes: hpc/serving/abandon.py `stop_until`): the engine makes a part of the tokens asked. The bound,
    half of them, leaves the stop ~2 s at the engine's GPU pace, since the gateway's process may go unscheduled
    for hundreds of ms under load (docs/decisions.md "Clients gone before their answer"); at the tiny model's own
    pace the engine can make all 200 before the stop lands."""
    (job, job_dir) = gateway["jobs"][0]
    (record,) = read_endpoints(JobPaths.of_folder(job_dir))
    url = gateway["url"] + "/v2/models/ensemble/generate"
    body = {"text_input": "Once upon a time", "max_tokens": 200}
    headers = {"Authorization": f"Bearer {gateway['token']}"}
    full = _full_request_steps(
        record.metrics_url, lambda: httpx.post(url, json=body, headers=headers, timeout=60).raise_for_status()
    )
    host, port = gateway["url"].removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = (
        f"POST /v2/models/ensemble/generate HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {gateway['token']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    before = engine_counters(record.metrics_url)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode() + data)
        wait_for(lambda: engine_counters(record.metrics_url)[0] - before[0] >= 10, 30, "the engine to work on it", 0.02)
    made = _steps_until_it_ended(record.metrics_url, before)
    assert made <= full / 2, f"the engine made {made} of {full} steps after the client left"


@pytest.mark.parametrize(
    "path", ["/v1/completions", "/v2/models/ensemble/generate_stream", "/v2/models/tensorrt_llm_bls/generate_stream"]
)
def test_a_client_gone_mid_stream_ends_the_replicas_generation(gateway, path):
    """A client that closes its connection after the first event stops the replica's generation at once (the
    gateway's watcher for `http.disconnect`, hpc/gateway/streaming.py, and the stop by request id,
    hpc/serving/abandon.py): the engine makes a few of the tokens asked, not all of them, and the gateway's
    count of the replica's requests in flight returns to 0. A full stream of the same request first shows how
    many it would be. The bound, as in the test before: half of them. At the tiny model's own pace the engine
    would make every token before the first had been through postprocessing and the gateway. On the OpenAI route
    and both of Triton's pipelines: the BLS gives its `tensorrt_llm` request the client's request id, without which
    the stop matches nothing there (200 of 200; backend/models/bls.py)."""
    (job, job_dir) = gateway["jobs"][0]
    (record,) = read_endpoints(JobPaths.of_folder(job_dir))
    if path.startswith("/v1/"):
        body = {"model": gateway["model"], "prompt": "Once upon a time", "max_tokens": 200, "stream": True}
    else:
        body = {"text_input": "Once upon a time", "max_tokens": 200, "stream": True}
    headers = {"Authorization": f"Bearer {gateway['token']}"}

    def whole() -> None:
        with httpx.stream("POST", gateway["url"] + path, json=body, headers=headers, timeout=60) as r:
            assert sum(1 for line in r.iter_lines() if line.startswith("data: {")) > 0

    full = _full_request_steps(record.metrics_url, whole)
    before = engine_counters(record.metrics_url)
    with httpx.stream("POST", gateway["url"] + path, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line.startswith("data: {"))
        # the connection is closed here, with the generation under way
    made = _steps_until_it_ended(record.metrics_url, before)
    assert made <= full / 2, f"the replica went on after the client left: {made} of {full} engine steps"

    def settled() -> bool:
        samples = prometheus_samples(gateway["url"])
        return all(v == 0 for (name, _), v in samples.items() if name == "hpc_serve_gateway_replica_outstanding")

    wait_for(settled, 30, "the gateway's requests in flight to the replica to end")


def test_a_full_replica_is_429_with_retry_after_and_the_access_log_says_so(serve_app, gateway, caplog):
    """A gateway that lets one request in flight per replica: a second request while a stream runs is refused
    (OpenAI and Triton routes alike) and the stream is not disturbed; one JSON access line per request. The stream
    runs at the engine's GPU pace, 4 s or more after its first token (199 steps of at least 20 ms), since at the tiny
    model's own pace (0.5 s) it may end before the second request comes (docs/decisions.md "Abandoned streams");
    the engine's count of finished requests shows it was still running when the others were refused."""
    caplog.set_level(logging.INFO, logger="hpc_serve.gateway.access")
    url = serve_app(gateway["job"], max_outstanding=1)
    client = openai.OpenAI(base_url=url + "/v1", api_key=gateway["token"], max_retries=0)
    model = gateway["model"]
    headers = {"Authorization": f"Bearer {gateway['token']}"}
    (record,) = read_endpoints(JobPaths.of_folder(gateway["jobs"][0][1]))
    before = engine_counters(record.metrics_url)
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:  # made before: no setup in the window
        stream = client.completions.create(model=model, prompt="Once upon a time", max_tokens=200, stream=True)
        chunks = iter(stream)
        first = next(chunks)  # the request is in flight now
        passthrough = http.post("/v2/models/ensemble/generate", json={"text_input": "x", "max_tokens": 1})
        try:
            second: object = client.completions.create(model=model, prompt="x", max_tokens=1)
        except openai.RateLimitError as refused:
            second = refused
        assert engine_counters(record.metrics_url)[1] == before[1], "the stream ended before the others were sent"
    assert passthrough.status_code == 429 and passthrough.headers["retry-after"] == "1"
    assert isinstance(second, openai.RateLimitError), second
    assert second.response.headers["retry-after"] == "1" and second.body["code"] == "replicas_busy"
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
    size 1), so a burst fills them; at a GPU's pace (tests/steps.py). {"job", "spec", "token", "model"}."""
    from hpc.jobs.local import job_processes

    folder = tmp_path_factory.mktemp("gateway-queue")
    triton = {"max_queue_size": 1, "triton_max_batch_size": 1, "parameters": {"min_step_ms": GPU_PACE_MS}}
    spec = write_spec(folder, "gwq", tiny_gpt2, ntasks_per_node=2, triton=triton)
    data = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**data, "replicas": 2}))
    job, job_dir = submit(spec, "--executor", "local")
    try:
        yield {"job": job, "token": cli("token", job).stdout.strip(), "model": "gwq"}
    finally:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(job_dir.parent.parent))


def test_a_shared_prefix_stays_on_one_replica(serve_app, two_replicas):
    """By the 256-character key (`routing: prefix`). The default (`cache`) counts a prefix that every request
    shares as held everywhere, a system prompt's case, so it spreads: tests/test_prefix_index.py replays both."""
    url = serve_app(two_replicas["job"], routing="prefix")
    client = openai.OpenAI(base_url=url + "/v1", api_key=two_replicas["token"], max_retries=0)
    shared = "You are a terse assistant who answers questions about the weather in one short sentence. " * 3

    def served_by(prompt: str) -> str:
        raw = client.completions.with_raw_response.create(model="gwq", prompt=prompt, max_tokens=2)
        return raw.headers["x-hpc-serve-replica"]

    assert len({served_by(shared + q) for q in ("Rain?", "Sun?", "Snow?", "Wind?")}) == 1
    assert len({served_by(q) for q in ("Rain?", "Sun?", "Snow?", "Wind?")}) == 2, "no prefix: they take turns"


def test_a_full_triton_queue_is_tried_on_another_replica_then_429(serve_app, two_replicas):
    """Triton's own refusal ("Exceeds maximum queue size") is no failure: the request goes to the other replica,
    and when that one is full too, the client gets 429 with Retry-After; no 5xx, no replica benched. The engines
    run at a GPU's pace, so a request takes 2 s (100 steps of at least 20 ms): at the tiny model's own pace a burst
    of 24 sent by a starved client came in so spread out that each found a free slot (24 of 24 served)."""
    url = serve_app(two_replicas["job"], max_outstanding=None)
    headers = {"Authorization": f"Bearer {two_replicas['token']}"}

    async def burst() -> list[httpx.Response]:
        body = {"model": "gwq", "prompt": "Once upon a time", "max_tokens": 100}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
            return await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(24)))

    # Triton refuses only what waits in its own queue, before the model takes it: a burst must reach a replica
    # together. Under a loaded CPU the gateway may take a burst in one by one, and every request finds room (24 of
    # 24 served once): such a burst (only 200s) is sent again, up to BURSTS times; any other answer fails at once.
    for _ in range(BURSTS):
        responses = asyncio.run(burst())
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) <= {200, 429}, statuses
        if 429 in statuses:
            break
    assert set(statuses) == {200, 429}, f"no burst of {BURSTS} filled both replicas' queues: {statuses}"
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
        async with asyncio.timeout(60):  # both replicas under load when the cancel comes: some answers back first
            while served < 8 and not failures:
                await asyncio.sleep(0.05)
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
