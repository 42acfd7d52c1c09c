"""Replicas, fail-fast and requeue on the real Slurm test cluster: 2 replicas × tp 2 across node1/node2, each
replica its own `srun --mpi=pmix` step (hpc/spec/placement.py), the CPU engine over MPI.

Fail-fast (launcher/node/watch.py, DEVELOPERS.md "Fail-fast"): a leader's tritonserver, a follower's tritonserver
and a leader's python stub are SIGKILLed, each in a job of its own (replica_policy fail-job): the job is FAILED
within FAIL_FAST_S naming the rank and the signal, its peer says it stopped for that rank (the watch acted, not
srun or Slurm), the dead replica's processes are gone within FAIL_FAST_S, and then no process and no /dev/shm
region of the job is left. keep-serving: the other replica answers on. requeue:
`scontrol requeue` withdraws the endpoints and the job serves again with new records, counting the restart.
The four jobs are started once for the module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from hpc.jobs.track import job_status
from hpc.scheduler.index import find_job
from launcher.contracts.layout import JobPaths
from launcher.contracts.rank import STEP_REPLICA_ENV
from tests.e2e import cli, private_job_index, processes_under, rank_records, status, submit, wait_for, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(300)]

#: the bound that is the feature: a dead rank ends its replica within seconds (docs/decisions.md "Fail-fast" measured
#: 0.15-0.4 s to FAILED, ~1 s until the replica is gone), where without the watches the survivors wait for Slurm's
#: KillWait (30 s on many clusters). 20 s: some 20 times what it takes, for a machine whose cores other processes
#: take, and still short of that KillWait; that the watch acted is shown by the peer's cause_rank, not the clock
FAIL_FAST_S = 20.0
KILLS = ("leader", "follower", "stub")


def _spec(folder: Path, name: str, checkpoint: Path, **top: object) -> Path:
    """2 replicas × tp 2 on 2 nodes of 2 ranks: replica 0 on node1, replica 1 on node2."""
    path = write_spec(folder, name, checkpoint, tp=2, nodes=2, ntasks_per_node=2, auth="none")
    data = yaml.safe_load(path.read_text())
    data.update(replicas=2, **top)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tritonserver, tiny_gpt2, tmp_path_factory):
    """name → (job id, deployment folder): one fail-job job per kill, one keep-serving job with requeue, all
    READY; scancel'ed at the end."""
    folder = tmp_path_factory.mktemp("replicas")
    with private_job_index(folder):
        specs = {kill: _spec(folder, f"ff-{kill}", tiny_gpt2) for kill in KILLS}
        specs["keep"] = _spec(folder, "keep", tiny_gpt2, replica_policy="keep-serving", requeue=True)
        started: dict[str, tuple[str, Path]] = {}
        try:
            for name, spec in specs.items():  # one at a time: 16 tritonservers starting at once starve 2 cores
                job, job_dir = submit(spec)
                started[name] = (job, job_dir.parent.parent)
            yield started
        finally:
            for job, _ in started.values():
                subprocess.run(["scancel", job], capture_output=True)


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def replica_processes(deploy_dir: Path, replica: int) -> list[tuple[int, str]]:
    """The launchers, tritonservers and stubs of one replica: its step's environment names it."""
    marker = f"{STEP_REPLICA_ENV}={replica}".encode()
    return [(pid, cmd) for pid, cmd in processes_under(deploy_dir) if marker in _environ(pid).split(b"\0")]


def shm_regions(job: str) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if f"_{job}_" in name]


def victim(deploy_dir: Path, job: str, kill: str) -> int:
    """The pid to SIGKILL: rank 0's tritonserver (leader), rank 1's (follower), or rank 0's tensorrt_llm stub."""
    found = []
    for pid, cmd in replica_processes(deploy_dir, 0):
        if kill == "stub":
            if "triton_python_backend_stub" in cmd and "/tensorrt_llm/1/model.py" in cmd and f"prefix0_{job}_" in cmd:
                found.append(pid)
        elif "tritonserver " in cmd and f"prefix-name={'prefix0' if kill == 'leader' else 'prefix1'}_{job}_" in cmd:
            found.append(pid)
    assert len(found) == 1, (kill, found)
    return found[0]


def _squeue(job: str) -> str:
    """Slurm's own word on the job: "STATE REASON" (while COMPLETING, a requeued job's start time is not set yet)."""
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True).stdout.strip()


def _timed(predicate, what: str, timeout: float = 60.0) -> float:
    """Seconds until `predicate` holds (polled every 50 ms)."""
    t0 = time.monotonic()
    wait_for(predicate, timeout, what, interval=0.05)
    return time.monotonic() - t0


@pytest.mark.parametrize("kill", KILLS)
def test_a_dead_rank_fails_the_job_fast_and_leaves_nothing(jobs, kill):
    job, deploy_dir = jobs[kill]
    ref = find_job(job)
    target = victim(deploy_dir, job, kill)
    t0 = time.monotonic()
    os.kill(target, signal.SIGKILL)
    to_failed = _timed(lambda: job_status(ref).state == "FAILED", "FAILED", FAIL_FAST_S + 30)
    replica_gone = _timed(lambda: not replica_processes(deploy_dir, 0), "replica 0's processes to end") + to_failed
    all_gone = _timed(lambda: not processes_under(deploy_dir) and not shm_regions(job), "the job to leave nothing", 120)
    all_gone += replica_gone
    print(
        f"\n{kill} SIGKILLed: FAILED after {to_failed:.2f} s, replica 0 gone after {replica_gone:.2f} s, "
        f"no process or /dev/shm region of the job after {all_gone:.2f} s (kill to check: {time.monotonic() - t0:.2f} s)"
    )
    assert to_failed <= FAIL_FAST_S and replica_gone <= FAIL_FAST_S
    cause = 1 if kill == "follower" else 0
    shown = cli("status", job, check=False)
    assert shown.returncode == 1 and f"rank {cause} on node1 exited with signal SIGKILL" in shown.stdout, shown.stdout
    if kill == "stub":
        assert "python backend stub of model 'tensorrt_llm'" in shown.stdout
    ranks = rank_records(JobPaths(deploy_dir, job).folder)
    assert ranks[1 - cause].cause_rank == cause, ranks  # its peer stopped with it, saying why
    assert ranks[2].exit_code == 0 and ranks[3].exit_code == 0, ranks  # fail-job: the other replica stopped in order


def test_keep_serving_the_other_replica_answers_and_status_shows_the_dead_one(jobs):
    job, deploy_dir = jobs["keep"]
    leader = [
        pid for pid, cmd in replica_processes(deploy_dir, 0) if "tritonserver " in cmd and "--load-model" not in cmd
    ]
    assert len(leader) == 1
    os.kill(leader[0], signal.SIGKILL)
    replica_gone = _timed(lambda: not replica_processes(deploy_dir, 0), "replica 0's processes to end")
    st = wait_for(lambda: (s := status(job)).get("dead_replicas") and s, 60, "the dead replica in status")
    print(f"\nkeep-serving: replica 0's processes gone {replica_gone:.2f} s after its leader was SIGKILLed")
    assert st["state"] == "READY" and list(st["dead_replicas"]) == ["0"], st
    assert st["dead_replicas"]["0"]["rank"] == 0 and st["dead_replicas"]["0"]["signal"] == "SIGKILL"
    assert [e["replica"] for e in st["endpoints"]] == [1]
    shown = cli("status", job).stdout
    assert "(1/2 replicas serving)" in shown and "replica 0 dead: rank 0 on node1 exited with signal SIGKILL" in shown
    for attempt in range(3):  # the survivor keeps answering
        assert cli("generate", job, f"still serving {attempt}", "--max-tokens", "4").stdout.strip()
    assert processes_under(deploy_dir) and replica_processes(deploy_dir, 1)
    assert not [name for name in shm_regions(job) if name.startswith(("prefix0_", "prefix1_"))]


def test_requeue_withdraws_the_endpoints_and_serves_again_counting_the_restart(jobs):
    """After the keep-serving test: both replicas come back, the dead one's records put aside with the rest."""
    job, deploy_dir = jobs["keep"]
    paths = JobPaths(deploy_dir, job)
    before = {e["replica"]: e for e in status(job)["endpoints"]}
    requeued_at = time.time()
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    withdrawn = _timed(lambda: not list(paths.endpoints_dir.glob("*.json")), "the endpoints to be withdrawn")
    wait_for(lambda: _squeue(job) == "PENDING BeginTime", 60, "the requeued job to be pending")
    # what a leader SIGKILLed with its launcher would leave: the restart must withdraw it before anything starts
    stale = paths.endpoint(0)
    stale.write_text(json.dumps({**before[1], "replica": 0, "pid": 1}))
    # Slurm holds a requeued job back for two minutes (BeginTime); let it start now
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, capture_output=True)
    st = wait_for(lambda: (s := status(job)).get("state") == "READY" and s, 120, "the restarted job to be READY")
    print(f"\nrequeue: endpoints withdrawn {withdrawn:.2f} s after `scontrol requeue`, READY again: {st['endpoints']}")
    assert st["restarts"] == 1 and not st["dead_replicas"], st
    assert sorted(e["replica"] for e in st["endpoints"]) == [0, 1]
    assert all(e["ready_at"] > requeued_at and e["pid"] != 1 for e in st["endpoints"]), st["endpoints"]
    assert "(restarts: 1)" in cli("status", job).stdout
    previous = paths.previous_run(0)
    assert json.loads((previous / "endpoints" / stale.name).read_text())["pid"] == 1
    assert json.loads((previous / "ranks" / "rank-0.json").read_text())["signal"] == "SIGKILL"
    assert not (paths.ranks_dir / "rank-0.json").exists()
    assert not paths.stop_request.exists(), "the requeue's stop request went with the last run's records"
    assert cli("generate", job, "after the restart", "--max-tokens", "4", "--replica", "0").stdout.strip()
