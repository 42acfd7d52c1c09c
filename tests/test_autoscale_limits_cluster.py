"""The account's own limits on the test cluster: a deployment that runs under an account of its own, whose GrpJobs
leaves room for its gateway job and one serving job, stays at one serving job under a load that would grow it,
and says why: the limit, named, in the controller's record and in `status`'s decisions table
(hpc/scheduler/limits.py, hpc/serving/autoscale.py). The cluster does not enforce associations
(AccountingStorageEnforce is unset): Slurm would queue a second job, only the controller's check holds it.

The test makes its account with sacctmgr and removes it at the end, whatever the outcome.

Also here, the other half of the controller's Slurm side: a request held at zero while the controller's job pends
is told to come back when Slurm's start estimate (plus the measured time to READY) says it will serve."""

from __future__ import annotations

import math
import os
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from hpc.jobs.autoscale import autoscale_record
from hpc.serving.deployment import target_of_folder
from launcher.contracts.autoscale import AutoscaleRecord
from launcher.contracts.layout import GATEWAY_JOB_MARKER_NAME, gateway_record
from launcher.contracts.records import read_gateway
from tests._sim import sim_spec
from tests.e2e import cli, hold_gpus, private_job_index, status, wait_for, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(480)]

openai = pytest.importorskip("openai")
NAME = "limited"
#: an account of this test's own (the process id: two runs on one cluster do not share it)
ACCOUNT = f"hs_limits_{os.getpid()}"
#: its gateway job and one serving job: a second serving job would be a third job of the account
GRP_JOBS = 2
#: a load step that grows an unlimited deployment (tests/test_autoscale_cluster.py's STEP), with room in max_jobs
STEP = {"min_jobs": 1, "max_jobs": 3, "target_outstanding": 1, "scale_up_after": "2s", "scale_down_after": "60s"}


def _sacctmgr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=60)


def _account_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-A", ACCOUNT, "-o", "%i"], capture_output=True, text=True).stdout
    return out.split()


@pytest.fixture
def account(slurm_cluster) -> Iterator[str]:
    """The account, with GrpJobs, and this user's association in it; removed at the end (its jobs ended first:
    sacctmgr keeps an association with jobs under way)."""
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    made = _sacctmgr("add", "account", ACCOUNT, f"GrpJobs={GRP_JOBS}", "Description=hpc-serve test")
    assert made.returncode == 0, made.stderr
    try:
        joined = _sacctmgr("add", "user", user, f"account={ACCOUNT}")
        assert joined.returncode == 0, joined.stderr
        yield ACCOUNT
    finally:
        for job in _account_jobs():
            subprocess.run(["scancel", job], capture_output=True, check=False)
        wait_for(lambda: not _account_jobs(), 120, f"the jobs of account {ACCOUNT} to end")
        _sacctmgr("delete", "user", user, f"account={ACCOUNT}")
        gone = _sacctmgr("delete", "account", ACCOUNT)
        assert gone.returncode == 0 or "Nothing deleted" in gone.stdout + gone.stderr, gone.stderr


@pytest.fixture
def deployment(account, tmp_path, tritonserver, tiny_gpt2) -> Iterator[dict]:
    with private_job_index(tmp_path):
        spec = write_spec(tmp_path, NAME, tiny_gpt2, slurm={"account": account})
        data = yaml.safe_load(spec.read_text())
        data["gateway"] = {"cpus": 1, "mem": "1G", "refresh_s": 1}
        data["autoscale"] = STEP
        spec.write_text(yaml.safe_dump(data))
        try:
            yield {"spec": spec, "workdir": tmp_path / "runs"}
        finally:
            cli("cancel", NAME, check=False)


def _record(workdir) -> AutoscaleRecord | None:
    """The controller's record, as `status` and the plot find it."""
    folder = next(workdir.glob(f"{NAME}-*"), None)
    return autoscale_record(target_of_folder(folder)) if folder is not None else None


def _serving_jobs(workdir) -> list[str]:
    return [
        folder.name
        for folder in sorted(workdir.glob(f"{NAME}-*/jobs/*"))
        if not (folder / GATEWAY_JOB_MARKER_NAME).exists()
    ]


def test_the_controller_stops_at_the_accounts_limit_and_says_which(deployment):
    out = cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200").stdout.splitlines()
    gateway_job = next(line.split()[1] for line in out if line.startswith("gateway"))
    wait_for(lambda: status(gateway_job).get("state") == "READY", 120, f"gateway job {gateway_job} to be READY")
    assert sorted(_account_jobs()) == sorted([gateway_job, *_serving_jobs(deployment["workdir"])])
    record = read_gateway(gateway_record(deployment["workdir"], NAME))
    assert record is not None
    client = openai.OpenAI(base_url=record.url + "/v1", api_key=cli("token", NAME).stdout.strip(), max_retries=0)
    failures: list[str] = []
    stop = threading.Event()

    def load(i: int) -> None:
        while not stop.is_set():
            try:
                assert list(client.completions.create(model=NAME, prompt=f"Load {i}", max_tokens=32, stream=True))
            except Exception as exc:  # noqa: BLE001 - every failure a client would see is counted
                failures.append(f"{type(exc).__name__}: {exc}")

    limit = f"account '{ACCOUNT}' GrpJobs={GRP_JOBS}: {GRP_JOBS} in use"

    def held_at_the_limit() -> AutoscaleRecord | None:
        scaled = _record(deployment["workdir"])
        return scaled if scaled is not None and any(limit in d.reason for d in scaled.decisions) else None

    workers = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    try:
        held = wait_for(held_at_the_limit, 180, f"a hold naming {limit!r}")
        shown = cli("status", NAME).stdout
        looks = len(held.samples)
        wait_for(lambda: len(_record(deployment["workdir"]).samples) >= looks + 4, 60, "four more looks under load")
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    assert not failures, failures[:5]
    final = _record(deployment["workdir"])
    assert final is not None and not [d for d in final.decisions if d.action == "submit"], final.decisions
    row = next(d for d in final.decisions if limit in d.reason)
    assert row.action == "hold" and "above the target 1" in row.reason, row
    assert limit in shown and "autoscale decisions" in shown, shown
    assert len(_serving_jobs(deployment["workdir"])) == 1 and len(_account_jobs()) == GRP_JOBS
    assert max(s.ready + s.pending + s.starting for s in final.samples) == 1, final.samples
    # the serving job's time from its start to READY, measured: what a held request's Retry-After adds
    assert final.ready_after_s is not None and final.ready_after_s > 0
    assert final.measured_job in _serving_jobs(deployment["workdir"])


#: at zero when idle, each job a whole node's 4 GPUs (both nodes' are held by the test's own jobs meanwhile), a
#: short hold: the held request is answered 503 while the job pends
AT_ZERO = {"min_jobs": 0, "max_jobs": 1, "scale_up_after": "2s", "scale_down_after": "5s", "hold_s": 3}


def test_a_held_request_is_told_to_come_back_when_slurm_expects_the_job_to_serve(tmp_path, slurm_cluster, tritonserver):
    with private_job_index(tmp_path):
        spec = sim_spec(tmp_path, NAME, extra_slurm={"gpus_per_node": 4})
        data = yaml.safe_load(spec.read_text())
        data["gateway"] = {"cpus": 1, "mem": "1G", "refresh_s": 1}
        data["autoscale"] = AT_ZERO
        data["auth"] = "none"
        spec.write_text(yaml.safe_dump(data))
        workdir = tmp_path / "runs"
        holders: list[str] = []
        try:
            cli("submit", str(spec), "--wait", "--timeout", "200")
            (first,) = _serving_jobs(workdir)
            holders += [hold_gpus("node1"), hold_gpus("node2")]  # one waits for the idle job's drain
            wait_for(lambda: status(first).get("state") == "COMPLETED", 120, f"the idle job {first} drained")
            running = lambda: subprocess.run(  # noqa: E731
                ["squeue", "-h", "-t", "R", "-j", ",".join(holders), "-o", "%i"], capture_output=True, text=True
            ).stdout.split()
            wait_for(lambda: len(running()) == 2, 60, "both nodes' GPUs held")
            record = read_gateway(gateway_record(workdir, NAME))
            assert record is not None
            body = {"model": NAME, "prompt": "Anyone there?", "max_tokens": 4}
            first_try = httpx.post(record.url + "/v1/completions", json=body, timeout=60)
            assert first_try.status_code == 503, first_try.text  # held 3 s; the controller's job is submitted

            def estimated() -> AutoscaleRecord | None:
                scaled = _record(workdir)
                return scaled if scaled is not None and scaled.expected_at is not None else None

            scaled = wait_for(estimated, 120, "the controller's job PENDING with Slurm's start estimate")
            again = httpx.post(record.url + "/v1/completions", json=body, timeout=60)
            told = time.time()
            # read now: once the holders go (below) the job starts, and a later look puts its real start there
            expected = _record(workdir)
        finally:
            for job in holders:
                subprocess.run(["scancel", job], capture_output=True, check=False)
            cli("cancel", NAME, check=False)
    assert again.status_code == 503 and again.json()["error"]["code"] == "no_replica_ready", again.text
    assert expected is not None and expected.expected_at is not None and expected.ready_after_s is not None
    # the holders end in 10 minutes: that, plus the measured time to READY, less the seconds since
    wait = math.ceil(expected.expected_at - told)
    assert 300 < int(again.headers["retry-after"]) <= 600 + expected.ready_after_s, again.headers
    assert abs(int(again.headers["retry-after"]) - wait) <= 10, (again.headers, wait)
    assert f"job {scaled.expected_job} is expected to serve at about" in again.json()["error"]["message"]
    assert "estimated start" in scaled.expected_note and "as measured" in scaled.expected_note, scaled.expected_note
