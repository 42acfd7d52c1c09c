"""The gateway as a Slurm job of its own (`gateway:` in the spec) on the real test cluster: `submit` starts it
beside the serving job, it runs on a node and its address record points there, the `openai` package gets
completions through it, `status`/`endpoints` show it first, a second submit reuses it, `cancel` of a serving
job leaves it to the deployment's other jobs and takes it down with the last one, and cancelling it by id works.

The tests share one deployment and run in file order: each starts from the state the previous one left."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from launcher.contracts.layout import gateway_record
from launcher.contracts.records import GatewayRecord, read_gateway
from tests.e2e import cli, private_job_index, status, wait_for, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(400)]

openai = pytest.importorskip("openai")
NAME = "gwjob"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, slurm_cluster, tritonserver, tiny_gpt2) -> Iterator[dict]:
    """The spec (with `gateway:`), a private job index, and every job id started (scancel'ed at the end)."""
    folder = tmp_path_factory.mktemp("gateway-job")
    with private_job_index(folder):
        spec = write_spec(folder, NAME, tiny_gpt2)
        data = yaml.safe_load(spec.read_text())
        data["gateway"] = {"cpus": 1, "mem": "1G", "time": "00:15:00", "refresh_s": 1}
        spec.write_text(yaml.safe_dump(data))
        state: dict = {"spec": spec, "workdir": folder / "runs", "jobs": []}
        try:
            yield state
        finally:
            for job in state["jobs"]:
                subprocess.run(["scancel", job], capture_output=True, check=False)


def submit(deployment: dict) -> tuple[str, list[str]]:
    """`hpc-serve submit SPEC --wait` → (job id, the gateway line's words: gateway JOB STATE [URL])."""
    out = cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200").stdout.splitlines()
    job = out[0].split()[0]
    gateway = out[1].split()
    assert gateway[0] == "gateway", out
    deployment["jobs"] += [job, gateway[1]]
    return job, gateway


def record_of(deployment: dict) -> GatewayRecord | None:
    return read_gateway(gateway_record(deployment["workdir"], NAME))


def gateway_ready(job: str) -> GatewayRecord:
    """Wait until the gateway job is READY (its record answers); its record."""
    wait_for(lambda: status(job).get("state") == "READY", 120, f"gateway job {job} to be READY")
    shown = status(job)
    assert shown["kind"] == "gateway" and shown["url"]
    return GatewayRecord(name=NAME, url=shown["url"], job_id=job)


def squeue(*args: str) -> list[str]:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, check=True).stdout.split()


def test_submit_starts_the_gateway_as_a_job_on_a_node_and_its_record_points_there(deployment):
    job, (_, gateway, state, *_) = submit(deployment)
    assert state in ("PENDING", "STARTING", "READY"), "a new gateway job"
    deployment["job"], deployment["gateway"] = job, gateway
    gateway_ready(gateway)
    record = record_of(deployment)
    assert record is not None and record.job_id == gateway and record.name == NAME
    (node,) = squeue("-j", gateway, "-o", "%N")
    assert record.host == node, "the node Slurm put the gateway on"
    assert not record.url.startswith(("http://127.", "http://0.0.0.0")), "bound to 0.0.0.0: a reachable address"
    health = httpx.get(record.url + "/gateway/health", timeout=5).json()
    assert health["name"] == NAME and health["workdir"] == str(deployment["workdir"].resolve())
    wait_for(
        lambda: httpx.get(record.url + "/gateway/health", timeout=5).json()["replicas_ready"] == 1, 30, "a replica"
    )


def test_openai_completions_through_the_gateway_job(deployment):
    record = record_of(deployment)
    assert record is not None
    token = cli("token", NAME).stdout.strip()
    client = openai.OpenAI(base_url=record.url + "/v1", api_key=token, max_retries=0)
    out = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=6)
    assert out.choices[0].text and out.usage.completion_tokens == 6
    chunks = list(
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_status_and_endpoints_show_the_gateway_first(deployment):
    job, gateway = deployment["job"], deployment["gateway"]
    record = record_of(deployment)
    assert record is not None
    assert cli("status", job).stdout.splitlines()[1] == f"gateway {gateway} READY {record.url}"
    assert cli("status", gateway).stdout.strip() == f"{gateway} READY (gateway) {record.url}"
    by_name = json.loads(cli("status", NAME, "--json").stdout)
    assert [j["job_id"] for j in by_name["jobs"]] == [job] and by_name["gateway"]["job_id"] == gateway
    lines = cli("endpoints", NAME).stdout.splitlines()
    assert lines[0].startswith(f"gateway (job {gateway} on {record.host}): {record.url}"), lines
    assert lines[1].startswith("replica 0 on "), lines
    env = cli("endpoints", job, "--format", "env").stdout.splitlines()
    assert env[:2] == [f"GATEWAY_URL={record.url}", f"OPENAI_BASE_URL={record.url}/v1"] and env[2].startswith("TRITON_")


def test_a_gateway_killed_outright_is_started_again_by_its_job(deployment):
    """SIGKILL (what an out-of-memory killer sends) to the gateway process: the job starts it again (gateway.sub),
    it publishes a new record and serves, the job stays READY, and its log says so, rather than the job
    ending FAILED and the deployment's address with it (docs/decisions.md "A gateway job starts its gateway again")."""
    import os
    import signal

    gateway = deployment["gateway"]
    before = record_of(deployment)
    assert before is not None and before.job_id == gateway
    os.kill(before.pid, signal.SIGKILL)  # the gateway job runs on this machine's emulated node
    wait_for(
        lambda: (
            (r := record_of(deployment)) is not None and r.pid != before.pid and status(gateway)["state"] == "READY"
        ),
        60,
        "the gateway started again in its job",
    )
    after = record_of(deployment)
    assert after is not None and after.job_id == gateway
    token = cli("token", NAME).stdout.strip()
    client = openai.OpenAI(base_url=after.url + "/v1", api_key=token, max_retries=0)
    assert client.completions.create(model=NAME, prompt="Hi", max_tokens=2).choices[0].text is not None
    err = next(Path(deployment["workdir"]).glob(f"*/logs/{gateway}.err")).read_text()
    assert "hpc-serve: the gateway died of signal 9; starting it again (1 of 5)" in err, err[-2000:]


def test_a_second_submit_reuses_the_gateway_and_cancelling_it_keeps_the_gateway(deployment):
    gateway = deployment["gateway"]
    second, (_, reused, state, *_) = submit(deployment)
    assert (reused, state) == (gateway, "READY"), "the running gateway is reused, not a second one started"
    assert squeue("-n", f"{NAME}-gateway", "-o", "%i") == [gateway]
    out = cli("cancel", second, timeout=120).stdout.splitlines()
    assert out[0] == f"{second} CANCELLED" and out[1].startswith(f"gateway {gateway} READY"), out
    assert record_of(deployment) is not None


def test_the_gateway_job_cancelled_by_id_then_a_new_submit_starts_another(deployment):
    gateway = deployment["gateway"]
    out = cli("cancel", gateway, timeout=120).stdout.splitlines()
    assert out[0] == f"{gateway} CANCELLED (gateway)", out
    assert record_of(deployment) is None, "its record is gone"
    assert gateway not in squeue("-o", "%i")
    assert cli("status", deployment["job"]).stdout.splitlines()[1] == f"gateway {gateway} CANCELLED"
    third, (_, new, *_) = submit(deployment)
    assert new != gateway
    deployment["third"], deployment["gateway"] = third, new
    assert gateway_ready(new).url


def test_cancelling_the_deployments_last_job_cancels_the_gateway_and_removes_its_record(deployment):
    gateway = deployment["gateway"]
    out = cli("cancel", deployment["job"], timeout=120).stdout.splitlines()
    assert out[1].startswith(f"gateway {gateway} READY"), f"another job still runs: the gateway stays\n{out}"
    out = cli("cancel", deployment["third"], timeout=120).stdout.splitlines()
    assert out == [f"{deployment['third']} CANCELLED", f"gateway {gateway} CANCELLED"], out
    assert record_of(deployment) is None
    assert not squeue("-n", f"{NAME},{NAME}-gateway", "-o", "%i")
    assert not Path(gateway_record(deployment["workdir"], NAME)).exists()
