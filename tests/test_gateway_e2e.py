"""`hpc-serve gateway` in front of a real job (local executor, tritonserver, CPU engine), with the `openai`
package as the client: the OpenAI API, Triton passthrough, the access token, errors. One job and one gateway
for the module, so the whole file costs one job start."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from launcher.layout import JobPaths
from launcher.records import read_endpoints
from tests.e2e import CLI, cli, kill_quietly, processes_under, submit, wait_for, write_spec

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]

openai = pytest.importorskip("openai")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, tiny_gpt2, tritonserver) -> Iterator[dict]:
    """A READY local job, its token, and a gateway on it: {"url", "token", "job", "model"}."""
    from hpc.local import job_processes

    folder = tmp_path_factory.mktemp("gateway")
    old_home = os.environ.get("HPC_SERVE_HOME")
    os.environ["HPC_SERVE_HOME"] = str(folder / "hpc-home")
    proc, jobs = None, []
    try:
        spec = write_spec(folder, "gw", tiny_gpt2, tp=1)
        job, job_dir = submit(spec, "--executor", "local")
        jobs.append((job, job_dir))
        token = cli("token", job).stdout.strip()
        assert cli("token", job).stdout.strip() == token, "the same token every time"
        port = _free_port()
        log = folder / "gateway.log"
        proc = subprocess.Popen(
            [*CLI, "gateway", job, "--port", str(port), "--refresh", "1"],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
        )
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, "the gateway to find the replica")
        yield {"url": url, "token": token, "job": job, "model": "gw", "spec": spec, "jobs": jobs, "log": log}
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for job, job_dir in jobs:
            kill_quietly(job_processes(job))
            kill_quietly(pid for pid, _ in processes_under(job_dir.parent.parent))
        if old_home is None:
            os.environ.pop("HPC_SERVE_HOME", None)
        else:
            os.environ["HPC_SERVE_HOME"] = old_home


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway["url"] + "/v1", api_key=gateway["token"], max_retries=0)


def test_models_lists_the_deployment(client, gateway):
    assert [m.id for m in client.models.list().data] == [gateway["model"]]


def test_completion_usage_and_stream_agree(client, gateway):
    out = client.completions.create(model=gateway["model"], prompt="Once upon a time", max_tokens=8)
    (choice,) = out.choices
    assert choice.text and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 8 and out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8

    chunks = list(
        client.completions.create(
            model=gateway["model"],
            prompt="Once upon a time",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text, "greedy: streamed and whole answers are the same text"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_stop_sequence_is_cut_and_reported(client, gateway):
    whole = client.completions.create(model=gateway["model"], prompt="The answer is", max_tokens=16)
    text = whole.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"pick a visible stop sequence from {text!r}"
    expected = text[: text.find(stop)]
    cut = client.completions.create(model=gateway["model"], prompt="The answer is", max_tokens=16, stop=[stop])
    assert cut.choices[0].text == expected and cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=gateway["model"], prompt="The answer is", max_tokens=16, stop=stop, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_whole_and_streamed(client, gateway):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    out = client.chat.completions.create(model=gateway["model"], messages=messages, max_tokens=6, seed=1)
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content and out.usage.completion_tokens == 6
    chunks = list(
        client.chat.completions.create(model=gateway["model"], messages=messages, max_tokens=6, seed=1, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == out.choices[0].message.content
    sampled = client.chat.completions.create(
        model=gateway["model"],
        messages=messages,
        max_tokens=6,
        temperature=0.8,
        top_p=0.9,
        seed=7,
        extra_body={"top_k": 20},
    )
    assert sampled.usage.completion_tokens <= 6


def test_token_missing_or_wrong_is_401(gateway):
    for key in ("wrong", None):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = httpx.get(gateway["url"] + "/v1/models", headers=headers)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=gateway["url"] + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=gateway["model"], prompt="x", max_tokens=1)
    response = httpx.post(gateway["url"] + "/v2/models/ensemble/generate", json={"text_input": "x", "max_tokens": 1})
    assert response.status_code == 401


def test_unknown_model_is_404_and_bad_fields_are_400(client, gateway):
    with pytest.raises(openai.NotFoundError) as exc:
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    assert exc.value.body["code"] == "model_not_found"
    for bad, field in (({"temperature": 5}, "temperature"), ({"n": 2}, "n"), ({"max_tokens": 0}, "max_tokens")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model=gateway["model"], prompt="x", **{"max_tokens": 1, **bad})
        assert exc.value.body["param"] == field, exc.value.body


def test_triton_passthrough(gateway):
    headers = {"Authorization": f"Bearer {gateway['token']}"}
    assert httpx.get(gateway["url"] + "/v2/health/live").status_code == 200
    body = {"text_input": "Once upon a time", "max_tokens": 4}
    response = httpx.post(gateway["url"] + "/v2/models/ensemble/generate", json=body, headers=headers, timeout=60)
    assert response.status_code == 200 and response.json()["text_output"], response.text
    with httpx.stream(
        "POST",
        gateway["url"] + "/v2/models/ensemble/generate_stream",
        json={**body, "stream": True},
        headers=headers,
        timeout=60,
    ) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("data:")]
    assert stream.status_code == 200 and events
    missing = httpx.post(gateway["url"] + "/v2/models/nope/generate", json=body, headers=headers, timeout=60)
    assert missing.status_code >= 400, "the replica's own answer, passed on"


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
