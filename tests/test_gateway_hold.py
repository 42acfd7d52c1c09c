"""A request that finds nothing serving under `autoscale:` (min_jobs 0, the deployment at zero): the gateway holds
it while a job starts and then serves it, or answers 503 with Retry-After once `hold_s` has passed. The gateway
runs as a gateway job does (`--job-id`, `--renew-from`: only there does a controller run, and only there is a
request held; an advisory one here, which submits nothing), a job of the local executor started meanwhile (what
the controller would submit). A gateway started by hand holds none: tests/test_gateway_workers.py."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e import cli, gateway_process, local_jobs, wait_for, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _autoscaled(folder, name: str, checkpoint, hold_s: float):
    spec = write_spec(folder, name, checkpoint, auth="none", workflow="llmapi")
    data = yaml.safe_load(spec.read_text())
    data["gateway"] = {}
    data["autoscale"] = {"min_jobs": 0, "max_jobs": 1, "hold_s": hold_s, "advisory": True}
    spec.write_text(yaml.safe_dump(data))
    return spec


def _as_a_job(spec) -> tuple[str, ...]:
    """The gateway's arguments as its job's script gives them: its job id and its rendered deployment folder."""
    data = yaml.safe_load(spec.read_text())
    folder = Path(data["workdir"]) / f"{data['name']}-gateway"
    cli("render", str(spec), "-o", str(folder))
    return ("--job-id", "4242", "--renew-from", str(folder))


def _none_picks(url: str) -> float:
    """The gateway's count of requests that found nothing serving (what the controller submits a job for)."""
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith('hpc_serve_gateway_picks_total{outcome="none"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_request_at_zero_is_held_until_a_job_serves_it(tritonserver, tiny_gpt2, tmp_path, hpc_home):
    spec = _autoscaled(tmp_path, "held", tiny_gpt2, hold_s=180)
    with gateway_process(str(spec), tmp_path / "gateway.log", *_as_a_job(spec)) as (_, record):
        answer: list[httpx.Response] = []
        body = {"model": "held", "prompt": "Once upon a time", "max_tokens": 2}
        asking = threading.Thread(
            target=lambda: answer.append(httpx.post(record.url + "/v1/completions", json=body, timeout=240))
        )
        asking.start()
        wait_for(lambda: _none_picks(record.url) >= 1, 30, "the request held (its pick found nothing serving)")
        assert not answer, "held, not answered"
        with local_jobs(tmp_path, spec, 1):
            asking.join(240)
            assert answer and answer[0].status_code == 200, answer and answer[0].text
            assert answer[0].json()["choices"][0]["text"] is not None


def test_a_request_held_past_hold_s_is_told_to_come_back(tritonserver, tiny_gpt2, tmp_path, hpc_home):
    spec = _autoscaled(tmp_path, "brief", tiny_gpt2, hold_s=1)
    with gateway_process(str(spec), tmp_path / "gateway.log", *_as_a_job(spec)) as (_, record):
        body = {"model": "brief", "prompt": "Once upon a time", "max_tokens": 2}
        refused = httpx.post(record.url + "/v1/completions", json=body, timeout=60)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
        assert refused.json()["error"]["code"] == "no_replica_ready"
        assert "within 1 s (a job is on its way)" in refused.json()["error"]["message"]
    assert cli("validate", str(spec)).returncode == 0
