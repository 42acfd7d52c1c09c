"""A gateway of several worker processes (`hpc-serve gateway --workers N`, hpc/gateway/workers.py): the per-replica
counts and the totals the autoscaling controller reads shared between processes (hpc/serving/replica_counts.py), a
request served by each worker on the one port, the metrics summed over them, a stop that withdraws the record and
refuses new connections while the requests in flight finish, and no worker nor folder left behind, neither by a
clean stop, a stop while starting, nor a parent killed outright. Relaying through workers, measured:
benchmarks/bench_relay.py `--gateway-workers`."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from hpc.gateway.metrics import MULTIPROC_DIR_VAR, Metrics
from hpc.jobs.autoscale import balancer_load
from hpc.jobs.executors import job_environment
from hpc.serving.balancer import Balancer, NoReplica, Replica
from hpc.serving.replica_counts import LocalCounts, SharedCounts
from launcher.contracts.autoscale import Action, AutoscaleRecord
from launcher.contracts.layout import Deployment, gateway_record
from launcher.contracts.records import read_gateway
from tests.e2e import CLI, cli, wait_for
from tests.test_gateway_deploy import spec_text


def _replicas() -> list[Replica]:
    return [Replica(key=f"job/{i}", http_url=f"http://r{i}", grpc_url=f"r{i}") for i in range(2)]


def test_a_request_in_flight_in_one_process_steers_the_others_pick():
    """Two balancers in two processes on one SharedCounts: while a request of the child's holds replica 0, the
    parent's least-outstanding pick is replica 1; once it ended, both see it served."""
    counts = SharedCounts()
    context = multiprocessing.get_context("fork")
    holding, release = context.Event(), context.Event()

    def child() -> None:
        balancer = Balancer(counts=counts)
        replicas = _replicas()
        balancer.update(replicas)
        with balancer.track(replicas[0]):
            holding.set()
            release.wait(60)

    proc = context.Process(target=child)
    proc.start()
    try:
        assert holding.wait(60), "the child never held its request"
        balancer = Balancer(counts=counts)
        balancer.update(_replicas())
        assert balancer.pick().key == "job/1"
        assert [r.outstanding for r in balancer.replicas] == [1, 0]
    finally:
        release.set()
        proc.join(60)
    assert proc.exitcode == 0
    balancer.counts.load(balancer.replicas)
    assert [(r.outstanding, r.served) for r in balancer.replicas] == [(0, 1), (0, 0)]


def _in_a_child(work) -> None:
    """Run `work()` in a forked process (another worker of the gateway), to its end."""
    proc = multiprocessing.get_context("fork").Process(target=work)
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0


def test_the_controller_in_one_worker_reads_every_workers_held_requests_and_first_tokens():
    """Worker 0 runs the controller: a request another worker found nothing serving for, and its times to first
    token, reach its load (hpc/jobs/autoscale.py `balancer_load`) as its own do."""
    counts = SharedCounts()
    mine = Balancer(counts=counts)
    load = balancer_load(mine)

    def other_worker() -> None:
        balancer = Balancer(counts=counts)  # no replica: nothing serving
        with pytest.raises(NoReplica):
            balancer.pick()
        metrics = Metrics(lambda: balancer)
        metrics.first_token("/v1/completions", 0.5)
        metrics.first_token("/v1/chat/completions", 2.5)

    _in_a_child(other_worker)
    mine.nothing_serving()
    Metrics(lambda: mine).first_token("/v1/completions", 3.0)
    seen = load()
    assert (seen.held, seen.ttft_s) == (2, pytest.approx(2.0))
    again = load()
    assert (again.held, again.ttft_s) == (0, None), "each look counts what came since the last"


def test_one_process_keeps_its_totals_on_its_own():
    balancer = Balancer()
    load = balancer_load(balancer)
    balancer.nothing_serving()
    Metrics(lambda: balancer).first_token("/v1/completions", 0.25)
    seen = load()
    assert (seen.held, seen.ttft_s) == (1, 0.25)


def test_a_replica_warming_in_one_worker_takes_no_request_from_another():
    """Worker 0 alone warms a joining replica (hpc/serving/warmup.py): the others read its warming count."""
    counts = SharedCounts()
    warming = _replicas()[1]
    counts.add(warming, warming=1)  # worker 0's Warmer

    def other_worker() -> None:
        balancer = Balancer(counts=counts)
        balancer.update(_replicas())
        assert [r.key for r in balancer.takers()] == ["job/0"]
        assert all(balancer.pick().key == "job/0" for _ in range(3))

    _in_a_child(other_worker)
    counts.add(warming, warming=-1)
    balancer = Balancer(counts=counts)
    balancer.update(_replicas())
    assert [r.key for r in balancer.takers()] == ["job/0", "job/1"]


def test_only_the_app_asked_to_warms_joining_replicas(tmp_path, tiny_gpt2):
    """Worker 0's app warms (hpc/gateway/serve.py passes `warm_up` to it alone): a joining replica is sent the hot
    prefixes once, not once per worker."""
    from fastapi.testclient import TestClient

    from hpc.gateway.app import create_app
    from hpc.serving.deployment import Target

    for warm_up in (True, False):
        app = create_app(Target(tmp_path / "runs", "nothing", tiny_gpt2), routing="cache", warm_up=warm_up)
        with TestClient(app):
            assert (app.state.warmer is not None) == warm_up


def test_a_workers_metrics_folder_is_no_job_of_its_controller(monkeypatch):
    """Worker 0's controller submits jobs (sbatch --export=ALL): the workers' metrics folder is theirs alone."""
    monkeypatch.setenv(MULTIPROC_DIR_VAR, "/nonexistent/metrics")
    monkeypatch.setenv("HPC_SERVE_TEST_KEPT", "1")
    env = job_environment()
    assert MULTIPROC_DIR_VAR not in env and env["HPC_SERVE_TEST_KEPT"] == "1"


def test_shared_counts_of_a_replica_gone_give_their_slot_when_the_table_is_full():
    counts = SharedCounts(slots=2)
    a, b, c = (Replica(key=k, http_url="", grpc_url="") for k in ("a", "b", "c"))
    counts.add(a, outstanding=1, served=3)
    counts.add(b, served=1)
    counts.add(c, outstanding=1)  # b has nothing in flight: its slot is c's now, from zero
    counts.load([a, b, c])
    assert (a.outstanding, a.served, c.outstanding, c.served) == (1, 3, 1, 0)
    assert (b.outstanding, b.served) == (0, 0), "b's counts were given up with its slot"


def test_a_replica_warming_keeps_its_slot_and_no_count_goes_below_zero():
    """A table full of replicas with nothing in flight, one of them being warmed: a new replica takes another's
    slot, never the warming one's (its warm-up's end would leave it warming for good)."""
    counts = SharedCounts(slots=2)
    warm, idle, new = (Replica(key=k, http_url="", grpc_url="") for k in ("warm", "idle", "new"))
    counts.add(warm, warming=1)
    counts.add(idle, served=1)
    counts.add(new, outstanding=1)
    counts.add(warm, warming=-1)
    counts.load([warm, idle, new])
    assert (warm.warming, new.outstanding, idle.served) == (0, 1, 0)
    counts.add(idle, outstanding=-1)  # its slot went to `new` from zero: what it had in flight is not new's
    assert idle.outstanding == 0


def test_local_counts_are_the_replicas_own():
    replica = _replicas()[0]
    LocalCounts().add(replica, outstanding=2, kv_reused_blocks=5)
    assert (replica.outstanding, replica.kv_reused_blocks) == (2, 5)


def _workers_of(parent: int) -> set[int]:
    """The pids of `parent`'s live children (Linux /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and fields[0] != "Z":
                found.add(int(entry))
    return found


def _start(
    tmp_path: Path, tiny_gpt2: Path, workers: int = 2, env: dict[str, str] | None = None, **extra
) -> tuple[subprocess.Popen, str]:
    """`hpc-serve gateway --workers N` of a deployment with no replica yet (`extra`: the spec's other sections),
    once its record is published: (the process, its URL)."""
    proc = _launch(tmp_path, tiny_gpt2, workers, env, **extra)
    log = tmp_path / "gw.log"

    def published():
        assert proc.poll() is None, log.read_text()
        found = read_gateway(gateway_record(tmp_path / "runs", "svc"))
        return found if found is not None and found.pid == proc.pid else None

    return proc, wait_for(published, 90, "the gateway's address record").url


def _launch(tmp_path: Path, tiny_gpt2: Path, workers: int, env: dict[str, str] | None = None, **extra):
    spec = tmp_path / "svc.yaml"
    spec.write_text(spec_text("svc", tiny_gpt2, tmp_path / "runs", auth="none", **extra))
    (tmp_path / "runs").mkdir()
    command = [*CLI, "gateway", str(spec), "--port", "auto", "--refresh", "1", "--workers", str(workers)]
    log = (tmp_path / "gw.log").open("w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def _health_of_each_worker(url: str) -> dict[int, dict]:
    """`/gateway/health` on a new connection each time until both workers answered (each request is one more
    chance for either: the kernel hands each connection to one of the processes accepting)."""
    seen: dict[int, dict] = {}
    for _ in range(400):
        body = httpx.get(url + "/gateway/health", timeout=10, headers={"connection": "close"}).json()
        seen[body["worker"]] = body
        if len(seen) == 2:
            return seen
    raise AssertionError(f"400 connections, answered only by workers {sorted(seen)}")


def _health_requests(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    prefix = 'hpc_serve_gateway_requests_total{route="/gateway/health",status="200"} '
    return float(next(line for line in text.splitlines() if line.startswith(prefix)).split()[-1])


@pytest.mark.slow
def test_workers_serve_one_port_count_together_and_stop_with_the_gateway(hpc_home, tmp_path, tiny_gpt2):
    proc, url = _start(tmp_path, tiny_gpt2)
    try:
        workers = _workers_of(proc.pid)
        assert len(workers) == 2, workers
        seen = _health_of_each_worker(url)
        assert {b["pid"] for b in seen.values()} == {proc.pid}, "each names the gateway's pid, its record's"
        # every worker's requests in the page any worker answers: these, and the one per connection before
        counted = _health_requests(url)
        for _ in range(10):
            httpx.get(url + "/gateway/health", timeout=10, headers={"connection": "close"})
        # counted as each answer's last byte went out: waited for, not read once
        wait_for(lambda: _health_requests(url) == counted + 10, 30, "ten more requests counted", interval=0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not gateway_record(tmp_path / "runs", "svc").exists(), "a clean stop removes the record"
        assert not {pid for pid in workers if Path(f"/proc/{pid}").exists()}, "the workers ended before it"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_gateway_killed_outright_leaves_no_worker(hpc_home, tmp_path, tiny_gpt2):
    proc, url = _start(tmp_path, tiny_gpt2)
    workers = _workers_of(proc.pid)
    assert len(workers) == 2, workers
    proc.kill()
    proc.wait(30)
    wait_for(lambda: not {pid for pid in workers if _alive(pid)}, 60, "the workers' end after their parent's")


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, which init reaps, has ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


@pytest.mark.slow
def test_a_worker_killed_ends_the_gateway_with_its_signal_for_its_job_to_start_again(hpc_home, tmp_path, tiny_gpt2):
    """As one gateway process killed so would (gateway.sub starts again a gateway that died of a signal it was
    not sent): the other worker stopped, the record withdrawn, the parent ended by the same signal."""
    proc, _ = _start(tmp_path, tiny_gpt2)
    try:
        first, second = sorted(_workers_of(proc.pid))
        os.kill(first, signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
        assert not _alive(second), "the other worker stopped before the gateway ended"
        assert not gateway_record(tmp_path / "runs", "svc").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_gateway_started_by_hand_holds_no_request_for_a_controller_it_does_not_run(
    hpc_home, tmp_path, tiny_gpt2, workers
):
    """`autoscale:` holds a request that finds nothing serving while the controller starts a job; a gateway started
    by hand runs no controller (only a gateway job does), so nothing would come: 503 at once, no Retry-After."""
    autoscale = {"min_jobs": 0, "max_jobs": 1, "hold_s": 30}
    proc, url = _start(tmp_path, tiny_gpt2, workers, autoscale=autoscale, gateway={})
    try:
        body = {"model": "svc", "prompt": "hi", "max_tokens": 1}
        answer = httpx.post(url + "/v1/completions", json=body, timeout=300)
        assert answer.status_code == 503 and "retry-after" not in answer.headers, answer.text
        assert "on its way" not in answer.text, answer.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _port(url: str) -> int:
    return httpx.URL(url).port or 80


@pytest.mark.slow
def test_a_stopping_gateway_withdraws_its_record_and_refuses_connections_while_its_requests_finish(
    hpc_home, tmp_path, tiny_gpt2
):
    """SIGTERM: the record goes first and new connections are refused at once (the parent holds no copy of the
    socket that would take them unanswered), while a request in flight still gets its answer."""
    proc, url = _start(tmp_path, tiny_gpt2)
    port = _port(url)
    body = json.dumps({"model": "svc", "prompt": "hi", "max_tokens": 1}).encode()
    try:
        # a request in flight: its head sent, its body awaited (uvicorn's "100 Continue" says the app reads it)
        held = socket.create_connection(("127.0.0.1", port), timeout=60)
        held.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        assert held.recv(64).startswith(b"HTTP/1.1 100"), "the app awaits the body"
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: not gateway_record(tmp_path / "runs", "svc").exists(), 30, "the record withdrawn")
        wait_for(lambda: _refused(port), 30, "new connections refused")
        held.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = held.recv(4096)
            assert chunk, f"the connection closed unanswered after {answer!r}"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 503"), answer  # no replica: answered, as any request in flight is
        held.close()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.slow
def test_a_gateway_stopped_while_its_workers_start_leaves_no_metrics_folder(hpc_home, tmp_path, tiny_gpt2):
    """The workers' start blocks on a tokenizer file that never comes (a FIFO no one writes): SIGTERM then stops
    them (killed after the stop's wait) and the gateway removes its metrics folder, as after a start."""
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(tiny_gpt2, tokenizer)
    (tokenizer / "generation_config.json").unlink(missing_ok=True)
    os.mkfifo(tokenizer / "generation_config.json")
    temp = tmp_path / "temp"
    temp.mkdir()
    model = {"backend": "cpu", "workflow": "engine", "checkpoint_dir": str(tiny_gpt2), "tokenizer_dir": str(tokenizer)}
    proc = _launch(tmp_path, tiny_gpt2, 2, env={"TMPDIR": str(temp)}, model=model)
    try:
        wait_for(
            lambda: (
                _running(proc, tmp_path)
                and len(_workers_of(proc.pid)) == 2
                and list(temp.glob("hpc-serve-gateway-metrics-*"))
            ),
            60,
            "the workers forked",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "gw.log").read_text()
        assert not list(temp.glob("hpc-serve-gateway-metrics-*"))
        assert not gateway_record(tmp_path / "runs", "svc").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def _running(proc: subprocess.Popen, tmp_path: Path) -> bool:
    assert proc.poll() is None, (tmp_path / "gw.log").read_text()
    return True


@pytest.mark.slow
def test_the_controller_of_a_gateway_of_two_workers_counts_the_requests_each_held(hpc_home, tmp_path, tiny_gpt2):
    """A gateway run as its job runs it (`--job-id`, `--renew-from`: worker 0 runs the controller, an advisory
    one here), at zero: requests on connections of their own, which the kernel spreads over both workers, are
    each held and counted once in the controller's decisions (the submits it would make, their signal the
    requests that waited with nothing serving), not only worker 0's."""
    autoscale = {"min_jobs": 0, "max_jobs": 1, "hold_s": 1, "advisory": True}
    spec = tmp_path / "svc.yaml"
    spec.write_text(spec_text("svc", tiny_gpt2, tmp_path / "runs", auth="none", gateway={}, autoscale=autoscale))
    folder = tmp_path / "runs" / "svc-gateway"
    cli("render", str(spec), "-o", str(folder))
    command = [*CLI, "gateway", str(spec), "--port", "auto", "--refresh", "1", "--workers", "2"]
    command += ["--job-id", "4242", "--renew-from", str(folder)]
    log = tmp_path / "gw.log"
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:

        def published():
            assert proc.poll() is None, log.read_text()
            return read_gateway(gateway_record(tmp_path / "runs", "svc"))

        url = wait_for(published, 90, "the gateway's address record").url
        body = {"model": "svc", "prompt": "hi", "max_tokens": 1}
        sent = 12

        def ask(_: int) -> int:
            headers = {"connection": "close"}
            return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60).status_code

        with ThreadPoolExecutor(sent) as pool:
            assert list(pool.map(ask, range(sent))) == [503] * sent

        def counted() -> float:
            record = AutoscaleRecord.read(Deployment(folder).autoscale)
            rows = record.decisions if record is not None else ()
            waited = [r for r in rows if r.action == Action.SUBMIT and "nothing serving" in r.reason]
            return sum(r.signal for r in waited)

        wait_for(lambda: counted() >= sent, 60, f"the controller's submits for {sent} held requests")
        assert counted() == sent, log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
