"""replica_policy restart on the real Slurm test cluster (DEVELOPERS.md "Replica restarts").

A job of 2 replicas × tp 2 on the llmapi workflow (replica 0 on node1, replica 1 on node2) serves a steady stream
of requests through a gateway while one process of replica 1 after another is SIGKILLed: its tritonserver, its
`tensorrt_llm` python stub, its TensorRT-LLM leader node and its worker node. Each time the replica comes back
READY inside the same job, with fresh ports and an endpoint record that counts its restarts; `status` tells the
story; no request fails. A replica of tp 2 across node1/node2 (engine workflow) comes back after its follower's
tritonserver is killed. A checkpoint the engine cannot load is a crash loop: the job ends FAILED after the bound,
every run's cause kept.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from launcher.contracts.layout import JobPaths
from launcher.contracts.rank import STEP_REPLICA_ENV
from launcher.contracts.records import GAVE_UP, read_ended_run
from tests.e2e import (
    CLI,
    cli,
    free_port,
    gateway_ready,
    private_job_index,
    processes_under,
    status,
    stop_process,
    submit,
    wait_for,
    write_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]

#: a restart every kill: more than the kills, and the first back-off short (the doubling still applies)
RESTART = {"max_restarts": 10, "backoff": "1s", "max_backoff": "2s"}


def _spec(folder: Path, name: str, checkpoint: Path, *, replicas: int, nodes: int, per_node: int, **kw) -> Path:
    path = write_spec(folder, name, checkpoint, tp=2, nodes=nodes, ntasks_per_node=per_node, auth="none", **kw)
    data = yaml.safe_load(path.read_text())
    data.update(replicas=replicas, replica_policy="restart", restart=RESTART)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("restart")
    with private_job_index(path):
        yield path


@pytest.fixture(scope="module")
def llmapi_job(slurm_cluster, tritonserver, tiny_gpt2, folder) -> Iterator[dict]:
    """2 replicas × tp 2, llmapi, restart; a gateway (the CLI's) in front of it."""
    spec = _spec(folder, "rs", tiny_gpt2, replicas=2, nodes=2, per_node=2, workflow="llmapi")
    job, job_dir = submit(spec)
    port, log = free_port(), folder / "gateway.log"
    proc = subprocess.Popen(
        [*CLI, "gateway", job, "--port", str(port), "--refresh", "1"], stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: proc.poll() is None and gateway_ready(url), 60, "the gateway to find the replicas")
        yield {"job": job, "dir": job_dir, "deploy": job_dir.parent.parent, "url": url, "log": log}
    finally:
        stop_process(proc)
        subprocess.run(["scancel", job], capture_output=True)


class Stream:
    """Clients that send completions through the gateway one after another until stopped; every answer kept."""

    def __init__(self, url: str, clients: int = 3) -> None:
        self.url, self.served, self.failures, self.stream_errors = url, 0, [], []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        self._threads.append(threading.Thread(target=self._streamer, daemon=True))

    def _streamer(self) -> None:
        """Streamed completions: one in flight when its replica dies goes on on the other replica (an error event,
        never a hang, if it could not)."""
        body = {"model": "rs", "prompt": "Once upon a time", "max_tokens": 8, "stream": True}
        with httpx.Client(base_url=self.url, timeout=120) as http:
            while not self._stop.is_set():
                with http.stream("POST", "/v1/completions", json=body) as answer:
                    events = [line for line in answer.iter_lines() if line.startswith("data: ")]
                if answer.status_code == 200 and events and events[-1] == "data: [DONE]":
                    self.served += 1
                elif answer.status_code == 200 and any('"error"' in event for event in events):
                    self.stream_errors.append(events[-1][:300])
                else:
                    answer.read()
                    self.failures.append(f"{answer.status_code} stream {answer.text[:300]} {events[-1:]}")

    def _client(self) -> None:
        body = {"model": "rs", "prompt": "Once upon a time", "max_tokens": 4}
        with httpx.Client(base_url=self.url, timeout=120) as http:
            while not self._stop.is_set():
                try:
                    answer = http.post("/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                if answer.status_code == 200 and answer.json()["choices"][0]["text"] is not None:
                    self.served += 1
                else:
                    self.failures.append(f"{answer.status_code} {answer.text[:300]}")

    def __enter__(self) -> Stream:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(180)


def _job_processes(job: str, replica: int) -> list[tuple[int, str]]:
    """Every process of one replica of a job, its command line: the step's environment names both (the leader and
    worker nodes' command lines name no folder of the job; tritonserver's environment has no SLURM_JOB_ID)."""
    replica_mark, job_marks = f"{STEP_REPLICA_ENV}={replica}".encode(), (f"={job}".encode(), f"/jobs/{job}/".encode())
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit():
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
            if replica_mark in env and any(
                m in v for v in env for m in job_marks if v.split(b"=")[0].endswith((b"JOB_ID", b"STOP_FILE"))
            ):
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except OSError:
            continue
    return found


def _victim(job: str, replica: int, what: Callable[[str], bool]) -> int:
    found = [pid for pid, cmd in _job_processes(job, replica) if what(cmd)]
    assert len(found) == 1, "\n".join(f"{pid} {cmd[:200]}" for pid, cmd in _job_processes(job, replica))
    return found[0]


KILLS: dict[str, Callable[[str], bool]] = {
    "tritonserver": lambda cmd: "/bin/tritonserver " in cmd,
    "stub": lambda cmd: "triton_python_backend_stub" in cmd and "/tensorrt_llm/1/model.py" in cmd,
    "leader node": lambda cmd: "mgmn_leader_node" in cmd,
    "worker node": lambda cmd: "mgmn_worker_node" in cmd,
}


def _replica(shown: dict, replica: int) -> dict | None:
    return next((e for e in shown.get("endpoints", []) if e["replica"] == replica), None)


def test_each_process_of_a_replica_killed_under_load_is_restarted_inside_the_job(llmapi_job):
    """No request fails, whichever process dies: the gateway retries what had no first byte, and a request the
    model failed before its first byte (an engine whose leader or worker node died fails what its model takes
    until the launcher ends the replica) once more on the other replica. A stream already under way goes on on
    the other replica (hpc/gateway/state.py Gateway.resumed): not one ends with an error event."""
    job = llmapi_job["job"]
    first = _replica(status(job), 1)
    assert first is not None and first["restarts"] == 0
    ports, failed = {first["http_port"]}, {}
    with Stream(llmapi_job["url"]) as stream:
        wait_for(lambda: stream.served >= 6 or stream.failures, 60, "answers through the gateway")
        for n, (name, what) in enumerate(KILLS.items(), start=1):
            before = len(stream.failures)
            os.kill(_victim(job, 1, what), signal.SIGKILL)
            back = wait_for(
                lambda n=n: (e := _replica(status(job), 1)) is not None and e["restarts"] == n and e,
                240,
                f"replica 1 READY again after its {name} was killed (restart {n})",
            )
            ports.add(back["http_port"])
            shown = status(job)
            assert shown["state"] == "READY" and str(job) == shown["job_id"]
            assert shown["replica_restarts"]["1"]["restarts"] == n and shown["restart_causes"]["1"]["rank"] in (2, 3)
            served = stream.served
            wait_for(lambda s=served: stream.served >= s + 6, 60, "answers after the restart")
            failed[name] = stream.failures[before:]
    print(
        {name: len(f) for name, f in failed.items()},
        "failed of",
        stream.served + len(stream.failures),
        f"; {len(stream.stream_errors)} streams ended with an error event",
    )
    assert all(f == [] for f in failed.values()), failed
    assert not stream.stream_errors, stream.stream_errors
    assert len(ports) > 1, "a restarted replica gets fresh ports"
    metrics = httpx.get(llmapi_job["url"] + "/metrics", timeout=10).text
    counted = re.search(rf'hpc_serve_gateway_replica_restarts{{replica="{job}(@[^/"]*)?/1"}} (\S+)', metrics)
    assert counted is not None and float(counted.group(2)) == len(KILLS), "the gateway's metrics count the restarts"
    text = cli("status", job).stdout
    assert f"replica 1 READY (restarts: {len(KILLS)} of {RESTART['max_restarts']}; last: rank " in text, text
    assert _replica(status(job), 0)["restarts"] == 0, "the other replica served on, never restarted"
    paths = JobPaths.of_folder(llmapi_job["dir"])
    causes = [read_ended_run(paths, 1, n) for n in range(1, len(KILLS) + 1)]
    assert all(any(r.failed for r in run) for run in causes), "every ended run's records are kept"


@pytest.fixture(scope="module")
def broken_checkpoint(tiny_gpt2, folder) -> Path:
    """The tiny checkpoint with its weights cut to a few bytes: the engine fails to load it, every time."""
    broken = folder / "broken-ckpt"
    shutil.copytree(tiny_gpt2, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:16])
    return broken


def test_tp2_across_two_nodes_comes_back_after_its_follower_dies(slurm_cluster, tritonserver, tiny_gpt2, folder):
    spec = _spec(folder, "rs-across", tiny_gpt2, replicas=1, nodes=2, per_node=1)
    job, job_dir = submit(spec)
    try:
        follower = _victim(job, 0, lambda cmd: "/bin/tritonserver " in cmd and f"prefix1_{job}_" in cmd)
        os.kill(follower, signal.SIGKILL)
        wait_for(lambda: (e := _replica(status(job), 0)) is not None and e["restarts"] == 1, 240, "READY again")
        shown = status(job)
        assert shown["state"] == "READY" and shown["restart_causes"]["0"]["signal"] == "SIGKILL", shown
    finally:
        subprocess.run(["scancel", job], capture_output=True)


def _squeue(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True).stdout.strip()


def test_by_hand_tp1_engine_restarts_and_a_requeue_starts_the_count_afresh(
    slurm_cluster, tritonserver, tiny_gpt2, folder
):
    """`sbatch` of the rendered folder by hand (tp 1, engine workflow, 2 replicas on one node, requeue: true): a
    killed stub's replica comes back; `scontrol requeue` puts this run's restarts aside with its other records."""
    spec = _spec(folder, "rs-hand", tiny_gpt2, replicas=2, nodes=1, per_node=2)
    data = yaml.safe_load(spec.read_text())
    data["model"]["tp_size"], data["requeue"] = 1, True
    spec.write_text(yaml.safe_dump(data))
    deploy = folder / "by-hand"
    cli("render", str(spec), "-o", str(deploy))
    sbatch = ["sbatch", "--parsable", str(deploy / "tensorrt_llm_triton.sub")]
    job = subprocess.run(sbatch, capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        assert cli("wait", job, "--timeout", "180", timeout=240).returncode == 0
        stub = _victim(job, 0, lambda cmd: "triton_python_backend_stub" in cmd and "/tensorrt_llm/1/model.py" in cmd)
        os.kill(stub, signal.SIGKILL)
        wait_for(lambda: (e := _replica(status(job), 0)) is not None and e["restarts"] == 1, 240, "replica 0 back")
        assert status(job)["restart_causes"]["0"]["signal"] == "SIGKILL"
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
        wait_for(lambda: _squeue(job) == "PENDING BeginTime", 60, "the requeued job to be pending")
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, capture_output=True)
        shown = wait_for(lambda: (s := status(job)).get("state") == "READY" and s, 180, "READY after the requeue")
        assert shown["restarts"] == 1 and shown["replica_restarts"] == {}, shown
        assert all(e["restarts"] == 0 for e in shown["endpoints"])
        paths = JobPaths(deploy, job)
        assert (paths.previous_run(0) / "replica_restarts" / "replica-0.json").exists()
        cli("cancel", job, timeout=120)
        assert status(job)["state"] == "CANCELLED"
    finally:
        subprocess.run(["scancel", job], capture_output=True)


def test_a_crash_loop_ends_the_job_after_the_bound_with_every_cause(
    slurm_cluster, tritonserver, broken_checkpoint, folder
):
    spec = _spec(folder, "rs-loop", broken_checkpoint, replicas=1, nodes=1, per_node=2)
    data = yaml.safe_load(spec.read_text())
    data["restart"] = {"max_restarts": 2, "backoff": "1s"}
    spec.write_text(yaml.safe_dump(data))
    proc = cli("submit", str(spec), "--wait", "--timeout", "400", check=False, timeout=460)
    assert proc.returncode != 0, proc.stdout
    job = proc.stdout.split()[0]
    wait_for(lambda: status(job).get("state") == "FAILED", 120, "the job to end FAILED")
    shown = status(job)
    assert shown["replica_restarts"]["0"]["outcome"] == GAVE_UP and shown["replica_restarts"]["0"]["restarts"] == 2
    job_dir = Path(proc.stdout.split()[1])
    paths = JobPaths.of_folder(job_dir)
    assert all(any(r.failed for r in read_ended_run(paths, 0, n)) for n in (1, 2)), "the two restarted runs' causes"
    assert shown["failed_rank"] is not None, "and the last run's"
    assert not processes_under(job_dir.parent.parent)


def _crash_before_ready(job: str, job_dir: Path) -> None:
    """SIGABRT replica 0's tritonserver while its models load, as python_backend r24.10's stub health race aborts
    it at startup (boost::interprocess::lock_exception; docs/decisions.md "The start crash"): found as it
    appears, before any endpoint record."""
    server = wait_for(
        lambda: next((pid for pid, cmd in _job_processes(job, 0) if "/bin/tritonserver " in cmd), None),
        120,
        "replica 0's tritonserver to start",
        interval=0.05,
    )
    assert not JobPaths.of_folder(job_dir).endpoint(0).exists(), "the replica became READY before the crash"
    os.kill(server, signal.SIGABRT)


def test_a_start_crash_is_restarted_once_under_fail_job_and_a_second_fails_the_job(
    slurm_cluster, tritonserver, tiny_gpt2, folder
):
    """The default policy (fail-job): tritonserver (or a stub) aborting before its replica was ever READY is the
    python backend's start crash, not the job's fault; the replica starts again once and the job serves. A second
    start crash ends the job as fail-job does, both causes kept."""
    spec = write_spec(folder, "rs-crash", tiny_gpt2, tp=1, auth="none")
    proc = cli("submit", str(spec))
    job, job_dir = proc.stdout.split()[0], Path(proc.stdout.split()[1])
    try:
        _crash_before_ready(job, job_dir)
        shown = wait_for(lambda: (s := status(job)).get("state") in ("READY", "FAILED") and s, 240, "READY again")
        assert shown["state"] == "READY", cli("status", job).stdout
        assert shown["replica_restarts"]["0"]["restarts"] == 1 and shown["restart_causes"]["0"]["signal"] == "SIGABRT"
        assert "replica 0 READY (restarts: 1 of 1; last: rank 0 " in cli("status", job).stdout
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    proc = cli("submit", str(spec))
    job, job_dir = proc.stdout.split()[0], Path(proc.stdout.split()[1])
    try:
        _crash_before_ready(job, job_dir)
        wait_for(lambda: status(job).get("replica_restarts", {}).get("0"), 60, "the first restart")
        _crash_before_ready(job, job_dir)
        wait_for(lambda: status(job).get("state") == "FAILED", 120, "the job to fail")
        shown = status(job)
        assert shown["replica_restarts"]["0"]["outcome"] == GAVE_UP and shown["failed_rank"]["signal"] == "SIGABRT"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
