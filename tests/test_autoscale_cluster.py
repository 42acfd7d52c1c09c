"""Autoscaling on the test cluster: a deployment with `min_jobs: 1, max_jobs: 2` under a load step through its
gateway job grows to two serving jobs and, once the step ends, shrinks back to one by drain while a client streams
on (the drained job ends COMPLETED), with no request failed (hpc/jobs/autoscale.py, hpc/serving/autoscale.py).
The simulated engine at an H200's pace takes a trace of a step up, a plateau, a drop and idle on `max_jobs: 3`;
a job kept PENDING by a job holding the other node's GPUs is capacity on the way, and the first to go."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from launcher.contracts.autoscale import AutoscaleRecord
from launcher.contracts.layout import GATEWAY_JOB_MARKER_NAME, Deployment, gateway_record
from launcher.contracts.records import read_gateway
from tests._sim import sim_spec
from tests.e2e import (
    cli,
    free_port,
    hold_gpus,
    private_job_index,
    prometheus_samples,
    status,
    wait_for,
    write_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(480)]

openai = pytest.importorskip("openai")
NAME = "autoscaled"


#: a load step: one job carries 1 request in flight per replica, so 4 clients take two
STEP = {"min_jobs": 1, "max_jobs": 2, "target_outstanding": 1, "scale_up_after": "2s", "scale_down_after": "10s"}
#: to zero when idle, and back on a request; idle for 30 s before the drain: the test's request reaches the job that
#: came back well within that, once the gateway sees it
ZERO = {"min_jobs": 0, "max_jobs": 1, "scale_up_after": "2s", "scale_down_after": "30s", "hold_s": 240}


@contextlib.contextmanager
def _autoscaled(folder: Path, spec: Path, autoscale: dict) -> Iterator[dict]:
    """`spec` with a gateway job and `autoscale`; every job of the deployment cancelled at the end."""
    with private_job_index(folder):
        data = yaml.safe_load(spec.read_text())
        data["gateway"] = {"cpus": 1, "mem": "1G", "refresh_s": 1}
        data["autoscale"] = autoscale
        spec.write_text(yaml.safe_dump(data))
        try:
            yield {"spec": spec, "workdir": folder / "runs"}
        finally:
            cli("cancel", NAME, check=False)
            # what is left of this test's own jobs: those whose script is under its folder (another test's
            # deployment of the same name may run beside it, in the other pytest of the test command)
            ids = subprocess.run(["squeue", "-h", "-o", "%i|%o"], capture_output=True, text=True).stdout.split()
            for line in ids:
                job, _, script = line.partition("|")
                if Path(script).is_relative_to(folder):
                    subprocess.run(["scancel", job], capture_output=True, check=False)


@pytest.fixture
def deployment(request, tmp_path, slurm_cluster, tritonserver, tiny_gpt2) -> Iterator[dict]:
    with _autoscaled(tmp_path, write_spec(tmp_path, NAME, tiny_gpt2), request.param) as found:
        yield found


def _record(workdir) -> AutoscaleRecord | None:
    for folder in sorted(workdir.glob(f"{NAME}-*")):
        record = AutoscaleRecord.read(Deployment(folder).autoscale)
        if record is not None:
            return record
    return None


def _serving_states(workdir) -> dict[str, str]:
    """{job id: state} of the deployment's serving jobs (the gateway's and build jobs left out)."""
    found = {}
    for folder in sorted(workdir.glob(f"{NAME}-*/jobs/*")):
        if not (folder / GATEWAY_JOB_MARKER_NAME).exists():
            state = status(folder.name).get("state")
            if state:
                found[folder.name] = state
    return found


def _ended(state: str) -> bool:
    return state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


@pytest.mark.parametrize("deployment", [STEP], indirect=True)
def test_a_load_step_grows_the_deployment_and_its_end_shrinks_it_by_drain(deployment):
    out = cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200").stdout.splitlines()
    gateway_job = next(line.split()[1] for line in out if line.startswith("gateway"))
    wait_for(lambda: status(gateway_job).get("state") == "READY", 120, f"gateway job {gateway_job} to be READY")
    record = read_gateway(gateway_record(deployment["workdir"], NAME))
    assert record is not None
    client = openai.OpenAI(base_url=record.url + "/v1", api_key=cli("token", NAME).stdout.strip(), max_retries=0)
    served: list[int] = []  # one item per request served (list.append is atomic across threads)
    failures: list[str] = []
    stops = [threading.Event() for _ in range(4)]

    def load(i: int) -> None:
        while not stops[i].is_set():
            try:
                chunks = list(client.completions.create(model=NAME, prompt=f"Load {i}", max_tokens=32, stream=True))
                assert chunks
                served.append(i)
            except Exception as exc:  # noqa: BLE001 - every failure a client would see is counted
                failures.append(f"{type(exc).__name__}: {exc}")

    def drained() -> str | None:
        states = _serving_states(deployment["workdir"])
        done = [j for j, s in states.items() if _ended(s)]
        return done[0] if done and sum(s == "READY" for s in states.values()) == 1 else None

    workers = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    try:
        ready = lambda: [j for j, s in _serving_states(deployment["workdir"]).items() if s == "READY"]  # noqa: E731
        wait_for(lambda: len(ready()) == 2, 240, "a second serving job, submitted by the controller, READY")
        grown = _record(deployment["workdir"])
        assert grown is not None and [d.action for d in grown.decisions].count("submit") == 1, grown
        before = len(served)
        wait_for(lambda: failures or len(served) >= before + 5, 60, "requests served by the two jobs")
        for stop in stops[1:]:  # the step ends; one client goes on streaming through the scale-down
            stop.set()
        job = wait_for(drained, 180, "one job drained, one left serving")
        before = len(served)
        wait_for(lambda: failures or len(served) >= before + 3, 60, "requests served after the drain")
    finally:
        for stop in stops:
            stop.set()
        for worker in workers:
            worker.join(60)
    assert not failures, failures[:5]
    assert status(job)["state"] == "COMPLETED", _serving_states(deployment["workdir"])
    shrunk = _record(deployment["workdir"])
    assert shrunk is not None and [d.action for d in shrunk.decisions].count("drain") == 1, shrunk
    assert "autoscale decisions" in cli("status", NAME).stdout


@pytest.mark.parametrize("deployment", [ZERO], indirect=True)
def test_min_jobs_zero_goes_to_zero_when_idle_and_a_request_brings_a_job_back(deployment):
    """Idle: the one serving job drains (COMPLETED) and the gateway stays. A request then finds nothing serving:
    the gateway holds it (autoscale.hold_s) and the controller submits a job at once; once it is READY the held
    request is served, the first a client sees of the deployment's coming back."""
    out = cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200").stdout.splitlines()
    gateway_job = next(line.split()[1] for line in out if line.startswith("gateway"))
    first = next(iter(_serving_states(deployment["workdir"])))
    wait_for(lambda: _ended(status(first).get("state", "")), 120, f"the idle job {first} to drain")
    assert status(first)["state"] == "COMPLETED"
    assert status(gateway_job)["state"] == "READY", "the gateway keeps the address at zero"
    record = read_gateway(gateway_record(deployment["workdir"], NAME))
    assert record is not None
    token = cli("token", NAME).stdout.strip()
    client = openai.OpenAI(base_url=record.url + "/v1", api_key=token, max_retries=0, timeout=300)
    held = client.completions.create(model=NAME, prompt="Anyone there?", max_tokens=4)  # held, then served
    assert held.choices[0].text is not None
    decisions = _record(deployment["workdir"])
    assert decisions is not None
    acts = [(d.action, d.reason) for d in decisions.decisions if d.action != "hold"]
    assert [a for a, _ in acts] == ["drain", "submit"] and "wait with nothing serving" in acts[1][1], acts


#: one job, kept: a controller with nothing to do but look
STEADY = {"min_jobs": 1, "max_jobs": 1, "scale_down_after": "10s"}


@pytest.mark.parametrize("deployment", [STEADY], indirect=True)
def test_a_gateway_killed_outright_comes_back_with_its_controllers_record(deployment):
    """The gateway process dies (SIGKILL); its job starts it again (gateway.sub) and the new controller goes on from
    the record the old one left: the same decisions, and no second job for the one it already has."""
    cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200")
    first = read_gateway(gateway_record(deployment["workdir"], NAME))
    assert first is not None and first.job_id
    wait_for(lambda: _record(deployment["workdir"]), 60, "the controller's first decision")
    before = _record(deployment["workdir"])
    assert before is not None and before.controller == first.job_id
    os.kill(first.pid, signal.SIGKILL)  # one machine: the emulated node's processes are this machine's

    def restarted():
        record = read_gateway(gateway_record(deployment["workdir"], NAME))
        return record if record is not None and record.pid != first.pid else None

    wait_for(restarted, 120, "the gateway started again by its job")
    log = next(deployment["workdir"].glob(f"{NAME}-*/logs/{first.job_id}.err"))
    wait_for(lambda: log.read_text().count("autoscale: between 1 and 1 jobs") == 2, 60, "the second controller")
    scaled = Deployment(next(deployment["workdir"].glob(f"{NAME}-*"))).autoscale  # not the gateway record beside
    written = scaled.stat().st_mtime
    wait_for(lambda: scaled.stat().st_mtime > written, 60, "a look of the second controller")
    after = _record(deployment["workdir"])
    assert after is not None and after.decisions[: len(before.decisions)] == before.decisions
    assert [d.action for d in after.decisions] == ["hold"] * len(after.decisions), after
    assert len(_serving_states(deployment["workdir"])) == 1


@pytest.mark.parametrize("deployment", [STEP], indirect=True)
def test_a_cancel_in_the_middle_of_a_scale_up_stops_every_job_and_the_controller(deployment):
    """Under load, once the controller has submitted a second job (still on its way), `hpc-serve cancel` of the
    deployment ends every job, the one on its way included, and nothing is submitted after it."""
    out = cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200").stdout.splitlines()
    gateway_job = next(line.split()[1] for line in out if line.startswith("gateway"))
    record = read_gateway(gateway_record(deployment["workdir"], NAME))
    assert record is not None
    client = openai.OpenAI(base_url=record.url + "/v1", api_key=cli("token", NAME).stdout.strip(), max_retries=0)
    stop = threading.Event()

    def load(i: int) -> None:
        while not stop.is_set():
            try:
                list(client.completions.create(model=NAME, prompt=f"Load {i}", max_tokens=32, stream=True))
            except Exception:  # noqa: BLE001, S110 - the cancel ends requests; what is asserted is the jobs' end
                pass

    workers = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    try:

        def submitted() -> bool:
            scaled = _record(deployment["workdir"])
            return scaled is not None and any(d.action == "submit" for d in scaled.decisions)

        wait_for(submitted, 120, "the controller's submit")
        cli("cancel", NAME)
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    states = _serving_states(deployment["workdir"])
    assert len(states) == 2 and all(_ended(s) for s in states.values()), states
    assert _ended(status(gateway_job).get("state", "")), status(gateway_job)
    final = _record(deployment["workdir"])
    assert final is not None and [d.action for d in final.decisions].count("submit") == 1, final


class _Clients:
    """`count` openai clients streaming without pause through the gateway, each started and stopped on its own;
    every request served or failed is counted (list.append is atomic across threads)."""

    def __init__(self, url: str, token: str, count: int, max_tokens: int = 32, retries: int = 0) -> None:
        self.client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=retries, timeout=300)
        self.max_tokens = max_tokens
        self.served: list[int] = []
        self.failures: list[str] = []
        self.stops = [threading.Event() for _ in range(count)]
        self.threads = [threading.Thread(target=self._load, args=(i,)) for i in range(count)]

    def _load(self, i: int) -> None:
        while not self.stops[i].is_set():
            try:
                chunks = self.client.completions.create(
                    model=NAME, prompt=f"Load {i}", max_tokens=self.max_tokens, stream=True
                )
                assert list(chunks)
                self.served.append(i)
            except Exception as exc:  # noqa: BLE001 - every failure a client would see is counted
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self, keep: int = 0) -> None:
        """All but the first `keep` clients stop after the request they have under way."""
        for stop in self.stops[keep:]:
            stop.set()

    def more_served(self, count: int, timeout: float, what: str) -> None:
        before = len(self.served)
        wait_for(lambda: self.failures or len(self.served) >= before + count, timeout, what)
        assert not self.failures, self.failures[:5]

    def join(self) -> None:
        self.stop()
        for thread in self.threads:
            thread.join(120)


class _Looks:
    """Counts the controller's looks from now on: it writes its record at each (holds that say the same as the
    one before are not appended again, so the decisions' count does not tell)."""

    def __init__(self, workdir: Path) -> None:
        self.path = Deployment(next(workdir.glob(f"{NAME}-*"))).autoscale
        self.seen = self.path.stat().st_mtime_ns
        self.looks = 0

    def count(self) -> int:
        now = self.path.stat().st_mtime_ns
        if now != self.seen:
            self.seen, self.looks = now, self.looks + 1
        return self.looks


def _acts(workdir: Path) -> list[tuple[float, str, str]]:
    record = _record(workdir)
    return [(d.at, d.action, d.reason) for d in (record.decisions if record else ()) if d.action != "hold"]


#: the simulated engine at an H200's pace, 2 requests in flight per replica its target: 8 clients ask for 3 jobs,
#: 3 clients fit 2 of them (3 / 2 = 1.5, N/(N-1) 3, above the target: not 1), none fits 1 (min_jobs)
TRACE = {"min_jobs": 1, "max_jobs": 3, "target_outstanding": 2, "scale_up_after": "3s", "scale_down_after": "10s"}


def test_a_trace_on_the_simulated_engine_grows_to_max_jobs_and_back_to_min_jobs(tmp_path, slurm_cluster, tritonserver):
    """Step up (8 clients), plateau, drop (3 clients), idle: 1 → 2 → 3 jobs, one submit at a time (none while a
    job is on its way, each at least scale_up_after after the one before became READY), then 3 → 2 → 1 by
    drain, every drained job COMPLETED, and not one of the requests failed, those in flight through each drain
    included."""
    with _autoscaled(tmp_path, sim_spec(tmp_path, NAME), TRACE) as deployment:
        workdir = deployment["workdir"]
        out = cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200").stdout.splitlines()
        gateway_job = next(line.split()[1] for line in out if line.startswith("gateway"))
        wait_for(lambda: status(gateway_job).get("state") == "READY", 120, f"gateway job {gateway_job} to be READY")
        record = read_gateway(gateway_record(workdir, NAME))
        assert record is not None
        clients = _Clients(record.url, cli("token", NAME).stdout.strip(), 8, max_tokens=64)
        start = time.time()
        clients.start()
        try:
            ready = lambda: [j for j, s in _serving_states(workdir).items() if s == "READY"]  # noqa: E731
            wait_for(lambda: clients.failures or len(ready()) == 3, 300, "three serving jobs READY")
            assert not clients.failures, clients.failures[:5]
            clients.more_served(24, 120, "requests served by three jobs (the plateau)")
            clients.stop(keep=3)  # the drop
            wait_for(
                lambda: clients.failures or len(_serving_states(workdir)) == 3 and len(ready()) == 2,
                180,
                "one job drained, two left serving",
            )
            clients.more_served(6, 120, "requests served by two jobs after the drop")
            clients.stop()  # idle
            wait_for(
                lambda: len(ready()) == 1 and sum(map(_ended, _serving_states(workdir).values())) == 2,
                180,
                "a second job drained, one left serving",
            )
        finally:
            clients.join()
        assert not clients.failures, clients.failures[:5]
        states = _serving_states(workdir)
        assert sorted(states.values()) == ["COMPLETED", "COMPLETED", "READY"], states
        acts = _acts(workdir)
        assert [a for _, a, _ in acts] == ["submit", "submit", "drain", "drain"], acts
        (up1, _, _), (up2, _, why) = acts[:2]
        assert up2 - up1 >= 3 and "above the target 2" in why, acts
        print(f"\ntrace on max_jobs 3 ({len(clients.served)} requests served, none failed):")
        for at, action, reason in acts:
            print(f"  +{at - start:5.1f} s  {action:<7} {reason}")


#: a job on its way is waited for however long it pends; the load gone, it is the first to go
PENDING = {"min_jobs": 1, "max_jobs": 2, "target_outstanding": 1, "scale_up_after": "2s", "scale_down_after": "5s"}


def test_a_pending_job_is_capacity_on_the_way_and_the_first_to_go(tmp_path, slurm_cluster, tritonserver):
    """Each job takes a whole node's 4 GPUs, and a job of the test's holds node2's: the controller's second job
    pends (Resources). Under load it submits nothing more, however many scale_up_after pass, and says why in
    `status`; once the load is gone, the PENDING job is cancelled (by autoscale), the READY one untouched."""
    spec = sim_spec(tmp_path, NAME, extra_slurm={"gpus_per_node": 4})
    with _autoscaled(tmp_path, spec, PENDING) as deployment:
        workdir = deployment["workdir"]
        cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200")
        (first,) = _serving_states(workdir)
        node = subprocess.run(["squeue", "-h", "-j", first, "-o", "%N"], capture_output=True, text=True).stdout
        other = "node2" if node.strip() == "node1" else "node1"
        holder = hold_gpus(other)
        try:
            record = read_gateway(gateway_record(workdir, NAME))
            assert record is not None
            clients = _Clients(record.url, cli("token", NAME).stdout.strip(), 4)
            clients.start()
            try:

                def pending() -> str | None:
                    return next((j for j, s in _serving_states(workdir).items() if s == "PENDING"), None)

                waiting = wait_for(pending, 120, "the controller's second job, PENDING behind the GPU holder")
                looks = _Looks(workdir)
                wait_for(lambda: looks.count() >= 3, 60, "three looks more of the controller, each past scale_up_after")
                shown = cli("status", NAME).stdout
                assert f"capacity on the way: job {waiting} PENDING" in shown, shown
                clients.stop()
            finally:
                clients.join()
            assert not clients.failures, clients.failures[:5]
            wait_for(lambda: _ended(status(waiting).get("state", "")), 120, f"the PENDING job {waiting} to go")
            assert status(waiting)["state"] == "CANCELLED" and status(first)["state"] == "READY"
            acts = _acts(workdir)
            assert [a for _, a, _ in acts] == ["submit", "cancel"], acts
            assert "a surplus PENDING job" in acts[1][2], acts
        finally:
            subprocess.run(["scancel", holder], capture_output=True, check=False)


@pytest.mark.timelimit
def test_the_controller_goes_on_in_the_gateway_jobs_successor(tmp_path, slurm_cluster, tritonserver, tiny_gpt2):
    """The gateway job renews itself (a 3-minute job, its successor 2 minutes before the end) while a client sends
    requests: the successor takes the controller over from the record (its decisions kept, the controller named
    the successor), the predecessor ends COMPLETED, the deployment keeps its one serving job, no request fails."""
    spec = write_spec(tmp_path, NAME, tiny_gpt2, renew={"before": "2m"})
    with _autoscaled(tmp_path, spec, STEADY) as deployment:
        data = yaml.safe_load(spec.read_text())
        # a fixed port on node1: the successor listens on the predecessor's address (the renew test's setup)
        data["gateway"] |= {"time": "00:03:00", "port": free_port("0.0.0.0"), "nodelist": "node1"}
        spec.write_text(yaml.safe_dump(data))
        workdir = deployment["workdir"]
        out = cli("submit", str(spec), "--wait", "--timeout", "200").stdout.splitlines()
        first = next(line.split()[1] for line in out if line.startswith("gateway"))
        wait_for(lambda: status(first).get("state") == "READY", 120, f"gateway job {first} to be READY")
        wait_for(lambda: _record(workdir), 60, "the controller's first decision")
        before = _record(workdir)
        assert before is not None and before.controller == first
        record = read_gateway(gateway_record(workdir, NAME))
        assert record is not None
        # as the gateway renewal test's client: the openai package's own retry of a connection refused (a
        # connection the predecessor's closing socket had queued can be reset at the handover under load; open)
        clients = _Clients(record.url, cli("token", NAME).stdout.strip(), 1, max_tokens=8, retries=2)
        clients.start()
        try:

            def handed_over() -> str | None:
                current = read_gateway(gateway_record(workdir, NAME))
                return current.job_id if current is not None and current.job_id != first else None

            successor = wait_for(handed_over, 200, "the successor gateway job to publish its record")
            wait_for(lambda: (_record(workdir) or before).controller == successor, 60, "the successor's controller")
            wait_for(lambda: _ended(status(first).get("state", "")), 120, f"gateway job {first} to end")
            clients.more_served(3, 60, "requests through the successor alone")
        finally:
            clients.join()
        assert not clients.failures, clients.failures[:5]
        assert status(first)["state"] == "COMPLETED"
        after = _record(workdir)
        assert after is not None and after.decisions[: len(before.decisions)] == before.decisions, after
        assert [d.action for d in after.decisions] == ["hold"] * len(after.decisions), after
        assert len(_serving_states(workdir)) == 1


#: 4 GPUs a job (a whole node), 8 in the budget: two jobs, whoever submitted them
BUDGET = {
    "min_jobs": 1,
    "max_jobs": 3,
    "target_outstanding": 1,
    "scale_up_after": "2s",
    "scale_down_after": "10m",
    "gpu_budget": 8,
}


def test_the_budget_counts_a_job_submitted_by_hand_and_one_cancelled_by_hand_frees_it(
    tmp_path, slurm_cluster, tritonserver
):
    """A user submits the deployment's `.sub` by hand beside the controller's job: under load the controller wants
    a third job, but the budget (8 GPUs, 4 a job) holds it, and says so. The user then cancels their job by hand
    (scancel): its GPUs are free again and the controller submits one, which serves; no request fails, the streams
    that job carried going on on the other."""
    spec = sim_spec(tmp_path, NAME, extra_slurm={"gpus_per_node": 4})
    with _autoscaled(tmp_path, spec, BUDGET) as deployment:
        workdir = deployment["workdir"]
        cli("submit", str(deployment["spec"]), "--wait", "--timeout", "200")
        (first,) = _serving_states(workdir)
        script = next(workdir.glob(f"{NAME}-*/tensorrt_llm_triton.sub"))
        hand = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
        by_hand = hand.stdout.strip().split(";")[0]
        ready = lambda: [j for j, s in _serving_states(workdir).items() if s == "READY"]  # noqa: E731
        wait_for(lambda: sorted(ready()) == sorted([first, by_hand]), 120, f"the job submitted by hand {by_hand} READY")
        record = read_gateway(gateway_record(workdir, NAME))
        assert record is not None
        clients = _Clients(record.url, cli("token", NAME).stdout.strip(), 6)
        clients.start()
        try:

            def held_by_budget() -> bool:
                scaled = _record(workdir)
                return scaled is not None and any(
                    "the GPU budget 8 holds 8 in use" in d.reason for d in scaled.decisions
                )

            wait_for(held_by_budget, 60, "the controller held by the budget")
            assert not [a for _, a, _ in _acts(workdir)], _acts(workdir)
            subprocess.run(["scancel", by_hand], check=True)  # the user's own job, cancelled by hand
            wait_for(lambda: len(ready()) == 2 and by_hand not in ready(), 240, "a job of the controller's READY")
            clients.more_served(6, 60, "requests served by the controller's two jobs")
        finally:
            clients.join()
        assert not clients.failures, clients.failures[:5]
        assert [a for _, a, _ in _acts(workdir)] == ["submit"], _acts(workdir)
        assert status(by_hand)["state"] == "CANCELLED"
        # the streams the cancelled job carried went on on the other job (hpc/gateway/state.py Gateway.resumed)
        resumed = prometheus_samples(record.url).get(("hpc_serve_gateway_retries_total", (("reason", "resumed"),)))
        assert resumed, "no stream was under way on the job cancelled by hand"
