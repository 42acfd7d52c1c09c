"""hpc/jobs/track.py: the job state machine, from fake job folders (no scheduler), and the Slurm watcher's
sacct/squeue/scontrol parsing against the real test cluster (mark `cluster`; with fake commands:
tests/test_slurm.py).

A fake job is what the launcher and the schedulers leave behind (DEVELOPERS.md "The deployment folder"):
`D/launch.json`, `D/jobs/<id>/endpoints/replica-<k>.json`, `D/jobs/<id>/ranks/rank-<r>.json`, and for local jobs
`local.json`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpc.jobs import track
from hpc.jobs.executors import LocalExecutor, SlurmExecutor, executor_of
from hpc.jobs.kinds import KINDS, BuildJob, GatewayJob, ServingJob, job_class_of
from hpc.jobs.local_run import LocalState
from hpc.jobs.status import JobStatus
from hpc.jobs.track import job_status, wait
from hpc.scheduler.index import JobRef
from hpc.scheduler.watch import SlurmWatcher
from hpc.serving.deployment import Target
from launcher.contracts.build_records import BuildStep
from launcher.contracts.layout import BUILD_SUB_NAME, Deployment, JobPaths
from launcher.contracts.records import EndpointRecord, RankExitRecord, read_endpoints
from launcher.contracts.stop_records import BY_CANCEL, StopRequest
from tests.e2e import wait_for
from tests.plans import write_plan

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------------------------------------------------
# fake job folders


def make_job(tmp_path: Path, job_id: str = "4242", *, replicas: int = 1, world_per_replica: int = 2) -> JobRef:
    deploy = tmp_path / "deploy"
    write_plan(
        deploy, name="fake", replicas=replicas, world_size_per_replica=world_per_replica, tp_size=world_per_replica
    )
    return JobRef(job_id, JobPaths(deploy, job_id).create().folder)


def publish(ref: JobRef, replica: int, address: str = "10.1.2.3", http_port: int = 8000) -> EndpointRecord:
    record = {
        "version": 1,
        "job_id": ref.job_id,
        "replica": replica,
        "rank": replica * 2,
        "host": f"node{replica + 1}",
        "address": address,
        "http_port": http_port,
        "grpc_port": http_port + 1,
        "metrics_port": http_port + 2,
        "pid": 1,
        "started_at": 1.0,
        "ready_at": 2.0,
    }
    ref.paths.endpoint(replica).write_text(json.dumps(record))
    return EndpointRecord.from_dict(record)


def rank_exit(
    ref: JobRef,
    rank: int,
    exit_code: int | None,
    *,
    ended_at: float,
    signal: str | None = None,
    host: str | None = None,
    tail: list[str] | None = None,
) -> RankExitRecord:
    """A rank exit record as the launcher wrote it before records had a version (read as they still are)."""
    record = {
        "rank": rank,
        "host": host or f"node{rank + 1}",
        "exit_code": exit_code,
        "signal": signal,
        "log_tail": tail if tail is not None else [f"rank {rank} last line"],
        "ended_at": ended_at,
    }
    ref.paths.rank_record(rank).write_text(json.dumps(record))
    return RankExitRecord.from_dict(record)


@pytest.fixture
def scheduler(monkeypatch):
    """Set what 'Slurm' says about the job: `scheduler.set("PENDING", "Priority")`."""

    class Fake:
        raw, reason = "PENDING", None
        calls = 0

        def set(self, raw, reason=None):
            self.raw, self.reason = raw, reason

        def __call__(self, job_id, job_dir):
            self.calls += 1
            return self.raw, self.reason

    fake = Fake()
    set_slurm_state(monkeypatch, fake)
    return fake


def set_slurm_state(monkeypatch, answer) -> None:
    """What every Slurm job's executor reports: `answer(job_id, job_dir) -> (raw state, reason)`."""
    monkeypatch.setattr(SlurmExecutor, "scheduler_state", lambda self, ref: answer(ref.job_id, ref.job_dir))


# ---------------------------------------------------------------------------------------------------------
# Slurm jobs: scheduler state + job folder


def test_pending_carries_slurm_reason(tmp_path, scheduler):
    ref = make_job(tmp_path)
    scheduler.set("PENDING", "Resources")
    st = job_status(ref)
    assert (st.state, st.reason, st.scheduler_state) == ("PENDING", "Resources", "PENDING")
    assert st.summary() == "4242 PENDING (Resources)"
    assert not st.done and st.failed_rank is None and st.endpoints == []


def test_a_reason_that_never_starts_says_so_in_the_specs_words(tmp_path, scheduler):
    ref = make_job(tmp_path)
    scheduler.set("PENDING", "PartitionTimeLimit")
    assert job_status(ref).summary() == (
        "4242 PENDING (PartitionTimeLimit: slurm.time is past the partition's MaxTime: it never starts; cancel it, "
        "lower slurm.time)"
    )


@pytest.mark.parametrize("raw", ["CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED"])
def test_other_waiting_slurm_states_are_pending(tmp_path, scheduler, raw):
    ref = make_job(tmp_path)
    scheduler.set(raw, "BeginTime")
    st = job_status(ref)
    assert st.state == "PENDING" and st.scheduler_state == raw


def test_a_plan_without_its_shape_is_an_error_not_one_rank(tmp_path, scheduler):
    """A launch.json without world_size_per_replica is not read as "1 replica of 1 rank" (the launcher would take
    tp × pp): both refuse it, and `status` says which file and which key."""
    ref = make_job(tmp_path, replicas=2)
    launch = ref.paths.deployment.launch
    data = json.loads(launch.read_text())
    del data["world_size_per_replica"]
    launch.write_text(json.dumps(data))
    error = f"{launch}: world_size_per_replica is required"
    scheduler.set("RUNNING")
    st = job_status(ref)
    assert st.state == "FAILED" and st.reason is not None and st.reason.startswith(error), st.reason
    assert st.summary() == f"4242 FAILED ({st.reason})"
    scheduler.set("PENDING", "Resources")
    st = job_status(ref)
    assert st.state == "PENDING" and st.reason is not None and st.reason.startswith(f"Resources; {error}"), (
        "a pending job keeps its state and Slurm's reason, and says what will fail"
    )


def test_running_without_endpoint_is_starting(tmp_path, scheduler):
    ref = make_job(tmp_path, replicas=2)
    scheduler.set("RUNNING")
    st = job_status(ref)
    assert st.state == "STARTING" and st.replicas == 2
    assert st.summary() == "4242 STARTING (0/2 replicas ready)"
    publish(ref, 0)
    st = job_status(ref)
    assert st.state == "STARTING", "one of two replicas published is not READY"
    assert st.summary() == "4242 STARTING (1/2 replicas ready)"


def test_starting_says_what_each_replica_waits_for(tmp_path, scheduler):
    """The leaders' startup records (launcher/node/ready.py): loading, then warming up; a published replica's and a
    dead one's are not shown, and READY shows none."""
    from launcher.contracts.records import LOADING, WARMING_UP, StartupRecord, write_json_atomic

    ref = make_job(tmp_path, replicas=2)
    scheduler.set("RUNNING")
    now = time.time()
    for replica, phase, detail in ((0, WARMING_UP, "one token through ensemble"), (1, LOADING, "")):
        record = StartupRecord(job_id=ref.job_id, replica=replica, phase=phase, since=now - 3, detail=detail)
        write_json_atomic(ref.paths.starting(replica), record.to_dict())
    st = job_status(ref)
    assert st.summary() == (
        "4242 STARTING (0/2 replicas ready; replica 0: warming up (one token through ensemble) for 3 s; "
        "replica 1: loading the models for 3 s)"
    )
    assert [r["phase"] for r in st.to_json()["starting"]] == ["warming-up", "loading"]
    assert read_endpoints(ref.paths) == [], "a startup record is never taken for an endpoint"
    publish(ref, 0)
    assert job_status(ref).summary() == "4242 STARTING (1/2 replicas ready; replica 1: loading the models for 3 s)"
    publish(ref, 1)
    st = job_status(ref)
    assert st.state == "READY" and st.starting == []


def test_all_replicas_published_is_ready(tmp_path, scheduler):
    ref = make_job(tmp_path, replicas=2)
    scheduler.set("RUNNING")
    records = [publish(ref, 0, "10.0.0.5", 8000), publish(ref, 1, "10.0.0.6", 9000)]
    st = job_status(ref)
    assert st.state == "READY" and not st.done
    assert st.endpoints == records, "by replica"
    assert st.summary().startswith("4242 READY ")
    assert "http://10.0.0.5:8000" in st.summary() and "http://10.0.0.6:9000" in st.summary()


@pytest.mark.parametrize("raw", ["SIGNALING", "STAGE_OUT"])  # COMPLETING: see test_completing_job_is_stopping
def test_running_like_states_use_the_job_folder(tmp_path, scheduler, raw):
    ref = make_job(tmp_path)
    scheduler.set(raw)
    publish(ref, 0)
    assert job_status(ref).state == "READY"


def test_endpoint_ignored_unless_running(tmp_path, scheduler):
    """A leftover record of a job that is not running (yet/any more) is no endpoint."""
    ref = make_job(tmp_path)
    publish(ref, 0)
    scheduler.set("PENDING", "Priority")
    assert job_status(ref).endpoints == []
    scheduler.set("COMPLETED")
    st = job_status(ref)
    assert st.state == "COMPLETED" and st.endpoints == []


def test_running_with_failed_rank_is_failed_naming_the_earliest(tmp_path, scheduler):
    """Rank 1 died first; srun's --kill-on-bad-exit then took rank 0 (and 2) down: rank 1 is the cause,
    even though rank 0 has the lower number and a record written later."""
    ref = make_job(tmp_path, world_per_replica=4)
    scheduler.set("RUNNING")
    publish(ref, 0)
    rank_exit(ref, 3, 0, ended_at=90.0)  # a clean exit is never the cause
    cause = rank_exit(ref, 1, -9, signal="SIGKILL", ended_at=100.0, tail=["loading", "Killed"])
    rank_exit(ref, 0, 143, ended_at=100.5)
    rank_exit(ref, 2, -15, signal="SIGTERM", ended_at=101.0)
    st = job_status(ref)
    assert st.state == "FAILED" and st.done
    assert st.scheduler_state == "RUNNING", "FAILED at once, while Slurm still tears the step down"
    assert st.failed_rank == cause
    text = st.summary()
    assert text.splitlines()[0] == "4242 FAILED"
    assert "rank 1 on node2 exited with signal SIGKILL" in text and "| Killed" in text
    assert "rank 0" not in text


def test_completed_with_clean_ranks(tmp_path, scheduler):
    ref = make_job(tmp_path)
    scheduler.set("COMPLETED")
    rank_exit(ref, 0, 0, ended_at=1.0)
    rank_exit(ref, 1, 0, ended_at=2.0)
    st = job_status(ref)
    assert st.state == "COMPLETED" and st.done and st.failed_rank is None
    assert st.summary() == "4242 COMPLETED"


def test_completed_but_a_rank_failed_is_failed(tmp_path, scheduler):
    ref = make_job(tmp_path)
    scheduler.set("COMPLETED")
    rank_exit(ref, 0, 0, ended_at=1.0)
    cause = rank_exit(ref, 1, 2, ended_at=2.0, tail=["world size 3 does not match"])
    st = job_status(ref)
    assert st.state == "FAILED" and st.failed_rank == cause
    assert "rank 1 on node2 exited with exit code 2" in st.summary()


def test_slurm_failed_names_the_rank(tmp_path, scheduler):
    ref = make_job(tmp_path)
    scheduler.set("FAILED")
    cause = rank_exit(ref, 0, 124, ended_at=5.0, tail=["not ready after ready_timeout_s=900 s"])
    st = job_status(ref)
    assert st.state == "FAILED" and st.failed_rank == cause


@pytest.mark.parametrize(
    "raw,state",
    [
        ("CANCELLED", "CANCELLED"),
        ("PREEMPTED", "CANCELLED"),
        ("REVOKED", "CANCELLED"),
        ("TIMEOUT", "TIMEOUT"),
        ("DEADLINE", "TIMEOUT"),
        ("NODE_FAIL", "FAILED"),
        ("OUT_OF_MEMORY", "FAILED"),
        ("BOOT_FAIL", "FAILED"),
    ],
)
def test_end_states_map(tmp_path, scheduler, raw, state):
    ref = make_job(tmp_path)
    scheduler.set(raw)
    st = job_status(ref)
    assert st.state == state and st.done and st.scheduler_state == raw


@pytest.mark.parametrize("raw", ["CANCELLED", "TIMEOUT"])
def test_ranks_killed_by_scancel_or_time_limit_are_not_a_failure(tmp_path, scheduler, raw):
    ref = make_job(tmp_path)
    scheduler.set(raw)
    rank_exit(ref, 0, -15, signal="SIGTERM", ended_at=1.0)
    rank_exit(ref, 1, -9, signal="SIGKILL", ended_at=2.0)
    st = job_status(ref)
    assert st.state == raw and st.failed_rank is None
    assert "exited with" not in st.summary()


def test_cancel_marker_makes_a_stopped_job_cancelled(tmp_path, scheduler):
    """`hpc.jobs.track.cancel` writes the marker, then SIGTERMs every rank: ranks ending (cleanly or not) must not
    read as COMPLETED or FAILED once the job has ended."""

    ref = make_job(tmp_path)
    StopRequest(at=time.time(), by=BY_CANCEL).write(ref.cancel_marker)
    scheduler.set("COMPLETED")
    rank_exit(ref, 0, 0, ended_at=1.0)
    assert job_status(ref).state == "CANCELLED"
    rank_exit(ref, 1, 143, ended_at=2.0)
    scheduler.set("FAILED")
    st = job_status(ref)
    assert st.state == "CANCELLED" and st.failed_rank is None and st.done


@pytest.mark.parametrize("raw", ["RUNNING", "COMPLETING"])
def test_cancelled_job_whose_ranks_are_still_stopping_is_cancelling(tmp_path, scheduler, raw):
    """While the ordered stop runs (drain, release, MPI_Finalize) or Slurm still kills processes (COMPLETING),
    the job is neither READY nor already CANCELLED: no endpoint is offered, no rank is blamed, and `wait` goes
    on until no rank process is left."""

    ref = make_job(tmp_path)
    publish(ref, 0)
    StopRequest(at=time.time(), by=BY_CANCEL).write(ref.cancel_marker)
    scheduler.set(raw)
    st = job_status(ref)
    assert st.state == "CANCELLING" and not st.done and st.endpoints == []
    rank_exit(ref, 1, 137, signal="SIGKILL", ended_at=2.0)  # a follower that was given up on
    st = job_status(ref)
    assert st.state == "CANCELLING" and st.failed_rank is None
    assert "ranks stopping" in st.summary()


def test_completing_job_is_stopping_not_ready(tmp_path, scheduler):
    """Slurm's COMPLETING (time limit, scancel): the job is ending but its processes are still there."""
    ref = make_job(tmp_path)
    publish(ref, 0)
    scheduler.set("COMPLETING")
    st = job_status(ref)
    assert st.state == "STOPPING" and not st.done and st.endpoints == [] and "ending" in st.summary()
    rank_exit(ref, 1, 137, signal="SIGKILL", ended_at=2.0)
    assert job_status(ref).state == "FAILED"  # a rank that died on its own is still the news


def test_marker_only_explains_the_end_of_a_job_that_was_not_running(tmp_path, scheduler):
    ref = make_job(tmp_path)
    StopRequest(at=time.time(), by=BY_CANCEL).write(ref.cancel_marker)
    scheduler.set("PENDING", "Priority")
    assert job_status(ref).state == "PENDING"
    scheduler.set("TIMEOUT")
    assert job_status(ref).state == "TIMEOUT"


# ---------------------------------------------------------------------------------------------------------
# every kind of job (hpc/jobs/kinds.py): its folder's marker says which, and the stop rules are one


def test_a_folder_is_told_by_its_marker(tmp_path):
    kinds = {}
    for kind in KINDS:
        paths = JobPaths(tmp_path, f"{kind.kind}-1").create()
        kind.mark(paths)
        kinds[kind] = job_class_of(paths.folder)
    assert kinds == {kind: kind for kind in KINDS}
    assert job_class_of(JobPaths(tmp_path, "unmarked").create().folder) is ServingJob


def test_a_build_job_being_cancelled_is_cancelling_then_cancelled(tmp_path, scheduler):
    """A build job cancelled while BUILDING reads CANCELLING, then CANCELLED, as every kind does: not BUILDING until
    Slurm ended it, then FAILED once the step scancel killed recorded its exit."""
    ref = make_job(tmp_path, "811")
    BuildJob.mark(ref.paths)
    Deployment(ref.deploy_dir).build_request.write_text(
        json.dumps({"steps": [{"name": "shard", "command": "python3 shard.py"}]})
    )
    BuildStep(step=0, name="shard").write(ref.paths.build_step)  # the step the script runs (its log is only shown)
    ref.paths.build_log.write_text("hpc-serve build: step 0 (shard): python3 shard.py\n")
    scheduler.set("RUNNING")
    assert job_status(ref).summary() == "811 BUILDING (build) step 0 (shard): python3 shard.py"
    StopRequest(at=time.time(), by=BY_CANCEL).write(ref.cancel_marker)
    for raw in ("RUNNING", "COMPLETING"):
        scheduler.set(raw)
        st = job_status(ref)
        assert (st.kind, st.state, st.done) == ("build", "CANCELLING", False)
        assert st.summary() == "811 CANCELLING (build) step 0 (shard): python3 shard.py"
    BuildStep(step=0, name="shard", exit_code=143).write(ref.paths.build_failure)  # scancel's SIGTERM
    assert job_status(ref).state == "CANCELLING"
    scheduler.set("CANCELLED")
    st = job_status(ref)
    assert st.state == "CANCELLED" and st.done and st.summary().startswith("811 CANCELLED (build) ; last lines:")


def test_a_build_job_ending_is_stopping_and_its_failed_step_still_fails_it(tmp_path, scheduler):
    ref = make_job(tmp_path, "812")
    BuildJob.mark(ref.paths)
    scheduler.set("COMPLETING")
    assert job_status(ref).state == "STOPPING"
    BuildStep(step=1, name="trtllm-build", exit_code=3).write(ref.paths.build_failure)
    st = job_status(ref)
    assert st.state == "FAILED" and st.summary().startswith("812 FAILED (build) step 1 (trtllm-build) failed")


def test_a_gateway_job_follows_the_same_stop_rules(tmp_path, scheduler):
    """No record names it: STARTING while it runs; the cancel marker and COMPLETING as for every kind; a gateway
    job that failed says why in its own words (its batch log)."""
    ref = make_job(tmp_path, "813")
    GatewayJob.mark(ref.paths)
    gateway = GatewayJob(ref, Target(tmp_path, "fake", tmp_path))
    scheduler.set("RUNNING")
    assert gateway.status().state == "STARTING"
    scheduler.set("COMPLETING")
    assert gateway.status().state == "STOPPING"
    scheduler.set("FAILED")
    ref.paths.deployment.logs_dir.mkdir()
    ref.paths.deployment.sbatch_log("err", "813").write_text('{"access": 1}\nhpc-serve: port 8080 is taken\n')
    st = gateway.status()
    assert (st.kind, st.state, st.reason) == ("gateway", "FAILED", "hpc-serve: port 8080 is taken")
    StopRequest(at=time.time(), by=BY_CANCEL).write(ref.cancel_marker)
    assert gateway.status().state == "CANCELLED"
    scheduler.set("RUNNING")
    st = gateway.status()
    assert st.state == "CANCELLING" and st.url is None and st.summary() == "813 CANCELLING (gateway)"


# ---------------------------------------------------------------------------------------------------------
# local jobs: local.json plays sacct


def make_local(tmp_path: Path, **state) -> JobRef:
    ref = make_job(tmp_path, "local-abc123", world_per_replica=1)
    if state:
        LocalState(**state).write(ref.paths.local_state)
    return ref


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the pid names no process (not even a zombie)
    return proc.pid


def test_local_running_supervisor_alive(tmp_path, scheduler):
    ref = make_local(tmp_path, state="RUNNING", pid=os.getpid())
    assert isinstance(executor_of(ref), LocalExecutor)
    st = job_status(ref)
    assert st.state == "STARTING" and scheduler.calls == 0, "a local job never asks Slurm"
    publish(ref, 0)
    assert job_status(ref).state == "READY"


@pytest.mark.slow
def test_local_running_with_dead_supervisor_is_failed(tmp_path):
    ref = make_local(tmp_path, state="RUNNING", pid=dead_pid())
    st = job_status(ref)
    assert st.state == "FAILED" and st.done
    assert "supervisor died" in st.reason
    assert "supervisor died" in st.summary()


@pytest.mark.slow
def test_local_dead_supervisor_with_failed_rank_names_it(tmp_path):
    ref = make_local(tmp_path, state="RUNNING", pid=dead_pid())
    cause = rank_exit(ref, 0, -9, signal="SIGKILL", ended_at=1.0)
    assert job_status(ref).failed_rank == cause


def test_local_failed_reports_exit_code_and_rank(tmp_path):
    ref = make_local(tmp_path, state="FAILED", pid=1, exit_code=137)
    rank_exit(ref, 0, -9, signal="SIGKILL", ended_at=1.0, host="vm")
    st = job_status(ref)
    assert st.state == "FAILED" and st.reason == "exit code 137"
    assert "rank 0 on vm exited with signal SIGKILL" in st.summary()


@pytest.mark.slow
@pytest.mark.parametrize("state", ["COMPLETED", "CANCELLED"])
def test_local_end_states(tmp_path, state):
    ref = make_local(tmp_path, state=state, pid=dead_pid(), exit_code=0)
    st = job_status(ref)
    assert st.state == state and st.reason is None and st.done


def test_local_never_started_is_unknown(tmp_path):
    ref = make_local(tmp_path)
    st = job_status(ref)
    assert st.state == "UNKNOWN" and "never started" in st.reason


@pytest.mark.slow
def test_local_supervisor_stays_light():
    """hpc.jobs.local_run (the detached supervisor) takes the folder's names from launcher.contracts.layout, so that starting it
    does not import pydantic/jinja2/the spec before the ranks start."""
    from launcher.contracts.layout import SOURCE_ROOT

    code = "import sys, hpc.jobs.local_run; print(sorted({'pydantic', 'jinja2', 'hpc.spec', 'hpc.render.jobfiles'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SOURCE_ROOT
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_cancel_of_a_local_build_job_reads_cancelling_until_its_script_has_gone(tmp_path, hpc_home, monkeypatch):
    """`hpc-serve cancel` of a build job, for real under the local executor: while its script is still stopping
    (here: held in its TERM trap until the test lets it go) the job is CANCELLING, not BUILDING; then CANCELLED."""
    from hpc.jobs.track import cancel

    monkeypatch.setattr("hpc.jobs.track.after_cancel", lambda ref, grace_s: None)  # no deployment (spec.yaml) here
    deploy = tmp_path / "d"
    Deployment(deploy).logs_dir.mkdir(parents=True)  # as render and the build's script writer make it
    (deploy / BUILD_SUB_NAME).write_text(
        "#!/bin/bash\n"
        'D=$(dirname "$0")\n'
        'trap \'kill $STEP; touch "$D/stopping"; while [ ! -e "$D/release" ]; do sleep 0.05; done; exit 143\' TERM\n'
        "sleep 600 & STEP=$!\n"
        'touch "$D/started"\n'
        "wait $STEP\n"
    )
    ref = LocalExecutor().submit(BuildJob, deploy)
    wait_for(lambda: (deploy / "started").exists(), 30, "the build script to start")
    assert job_status(ref).summary() == f"{ref.job_id} BUILDING (build)"
    with ThreadPoolExecutor(1) as pool:
        cancelled = pool.submit(cancel, ref, 30)
        wait_for(lambda: (deploy / "stopping").exists(), 30, "the build script to get the stop")
        st = job_status(ref)
        assert (st.state, st.summary()) == ("CANCELLING", f"{ref.job_id} CANCELLING (build)")
        (deploy / "release").touch()
        st = cancelled.result(timeout=60)
    assert (st.state, st.summary()) == ("CANCELLED", f"{ref.job_id} CANCELLED (build)")


# ---------------------------------------------------------------------------------------------------------
# wait()


def test_wait_follows_the_job_to_ready(tmp_path, scheduler, monkeypatch):
    ref = make_job(tmp_path)
    script = iter(
        [
            ("PENDING", "Priority"),
            ("PENDING", "Priority"),
            ("PENDING", "Resources"),
            ("RUNNING", None),
            ("RUNNING", None),
            ("RUNNING", "publish"),
            ("RUNNING", None),
        ]
    )

    def step(job_id, job_dir):
        raw, reason = next(script)
        if reason == "publish":
            publish(ref, 0)
            reason = None
        return raw, reason

    set_slurm_state(monkeypatch, step)
    seen: list[JobStatus] = []
    st = wait(ref, on_change=seen.append, poll_s=0.01)
    assert st.state == "READY"
    assert [(s.state, s.reason) for s in seen] == [
        ("PENDING", "Priority"),
        ("PENDING", "Resources"),
        ("STARTING", None),
        ("READY", None),
    ]


def test_wait_stops_at_an_end_state_it_was_not_waiting_for(tmp_path, scheduler):
    ref = make_job(tmp_path)
    scheduler.set("RUNNING")
    rank_exit(ref, 0, 1, ended_at=1.0)
    assert wait(ref, until=("READY",), poll_s=0.01, timeout=30).state == "FAILED"


@pytest.mark.slow
def test_wait_gives_up_on_unknown(tmp_path, scheduler, monkeypatch):
    monkeypatch.setattr(track, "UNKNOWN_GIVE_UP_S", 0.3)
    ref = make_job(tmp_path)
    scheduler.set("UNKNOWN")
    started = time.monotonic()
    st = wait(ref, poll_s=0.02)  # no timeout: only the UNKNOWN rule can end this
    assert st.state == "UNKNOWN"
    assert time.monotonic() - started >= 0.3, "gave up before UNKNOWN_GIVE_UP_S"
    assert scheduler.calls >= 2


class FakeClock:
    """Stands in for `time` in hpc.jobs.track: sleep() advances monotonic() exactly, so timing rules are exact."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_wait_unknown_clock_restarts_when_the_scheduler_answers(tmp_path, scheduler, monkeypatch):
    """UNKNOWN for a moment (sacct lag right after sbatch) does not count towards a later UNKNOWN spell."""
    clock = FakeClock()
    monkeypatch.setattr(track, "time", clock)
    monkeypatch.setattr(track, "UNKNOWN_GIVE_UP_S", 10.0)
    ref = make_job(tmp_path)
    # 8 s UNKNOWN, 1 s PENDING, 8 s UNKNOWN, 1 s PENDING, then UNKNOWN for good (one poll per second)
    script = ["UNKNOWN"] * 8 + ["PENDING"] + ["UNKNOWN"] * 8 + ["PENDING"]
    calls = 0

    def flaky(job_id, job_dir):
        nonlocal calls
        calls += 1
        return (script[calls - 1] if calls <= len(script) else "UNKNOWN"), None

    set_slurm_state(monkeypatch, flaky)
    start = clock.now
    st = wait(ref, poll_s=1.0)
    assert st.state == "UNKNOWN"
    # the last UNKNOWN spell starts at poll 19 (t=18 s) and is given up once more than 10 s old
    assert calls == 18 + 12 and clock.now - start == 29.0


def test_wait_gives_up_on_unknown_exactly(tmp_path, scheduler, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(track, "time", clock)
    monkeypatch.setattr(track, "UNKNOWN_GIVE_UP_S", 5.0)
    ref = make_job(tmp_path)
    scheduler.set("UNKNOWN")
    start = clock.now
    wait(ref, poll_s=1.0)
    assert clock.now - start == 6.0 and scheduler.calls == 7


@pytest.mark.slow
def test_wait_honours_timeout(tmp_path, scheduler):
    ref = make_job(tmp_path)
    scheduler.set("PENDING", "Priority")
    started = time.monotonic()
    st = wait(ref, timeout=0.3, poll_s=0.02)
    assert (st.state, st.reason) == ("PENDING", "Priority")
    assert time.monotonic() - started >= 0.3


@pytest.mark.slow
def test_wait_timeout_applies_to_unknown_too(tmp_path, scheduler, monkeypatch):
    monkeypatch.setattr(track, "UNKNOWN_GIVE_UP_S", 3600.0)
    ref = make_job(tmp_path)
    scheduler.set("UNKNOWN")
    assert wait(ref, timeout=0.2, poll_s=0.02).state == "UNKNOWN"


def test_wait_until_nothing_waits_for_the_end(tmp_path, scheduler, monkeypatch):
    """`hpc-serve cancel` waits with until=(): READY is not enough, only an end state is."""
    ref = make_job(tmp_path)
    n = 0

    def ending(job_id, job_dir):
        nonlocal n
        n += 1
        return ("RUNNING", None) if n < 5 else ("CANCELLED", None)

    publish(ref, 0)
    set_slurm_state(monkeypatch, ending)
    assert wait(ref, until=(), poll_s=0.01, timeout=30).state == "CANCELLED"
    assert n == 5


# ---------------------------------------------------------------------------------------------------------
# the Slurm watcher against the real cluster: sacct, squeue and scontrol parsing


def slurm_state(job: str) -> tuple[str, str | None]:
    """What Slurm says now: a fresh watcher asks at once (the process's shared one would answer from cache)."""
    return SlurmWatcher().state(job)


def _sbatch_held(folder: Path) -> str:
    proc = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-p", "debug", "-o", f"{folder}/%j.out", "--wrap", "sleep 600"],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip().split(";")[0]


def _sacct_state(job: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture
def held_job(slurm_cluster, tmp_path):
    write_plan(tmp_path)  # a serving job's deployment: one replica of one rank
    job = _sbatch_held(tmp_path)
    yield job, JobPaths(tmp_path, job).folder
    subprocess.run(["scancel", job], capture_output=True)


@pytest.mark.cluster
def test_slurm_state_held_released_cancelled(held_job):
    job, job_dir = held_job
    raw, reason = slurm_state(job)
    assert (raw, reason) == ("PENDING", "JobHeldUser")
    ref = JobRef(job, job_dir)
    assert job_status(ref).summary() == f"{job} PENDING (JobHeldUser: held: `scontrol release <id>` lets it start)"

    subprocess.run(["scontrol", "release", job], check=True, capture_output=True)
    # this process's watcher answers from its cache until its next refresh is due (2 s, 4 s, 8 s … later)
    wait_for(
        lambda: job_status(ref).state == "STARTING", 30, "running, and no endpoint (it is `sleep 600`, cancelled below)"
    )
    assert job_status(ref).reason is None

    subprocess.run(["scancel", job], check=True, capture_output=True)
    wait_for(lambda: job_status(ref).state == "CANCELLED", 30, "the watcher to see the job CANCELLED")
    assert _sacct_state(job).startswith("CANCELLED by") and slurm_state(job) == ("CANCELLED", None), (
        "the watcher must keep only the state word"
    )
    assert job_status(ref).done


@pytest.mark.cluster
def test_slurm_state_without_sacct_uses_squeue_then_scontrol(held_job, monkeypatch):
    job, job_dir = held_job
    real_which = shutil.which
    hidden: set[str] = {"sacct"}
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name in hidden else real_which(name))
    assert slurm_state(job) == ("PENDING", "JobHeldUser")  # squeue -o %T|%r
    hidden.add("squeue")
    assert slurm_state(job) == ("PENDING", "JobHeldUser")  # scontrol show job
    hidden.add("scontrol")
    assert slurm_state(job) == ("UNKNOWN", None)


@pytest.mark.cluster
def test_slurm_state_of_a_job_slurm_never_heard_of(slurm_cluster, tmp_path):
    assert slurm_state("999999") == ("UNKNOWN", None)


@pytest.mark.cluster
def test_slurm_state_follows_suspend_and_resume_in_one_process(slurm_cluster, tmp_path):
    """`hpc-serve wait` polls from one process, through one watcher: a state the job can leave (SUSPENDED)
    must not be cached as final, as submitit's watcher would."""
    job = _sbatch_held(tmp_path)
    job_dir = JobPaths(tmp_path, job).folder
    watcher = SlurmWatcher()
    try:
        subprocess.run(["scontrol", "release", job], check=True, capture_output=True)
        wait_for(lambda: watcher.state(job)[0] == "RUNNING", 30, "the job to run")
        subprocess.run(["scontrol", "suspend", job], check=True, capture_output=True)
        wait_for(lambda: watcher.state(job)[0] == "SUSPENDED", 60, "SUSPENDED")
        assert job_status(JobRef(job, job_dir)).state == "PENDING"
        subprocess.run(["scontrol", "resume", job], check=True, capture_output=True)
        wait_for(lambda: _sacct_state(job) == "RUNNING", 30, "sacct to say RUNNING again")
        wait_for(lambda: watcher.state(job)[0] == "RUNNING", 60, "the same watcher to see it run again")
    finally:
        subprocess.run(["scancel", job], capture_output=True)


def test_failed_without_records_names_the_ranks_that_wrote_none(tmp_path, scheduler):
    """Slurm killed the step before any launcher wrote its record: the ranks without one are named (a fact),
    with their log's last lines as text; slurmstepd's PMIx wording is not parsed (rank 2's log names rank 2, and
    is not believed: rank 1 wrote no record either)."""
    ref = make_job(tmp_path, world_per_replica=3)
    scheduler.set("FAILED")
    assert job_status(ref).failed_rank is None, "no rank ever started (no log): nothing to name"
    for rank in range(3):
        ref.paths.rank_log(rank, "err").write_text(f"I1122 rank {rank} loading\n| table |\n")
    ref.paths.rank_log(2, "err").write_text(
        "slurmstepd-node2: error:  mpi/pmix_v4: _errhandler: node2 [2]: pmixp_client_v2.c:211: Error handler\n"
    )
    rank_exit(ref, 0, 0, ended_at=1.0)
    st = job_status(ref)
    assert st.state == "FAILED" and st.failed_rank is not None and st.failed_rank.rank == 1
    text = st.summary()
    assert "rank 1 exited with an unknown status: no exit record" in text and "(nor did rank 2)" in text, text
    assert text.endswith("  | I1122 rank 1 loading"), "its log's last lines are shown, tables left out"


def test_a_rank_killed_by_a_signal_heads_the_failure_before_a_peer_that_wrote_no_record(tmp_path, scheduler):
    """The llmapi leader node killed on node1: rank 0's record names the signal alone (no exit code), and srun
    killed rank 1 before its launcher wrote one. The signal is the failure; the rank without a record is not."""
    ref = make_job(tmp_path, world_per_replica=2)
    scheduler.set("FAILED")
    for rank in range(2):
        ref.paths.rank_log(rank, "err").write_text(f"rank {rank} serving\n")
    rank_exit(ref, 0, None, signal="SIGKILL", ended_at=1.0, tail=["the leader node (...) ended (signal SIGKILL)"])
    st = job_status(ref)
    assert st.state == "FAILED" and st.failed_rank is not None and st.failed_rank.rank == 0, st.summary()
    assert "rank 0 on node1 exited with signal SIGKILL" in st.summary()


@pytest.mark.cluster
def test_a_step_killed_before_any_record_is_named_with_slurms_own_account(slurm_cluster, tmp_path):
    """A real job whose step's task is SIGKILLed before any launcher could write a record (what the OOM killer
    does): FAILED, naming the rank without a record and what sacct says of its step."""
    ref = make_job(tmp_path, "0", world_per_replica=1)  # a folder and launch.json: the job id comes from sbatch
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun -n1 bash -c 'echo rank 0 starting >&2; kill -9 $$'\n")
    proc = subprocess.run(
        ["sbatch", "--parsable", "-p", "debug", "-o", f"{tmp_path}/%j.out", str(script)],
        capture_output=True,
        text=True,
        check=True,
    )
    job = proc.stdout.strip().split(";")[0]
    try:
        paths = JobPaths(ref.deploy_dir, job).create()
        paths.rank_log(0, "err").write_text("rank 0 starting\n")  # what a rank's srun writes before its launcher
        ref = JobRef(job, paths.folder)
        wait_for(lambda: _sacct_state(job).startswith("FAILED"), 60, "sacct to say FAILED")
        st = wait_for(lambda: (s := job_status(ref)).state == "FAILED" and s, 60, "FAILED")
        assert st.failed_rank is not None and st.failed_rank.rank == 0
        assert re.search(rf"Slurm: step {job}\.0 [A-Z]+ \(exit 0:9\) on node\d", st.failed_rank.error), st.summary()
    finally:
        subprocess.run(["scancel", job], capture_output=True)
