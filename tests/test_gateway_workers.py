"""A gateway of several worker processes (`hpc-serve gateway --workers N`, hpc/gateway/workers.py): the per-replica
counts shared between processes (hpc/serving/replica_counts.py), a request served by each worker on the one port,
the metrics summed over them, and no worker left behind, neither by a clean stop nor by a parent killed outright.
Relaying through workers, measured: benchmarks/bench_relay.py `--gateway-workers`."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from hpc.serving.balancer import Balancer, Replica
from hpc.serving.replica_counts import LocalCounts, SharedCounts
from launcher.contracts.layout import gateway_record
from launcher.contracts.records import read_gateway
from tests.e2e import CLI, wait_for
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


def test_shared_counts_of_a_replica_gone_give_their_slot_when_the_table_is_full():
    counts = SharedCounts(slots=2)
    a, b, c = (Replica(key=k, http_url="", grpc_url="") for k in ("a", "b", "c"))
    counts.add(a, outstanding=1, served=3)
    counts.add(b, served=1)
    counts.add(c, outstanding=1)  # b has nothing in flight: its slot is c's now, from zero
    counts.load([a, b, c])
    assert (a.outstanding, a.served, c.outstanding, c.served) == (1, 3, 1, 0)
    assert (b.outstanding, b.served) == (0, 0), "b's counts were given up with its slot"


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


def _start(tmp_path: Path, tiny_gpt2: Path) -> tuple[subprocess.Popen, str]:
    """`hpc-serve gateway --workers 2` of a deployment with no replica yet, once its record is published: (the
    process, its URL)."""
    spec = tmp_path / "svc.yaml"
    spec.write_text(spec_text("svc", tiny_gpt2, tmp_path / "runs", auth="none"))
    (tmp_path / "runs").mkdir()
    log = tmp_path / "gw.log"
    command = [*CLI, "gateway", str(spec), "--port", "auto", "--refresh", "1", "--workers", "2"]
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def published():
        assert proc.poll() is None, log.read_text()
        found = read_gateway(gateway_record(tmp_path / "runs", "svc"))
        return found if found is not None and found.pid == proc.pid else None

    return proc, wait_for(published, 90, "the gateway's address record").url


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
