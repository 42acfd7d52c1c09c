"""A gateway job renews itself (hpc/jobs/renewal.py) on the real test cluster: with `renew:` and a gateway
job of 3 minutes on a fixed port on node1, the job submits its successor 2 minutes before its limit, the
successor listens on the same port beside it and publishes its record, the predecessor stops taking connections
and ends COMPLETED, and a client of the `openai` package sending requests all along to the one address sees no
failure. Cancelling the deployment takes the successor down too. The two minutes leave the handover room on a
machine as busy as CI's; it starts a minute after the job, as a 2-minute job's would with `before: 1m`."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator

import pytest
import yaml

from launcher.contracts.layout import gateway_record
from launcher.contracts.records import read_gateway
from tests.e2e import cli, free_port, private_job_index, status, wait_for, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timelimit, pytest.mark.timeout(420)]

openai = pytest.importorskip("openai")
NAME = "gwrenew"


@pytest.fixture
def deployment(tmp_path, slurm_cluster, tritonserver, tiny_gpt2) -> Iterator[dict]:
    with private_job_index(tmp_path):
        spec = write_spec(tmp_path, NAME, tiny_gpt2, renew={"before": "2m"})
        data = yaml.safe_load(spec.read_text())
        port = free_port("0.0.0.0")  # the gateway job binds every address of node1
        data["gateway"] = {"cpus": 1, "mem": "1G", "time": "00:03:00", "refresh_s": 1}
        data["gateway"] |= {"port": port, "nodelist": "node1"}
        spec.write_text(yaml.safe_dump(data))
        state: dict = {"spec": spec, "workdir": tmp_path / "runs", "port": port}
        try:
            yield state
        finally:
            cli("cancel", NAME, check=False)
            ids = subprocess.run(["squeue", "-h", "-o", "%i|%j"], capture_output=True, text=True).stdout.split()
            for line in ids:
                job, _, name = line.partition("|")
                if name.startswith(NAME):
                    subprocess.run(["scancel", job], capture_output=True, check=False)


def handover_story(workdir, *job_ids: str) -> str:
    """What went wrong, from what the jobs said: Slurm's times, and each gateway's own log lines (not its access log)."""
    times = subprocess.run(
        ["sacct", "-X", "-j", ",".join(job_ids), "-o", "JobID,State,Submit,Start,End,Timelimit"],
        capture_output=True,
        text=True,
    ).stdout
    logs = []
    for job_id in job_ids:
        for path in workdir.glob(f"*/logs/{job_id}.*"):
            lines = [line for line in path.read_text(errors="replace").splitlines() if not line.startswith("{")]
            logs.append(f"--- {path.name}\n" + "\n".join(lines[-20:]))
    return times + "\n".join(logs)


def test_the_gateway_job_hands_over_to_its_successor_on_the_same_address(deployment):
    out = cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200").stdout.splitlines()
    gateway_words = out[1].split()
    assert gateway_words[0] == "gateway", out
    first = gateway_words[1]
    wait_for(lambda: status(first).get("state") == "READY", 120, f"gateway job {first} to be READY")
    record = read_gateway(gateway_record(deployment["workdir"], NAME))
    assert record is not None and record.job_id == first and record.url.endswith(f":{deployment['port']}")
    token = cli("token", NAME).stdout.strip()
    client = openai.OpenAI(base_url=record.url + "/v1", api_key=token)
    counts = {"ok": 0, "streamed": 0}
    failures: list[str] = []
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                if i % 2:
                    out = client.completions.create(model=NAME, prompt=f"Request {i}", max_tokens=8)
                    assert out.choices[0].text is not None
                    counts["ok"] += 1
                else:
                    chunks = list(
                        client.completions.create(model=NAME, prompt=f"Stream {i}", max_tokens=8, stream=True)
                    )
                    assert chunks
                    counts["streamed"] += 1
            except Exception as exc:  # noqa: BLE001 - every failure a client would see is counted
                failures.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=load) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:

        def handed_over() -> bool:
            current = read_gateway(gateway_record(deployment["workdir"], NAME))
            return current is not None and current.job_id != first

        wait_for(handed_over, 200, "the successor gateway job to publish its record")
        successor = read_gateway(gateway_record(deployment["workdir"], NAME))
        assert successor is not None and successor.url == record.url, "the same node and port: the same address"
        wait_for(lambda: status(first).get("state") in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 120, "the end")
        assert status(first)["state"] == "COMPLETED", handover_story(deployment["workdir"], first, successor.job_id)
        assert status(successor.job_id)["state"] == "READY"
        ended = dict(counts)  # requests go on through the successor alone: a few of each kind (or a failure)
        wait_for(
            lambda: (
                failures
                or (counts["ok"] >= max(11, ended["ok"] + 2) and counts["streamed"] >= max(11, ended["streamed"] + 2))
            ),
            120,
            f"requests through the successor alone, after {ended}",
        )
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    assert not failures, failures[:5]
    assert counts["ok"] > 10 and counts["streamed"] > 10, counts
    cli("cancel", NAME)
    wait_for(lambda: status(successor.job_id).get("state") == "CANCELLED", 60, "the successor to be cancelled")
    assert read_gateway(gateway_record(deployment["workdir"], NAME)) is None
