"""hpc.client and `hpc-serve generate` against a real deployment: two local jobs of one spec (tritonserver, CPU
engine, `auth: token`) and `hpc-serve gateway` in front of them. Straight to the replicas (balanced, the token
as gRPC metadata, a SIGKILLed replica's requests retried on the other) and through the gateway (requests
counted there, the token as a bearer header, a dead gateway left for the replicas). One deployment for the
module; the tests that kill something come last."""

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

from hpc.client import AsyncClient, AuthError, Client, RequestError, ServerError
from hpc.serving.auth import read_token
from hpc.serving.deployment import resolve_target
from hpc.serving.gateway_record import record_path
from hpc.serving.metrics import parse, scrape
from launcher.contracts.layout import JobPaths
from launcher.contracts.records import EndpointRecord, read_endpoints
from tests.e2e import cli, gateway_process, local_jobs, wait_for, write_spec

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]

PROMPTS = ["Once upon a time", "The capital of France is", "Hello", "A B C", "1 2 3 4", "Why"]


def _gateway_replicas(deployment: dict) -> dict[str, dict]:
    headers = {"authorization": f"Bearer {deployment['token']}"}
    response = httpx.get(deployment["url"] + "/gateway/replicas", headers=headers, timeout=5, trust_env=False)
    return {r["key"]: r for r in response.json()}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, tiny_gpt2, tritonserver) -> Iterator[dict]:
    """Two READY jobs of spec `cl` and a gateway: {"spec", "jobs": [(id, folder)], "token", "url", "gateway"}."""
    folder = tmp_path_factory.mktemp("client")
    spec = write_spec(folder, "cl", tiny_gpt2, tp=1)
    with local_jobs(folder, spec, 2) as jobs:
        token = read_token(JobPaths.of_folder(jobs[-1][1]).deploy_dir)
        assert token, "auth: token is the default: submit made the deployment's token"
        with gateway_process(str(spec), folder / "gateway.log") as (gateway, record):
            deployment = {"spec": str(spec), "jobs": jobs, "token": token, "url": record.url, "gateway": gateway}
            wait_for(lambda: len(_gateway_replicas(deployment)) == 2, 30, "the gateway to use both jobs")
            yield deployment | {"target": resolve_target(str(spec))}


@pytest.fixture
def dead_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """$http_proxy (and $grpc_proxy) pointing at a port nothing listens on, and no $no_proxy exception: clusters
    export one for the outside world, and it cannot reach a node's address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{sock.getsockname()[1]}"  # closed when the block ends: refused
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "grpc_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


def _endpoints(deployment: dict) -> list[EndpointRecord]:
    return [e for _, job_dir in deployment["jobs"] for e in read_endpoints(JobPaths.of_folder(job_dir))]


def _ensemble_requests(endpoint: EndpointRecord) -> float:
    """Requests the replica's ensemble answered, from its own metrics (not the client's bookkeeping)."""
    samples = parse(scrape(endpoint.metrics_url), prefixes=("nv_inference_request_success",))
    return sum(s.value for s in samples if s.labels.get("model") == "ensemble")


def test_straight_to_the_replicas_balances_over_both_jobs(deployment, dead_proxy):
    """Sequential requests alternate between the idle replicas of the two jobs; each is sent its job's token
    as gRPC metadata (auth: token, so a request without it would be refused), past a dead $http_proxy."""
    endpoints = _endpoints(deployment)
    before = [_ensemble_requests(e) for e in endpoints]
    with Client(deployment["spec"], gateway=False) as client:
        texts = [client.generate("Once upon a time", 4) for _ in range(6)]
    assert len(set(texts)) == 1 and texts[0], "greedy: the same text from either replica"

    def served() -> list[float]:
        return [_ensemble_requests(e) - b for e, b in zip(endpoints, before, strict=True)]

    wait_for(lambda: sum(served()) >= 6, 10, "the replicas' metrics to count the requests")  # counted after the reply
    assert served() == [3, 3], f"requests per replica: {served()}"


def test_streamed_pieces_join_to_the_whole_text_through_the_gateway_and_not(deployment):
    sampling = {"temperature": 0.9, "top_p": 0.95, "seed": 11, "frequency_penalty": 1.5}
    answers = {}
    for gateway in (False, True):
        with Client(deployment["spec"], gateway=gateway) as client:
            whole = client.generate("Once upon a time", 12, **sampling)
            pieces = list(client.stream("Once upon a time", 12, **sampling))
        assert len(pieces) > 1 and "".join(pieces) == whole, (pieces, whole)
        answers[gateway] = whole
    assert answers[True] == answers[False], "the same seed: the same text whichever way it went"


def test_a_batch_keeps_the_prompts_order_sync_and_async(deployment):
    with Client(deployment["spec"], gateway=False) as client:
        one_by_one = [client.generate(p, 6) for p in PROMPTS]
        assert len(set(one_by_one)) > 2, "distinct prompts, distinct texts: order can be checked"
        assert client.generate_batch(PROMPTS, 6, concurrency=3) == one_by_one
        assert client.generate_batch(list(reversed(PROMPTS)), 6, concurrency=6) == one_by_one[::-1]

    async def run() -> tuple[str, list[str], list[str]]:
        async with AsyncClient(deployment["spec"]) as client:
            whole = await client.generate(PROMPTS[0], 6)
            pieces = [piece async for piece in client.stream(PROMPTS[0], 6)]
            batch = await client.generate_batch(PROMPTS, 6, concurrency=4)
        return whole, pieces, batch

    whole, pieces, batch = asyncio.run(run())
    assert whole == "".join(pieces) == one_by_one[0] and batch == one_by_one


def test_requests_go_through_the_gateway_when_it_answers(deployment, dead_proxy):
    def through_gateway() -> int:
        return sum(r["served"] for r in _gateway_replicas(deployment).values())

    before = through_gateway()
    with Client(deployment["spec"]) as client:
        client.generate("Hello", 3)
        assert list(client.stream("Hello", 3))
        client.generate_batch(PROMPTS, 3)
    assert through_gateway() - before == 2 + len(PROMPTS)
    with Client(deployment["spec"], gateway=False) as client:
        client.generate("Hello", 3)
    assert through_gateway() - before == 2 + len(PROMPTS), "gateway=False: straight to the replicas"


def test_a_wrong_token_and_a_bad_request_are_named(deployment):
    for gateway in (True, False):
        with Client(deployment["spec"], gateway=gateway, token="not-the-token") as client:
            with pytest.raises(AuthError):
                client.generate("Hello", 3)
        with Client(deployment["spec"], gateway=gateway) as client:
            with pytest.raises(RequestError, match="top_p") as exc:
                client.generate("Hello", 3, top_p=5.0)
            assert not isinstance(exc.value, AuthError)
            with pytest.raises(RequestError, match="max_tokens"):
                client.generate("Hello", 0)
            assert client.generate("Hello", 3), "a refused request benches no replica"


def test_cli_generate_one_prompt_streamed_and_a_file(deployment, tmp_path):
    with Client(deployment["spec"]) as client:
        expected = [client.generate(p, 5, seed=2) for p in PROMPTS]
        penalized = client.generate(PROMPTS[0], 8, temperature=0, presence_penalty=2.0)
        assert penalized != client.generate(PROMPTS[0], 8, temperature=0), "the penalty reached the model"
    spec = deployment["spec"]
    assert cli("generate", spec, PROMPTS[0], "--max-tokens", "5", "--seed", "2").stdout == expected[0] + "\n"
    flags = ("--max-tokens", "8", "--temperature", "0", "--presence-penalty", "2")
    assert cli("generate", spec, PROMPTS[0], *flags).stdout == penalized + "\n"
    streamed = cli("generate", spec, PROMPTS[0], "--max-tokens", "5", "--seed", "2", "--stream", "--direct")
    assert streamed.stdout == expected[0] + "\n"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n\n")
    lines = cli("generate", spec, "--file", str(prompts), "--max-tokens", "5", "--seed", "2").stdout.splitlines()
    assert [json.loads(line) for line in lines] == [
        {"prompt": p, "text": t} for p, t in zip(PROMPTS, expected, strict=True)
    ]
    bad = cli("generate", spec, "x", "--top-p", "5", check=False)
    assert bad.returncode == 2 and "argument --top-p" in bad.stderr  # the flag typed, before anything is sent


def test_a_replica_that_hangs_is_a_timeout_not_a_hang(deployment):
    """SIGSTOPped, its kernel still takes the connection but nothing answers: the gRPC stream has no deadline of
    its own, the client's `timeout_s` ends the wait."""
    job, _ = deployment["jobs"][0]
    (endpoint,) = (e for e in _endpoints(deployment) if e.job_id == job)
    os.kill(endpoint.pid, signal.SIGSTOP)
    try:
        with Client.from_job(job, replica=0, timeout_s=2) as client, pytest.raises(ServerError, match="timeout_s"):
            client.generate("Hello", 3)
    finally:
        os.kill(endpoint.pid, signal.SIGCONT)
    with Client.from_job(job, replica=0) as client:
        assert client.generate("Hello", 3)


def test_a_gateway_that_died_is_left_for_the_replicas(deployment):
    """Its record stays behind (SIGKILL); a client that had used it finds it gone at its next request and goes
    to the replicas, and a new client does not take the stale record for a gateway."""
    with Client(deployment["spec"], refresh_s=3600) as client:
        text = client.generate("Hello", 3)
        deployment["gateway"].send_signal(signal.SIGKILL)
        deployment["gateway"].wait(10)
        assert record_path(deployment["target"]).exists(), "a killed gateway cannot withdraw its record"
        assert client.generate("Hello", 3) == text
    with Client(deployment["spec"]) as client:
        assert client.generate("Hello", 3) == text


def test_a_killed_replicas_requests_are_retried_on_the_other(deployment, caplog):
    """Last: it kills a job. The client has not looked again since (refresh_s), so the dead replica is still in
    its balancer: whatever is sent to it fails before its first piece and goes to the other; none is lost."""
    with Client(deployment["spec"], gateway=False, refresh_s=3600) as client:
        expected = [client.generate(p, 6) for p in PROMPTS]  # both replicas in use, channels open
        victim = _endpoints(deployment)[0]
        os.kill(victim.pid, signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="hpc_serve.client"):
            assert client.generate_batch(PROMPTS, 6, concurrency=3) == expected
    retried = [r.getMessage() for r in caplog.records if "failed before its first piece" in r.getMessage()]
    assert retried and all(f"{victim.job_id}/0" in m for m in retried), caplog.text
