"""`hpc-serve gateway` in front of two Slurm jobs of one deployment on the real test cluster (each tp 2 across
node1/node2, `auth: token`), with the `openai` package as its client: no token or a wrong one is 401; a replica
that refuses the token the gateway sends it (its folder's token file replaced since the job started) is a 502
naming that file, and is not benched; and a leader tritonserver SIGKILLed under a steady load of streaming and
non-streaming requests fails no request that had not received its first byte (each is retried on the other job),
while requests already streaming from it may fail: both counts are printed.

The tests share the two jobs and the gateway and run in file order (the kill is last)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpc.serving.auth import new_token
from launcher.contracts.job_index import entry_name_of
from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.records import read_endpoints
from tests.e2e import gateway_process, job_token, private_job_index, submit, wait_for, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(420)]

openai = pytest.importorskip("openai")
NAME = "gwkill"
CONCURRENCY = 16
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, slurm_cluster, tritonserver, tiny_gpt2) -> Iterator[dict]:
    """Two READY jobs of one spec (tp 2: rank 0 on node1, rank 1 on node2) and `hpc-serve gateway SPEC` once it
    sees both: {"spec", "jobs": [(id, job folder)], "token", "url", "log"}; scancel'ed and stopped at the end."""
    folder = tmp_path_factory.mktemp("gateway-cluster")
    with private_job_index(folder):
        spec = write_spec(folder, NAME, tiny_gpt2, tp=2, nodes=2, triton={"triton_max_batch_size": CONCURRENCY})
        jobs: list[tuple[str, Path]] = []
        try:
            for _ in range(2):  # one at a time: 4 tritonservers loading at once starve 2 cores
                jobs.append(submit(spec))
            token = job_token(jobs[0][0])
            assert token, "auth: token is the default"
            with gateway_process(str(spec), folder / "gateway.log") as (_, record):
                state = {"spec": spec, "jobs": jobs, "token": token, "url": record.url, "log": folder / "gateway.log"}
                wait_for(lambda: len(replicas(state)) == 2, 60, "the gateway to use both jobs")
                yield state
        finally:
            for job, _ in jobs:
                subprocess.run(["scancel", job], capture_output=True, check=False)


def replicas(deployment: dict) -> dict[str, dict]:
    """The gateway's replicas by key (`<job id>@<cluster>/<replica>`), with its counters (`/gateway/replicas`)."""
    headers = {"Authorization": f"Bearer {deployment['token']}"}
    answer = httpx.get(deployment["url"] + "/gateway/replicas", headers=headers, timeout=10, trust_env=False)
    return {r["key"]: r for r in answer.json()}


def replica_key(job_dir: Path, replica: int = 0) -> str:
    """The gateway's key of a job's replica: the job as its index entry names it (`33@hpcserve`), its replica."""
    return f"{entry_name_of(JobPaths.of_folder(job_dir))}/{replica}"


def retries(url: str, reason: str) -> float:
    """The gateway's `hpc_serve_gateway_retries_total{reason}`."""
    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    samples = (s for f in text_string_to_metric_families(text) for s in f.samples)
    return sum(s.value for s in samples if s.name == "hpc_serve_gateway_retries_total" and s.labels["reason"] == reason)


def complete(url: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 4}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60, trust_env=False)


def test_no_token_or_a_wrong_one_is_401_and_the_right_one_is_served(deployment):
    url = deployment["url"]
    for token in (None, "wrong", new_token()):
        answer = complete(url, token)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key", answer.text
    wrong = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=NAME, prompt="x", max_tokens=1)
    right = openai.OpenAI(base_url=url + "/v1", api_key=deployment["token"], max_retries=0)
    assert right.completions.create(model=NAME, prompt="x", max_tokens=2).usage.completion_tokens >= 1


def test_a_replica_refusing_the_gateways_token_is_502_naming_the_file_and_is_not_benched(deployment):
    """Job 2's folder gets a new token file: the gateway sends job 2's replica that token, which its tritonserver
    (started with the old one) refuses. The client's token is still good (job 1's folder has it)."""
    url, token = deployment["url"], deployment["token"]
    _, job_dir = deployment["jobs"][1]
    token_file = Deployment(job_dir.parent.parent).token
    original = token_file.read_text()
    failures = replicas(deployment)[replica_key(job_dir)]["failures"]
    try:
        token_file.write_text(new_token() + "\n")
        refused = wait_for(
            lambda: next((a for a in (complete(url, token) for _ in range(2)) if a.status_code == 502), None),
            60,
            "a request sent to job 2 with its new token file",
        )
        message = refused.json()["error"]["message"]
        assert f"replica {replica_key(job_dir)} refused the access token" in message, message
        assert "access_token" in message, message
        shown = replicas(deployment)[replica_key(job_dir)]
        assert shown["failures"] == failures and shown["healthy"], "a refused token is not a dead replica"
    finally:
        token_file.write_text(original)
    wait_for(lambda: all(complete(url, token).status_code == 200 for _ in range(2)), 60, "both jobs to serve again")


def test_a_leader_killed_under_load_fails_no_request_that_had_not_received_its_first_byte(deployment):
    (_, victim_dir), _ = deployment["jobs"]
    (endpoint,) = read_endpoints(JobPaths.of_folder(victim_dir))
    leader = endpoint.pid  # rank 0's tritonserver; node1 and node2 are this host's, so its pid is ours to signal
    assert "tritonserver" in Path(f"/proc/{leader}/cmdline").read_bytes().decode(errors="replace")
    outcome = asyncio.run(_load_and_kill(deployment, replica_key(victim_dir), leader))
    print(
        f"\n{outcome['ok']} requests served ({outcome['ok_after']} after the kill); failed before their first byte: "
        f"{len(outcome['before'])}; failed while streaming from the killed replica: {len(outcome['streaming'])}; "
        f"requests in flight on it at the kill: {outcome['in_flight']}, retried elsewhere: {outcome['retried']:g}"
    )
    events = [line for line in deployment["log"].read_text().splitlines() if not line.startswith("{")]
    assert outcome["before"] == [], ("a request that had not received its first byte failed", events[-12:])
    assert outcome["retried"] + len(outcome["streaming"]) > 0, "the kill hit requests"
    assert outcome["ok_after"] > 0 and replica_key(victim_dir) not in replicas(deployment), "the other job serves on"


async def _load_and_kill(deployment: dict, key: str, leader: int) -> dict:
    """`CONCURRENCY` clients sending completions back to back (every other one streamed) through the gateway;
    once both jobs served and the victim has requests in flight, its leader is SIGKILLed; the load goes on
    until the gateway dropped the victim, the kill's requests were retried or failed, and the other job served
    a round of requests after the kill (events, not a pause). Failures are sorted by whether the client had
    received anything."""
    url = deployment["url"]
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=deployment["token"], max_retries=0, timeout=60)
    out: dict = {"ok": 0, "ok_after": 0, "before": [], "streaming": [], "in_flight": 0, "retried": 0.0}
    killed = asyncio.Event()
    stop = asyncio.Event()

    async def one(i: int, n: int) -> None:
        prompt = f"Request {n} of client {i}: once upon a time"
        started = False
        try:
            if (i + n) % 2:
                stream = await client.completions.create(model=NAME, prompt=prompt, max_tokens=MAX_TOKENS, stream=True)
                started = True  # the answer's head and first event came
                async for _ in stream:
                    pass
            else:
                await client.completions.create(model=NAME, prompt=prompt, max_tokens=MAX_TOKENS)
        except (openai.APIError, httpx.HTTPError) as exc:
            (out["streaming"] if started else out["before"]).append(f"{type(exc).__name__}: {exc}")
            return
        out["ok"] += 1
        out["ok_after"] += killed.is_set()

    async def worker(i: int) -> None:
        n = 0
        while not stop.is_set():
            await one(i, n)
            n += 1

    workers = [asyncio.create_task(worker(i)) for i in range(CONCURRENCY)]
    try:

        def ready_to_kill() -> bool:
            shown = replicas(deployment)
            return (
                out["ok"] >= 2 * CONCURRENCY
                and all(r["served"] > 4 and r["healthy"] for r in shown.values())
                and shown[key]["outstanding"] > 0
            )

        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(ready_to_kill):
            assert time.monotonic() < deadline, f"both jobs never served under load: {out}"
            await asyncio.sleep(0.1)
        before = await asyncio.to_thread(retries, url, "unavailable")
        while not (in_flight := (await asyncio.to_thread(replicas, deployment))[key]["outstanding"]):
            assert time.monotonic() < deadline, f"the victim never had a request in flight: {out}"
        out["in_flight"] = in_flight  # read just before the kill: requests may end between the two
        os.kill(leader, signal.SIGKILL)
        killed.set()

        def settled() -> bool:  # what the test asserts has happened, or the deadline passes and it says what not
            hit = retries(url, "unavailable") - before + len(out["streaming"]) > 0
            return hit and out["ok_after"] >= CONCURRENCY and key not in replicas(deployment)

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not await asyncio.to_thread(settled):
            await asyncio.sleep(0.2)
        out["retried"] = await asyncio.to_thread(retries, url, "unavailable") - before
    finally:
        stop.set()
        await asyncio.gather(*workers)
        await client.close()
    return out
