"""End-to-end on the real one-machine Slurm cluster (ci/cluster/up.sh): node1 and node2, PMIx, sacct.

Every test drives the real CLI, the real sbatch/srun, the real tritonserver and the CPU engine over MPI.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from launcher.contracts.config import STOP_LEAD_S
from launcher.contracts.layout import JobPaths
from launcher.contracts.stop_records import BY_TIME_LIMIT, StopNotice, StopRequest
from tests._llmapi import of_job
from tests.e2e import (
    CLI,
    assert_streams_ended_clearly,
    cli,
    core_model_stream,
    ensemble_clients,
    join_clients,
    kill_quietly,
    processes_under,
    rank_records,
    status,
    submit,
    wait_for,
    write_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(400)]


def _assert_no_server_left(deploy_dir, job: str, timeout=60):
    """No process naming the folder (tritonservers, stubs, launchers) and none of the job by its environment
    (the llmapi workflow's leader and worker nodes name no folder)."""
    wait_for(
        lambda: not processes_under(deploy_dir) and not of_job(job), timeout, f"every process of job {job} to exit"
    )


def test_two_jobs_on_one_node_get_distinct_auto_ports(jobs, tmp_path, tiny_gpt2):
    specs = [write_spec(tmp_path, f"twin{i}", tiny_gpt2, slurm={"sbatch_args": ["--nodelist=node1"]}) for i in (1, 2)]
    submitted = []
    for spec in specs:
        job, job_dir = submit(spec)
        jobs.append(job)
        submitted.append(job)
    endpoints = [status(job)["endpoints"][0] for job in submitted]
    assert {e["host"] for e in endpoints} == {"node1"}
    ports = [(e["http_port"], e["grpc_port"], e["metrics_port"]) for e in endpoints]
    assert len(set(sum(ports, ()))) == 6, f"ports collide: {ports}"
    for job in submitted:
        cli(
            "generate", job, "hello", "--max-tokens", "4"
        )  # fails unless answered; random weights may decode to no visible text


def test_four_ranks_on_one_node_have_distinct_shm_prefixes(jobs, tmp_path, tiny_gpt2):
    spec = write_spec(
        tmp_path, "tp4", tiny_gpt2, tp=4, nodes=1, ntasks_per_node=4, slurm={"sbatch_args": ["--nodelist=node2"]}
    )
    job, job_dir = submit(spec)
    jobs.append(job)
    servers = [cmd for _, cmd in processes_under(job_dir.parent.parent) if "tritonserver " in cmd]
    prefixes = [re.search(r"shm-region-prefix-name=(\S+)", cmd).group(1) for cmd in servers]
    assert len(prefixes) == 4 and len(set(prefixes)) == 4, prefixes
    assert status(job)["state"] == "READY"
    cli(
        "generate", job, "four ranks", "--max-tokens", "6"
    )  # fails unless answered; random weights may decode to no visible text


def test_killed_follower_fails_the_job_and_status_names_the_rank(jobs, tmp_path, tiny_gpt2):
    spec = write_spec(tmp_path, "victim", tiny_gpt2, tp=2, nodes=2, ntasks_per_node=1)
    job, job_dir = submit(spec)
    jobs.append(job)
    deploy_dir = job_dir.parent.parent
    follower = [
        pid for pid, cmd in processes_under(deploy_dir) if "tritonserver " in cmd and "--load-model=tensorrt_llm" in cmd
    ]
    assert len(follower) == 1
    kill_quietly(follower)
    # how fast: tests/test_e2e_replicas_cluster.py (fail-fast); here the job is FAILED, naming the rank that died
    st = wait_for(lambda: (s := status(job))["state"] == "FAILED" and s, 120, "the job to be FAILED")
    assert st["failed_rank"]["rank"] == 1
    shown = cli("status", job, check=False)
    assert shown.returncode == 1 and "rank 1 on node2" in shown.stdout and "SIGKILL" in shown.stdout
    _assert_no_server_left(deploy_dir, job)


#: what rank 1 (on node2) writes to its stderr in each workflow: the engine workflow's follower tritonserver
#: loading the model, the llmapi workflow's worker node (outside tritonserver) serving its shard
FOLLOWER_SAYS = {"engine": "tensorrt_llm", "llmapi": "worker node rank 1"}


@pytest.mark.parametrize("workflow", list(FOLLOWER_SAYS))
def test_salloc_and_srun_launch_spec_interactively(jobs, tmp_path, tiny_gpt2, workflow):
    spec = write_spec(tmp_path, "interactive", tiny_gpt2, tp=2, nodes=2, ntasks_per_node=1, workflow=workflow)
    proc = subprocess.Popen(
        ["salloc", "-N2", "--ntasks-per-node=1", "-t", "10", "srun", "--mpi=pmix", *CLI, "launch", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    job = None
    try:
        line = proc.stdout.readline()
        match = re.search(r"job allocation (\d+)", line)
        assert match, f"salloc said: {line}"
        job = match.group(1)
        jobs.append(job)
        wait_for(lambda: status(job).get("state") == "READY", 180, "the interactive step to be READY")
        assert cli("generate", job, "interactive", "--max-tokens", "4").stdout.strip()
        endpoints = cli("endpoints", job, "--format", "env").stdout
        assert "TRITON_HTTP_URL=http://" in endpoints and "127.0.0.1" not in endpoints
        # Without srun --output, each rank still writes its own log file (and the terminal gets a copy).
        follower_log = cli("logs", job, "--rank", "1").stdout
        assert follower_log.startswith("[hpc-serve] rank 1/2 on node2: replica 0, follower")
        assert FOLLOWER_SAYS[workflow] in cli("logs", job, "--rank", "1", "--err").stdout
        deploy_dir = Path(status(job)["job_dir"]).parent.parent
        subprocess.run(["scancel", job], capture_output=True, check=True)  # what ends an salloc: every rank goes
        proc.wait(timeout=90)
        _assert_no_server_left(deploy_dir, job)
    finally:
        if proc.poll() is None:
            if job:
                subprocess.run(["scancel", job], capture_output=True)
            else:
                proc.terminate()
        proc.wait(timeout=90)


@pytest.mark.parametrize("workflow", list(FOLLOWER_SAYS))
def test_hand_sbatch_of_rendered_folder_is_tracked(jobs, tmp_path, tiny_gpt2, workflow):
    spec = write_spec(tmp_path, "byhand", tiny_gpt2, tp=2, nodes=2, ntasks_per_node=1, workflow=workflow)
    deploy_dir = tmp_path / "deploy"
    cli("render", str(spec), "-o", str(deploy_dir))
    out = subprocess.run(
        ["sbatch", "--parsable", str(deploy_dir / "tensorrt_llm_triton.sub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    job = out.strip().split(";")[0]
    jobs.append(job)
    assert cli("wait", job, "--timeout", "180", timeout=240).returncode == 0
    assert status(job)["job_dir"] == str(JobPaths(deploy_dir, job).folder)
    cli(
        "generate", job, "by hand", "--max-tokens", "4"
    )  # fails unless answered; random weights may decode to no visible text
    import submitit  # the per-rank logs are where submitit looks for a task's output

    tracked = submitit.SlurmJob(folder=deploy_dir / "jobs" / "%j", job_id=job, tasks=(0, 1))
    assert tracked.task(1).stdout().startswith("[hpc-serve] rank 1/2 on node2: replica 0, follower")
    assert FOLLOWER_SAYS[workflow] in tracked.task(1).stderr()
    cli("cancel", job, timeout=120)
    assert status(job)["state"] == "CANCELLED"
    _assert_no_server_left(deploy_dir, job)


def test_two_replicas_of_tp2_publish_two_endpoints(jobs, tmp_path, tiny_gpt2):
    """replicas × tp ranks in one srun step: each replica has its own MPI communicator and its own leader."""
    import yaml

    spec = write_spec(tmp_path, "replicas", tiny_gpt2, tp=2, nodes=2, ntasks_per_node=2)
    data = yaml.safe_load(spec.read_text())
    data["replicas"] = 2
    spec.write_text(yaml.safe_dump(data))
    job, job_dir = submit(spec)
    jobs.append(job)
    endpoints = sorted(status(job)["endpoints"], key=lambda e: e["replica"])
    assert [e["replica"] for e in endpoints] == [0, 1]
    assert [e["rank"] for e in endpoints] == [0, 2]
    assert len({(e["address"], e["http_port"]) for e in endpoints}) == 2
    texts = {cli("generate", job, "same prompt", "--max-tokens", "6", "--replica", str(r)).stdout for r in (0, 1)}
    assert len(texts) == 1, "two replicas of one checkpoint must give the same greedy text"


def test_leader_stop_releases_followers_and_job_completes(jobs, tmp_path, tiny_gpt2):
    """Leader mode as TensorRT-LLM does it: when the leader unloads, followers leave and the job ends cleanly."""
    import os
    import signal

    spec = write_spec(tmp_path, "release", tiny_gpt2, tp=2, nodes=2, ntasks_per_node=1)
    job, job_dir = submit(spec)
    jobs.append(job)
    leader = [
        pid
        for pid, cmd in processes_under(job_dir.parent.parent)
        if "tritonserver " in cmd and "--load-model=" not in cmd
    ]
    assert len(leader) == 1
    os.kill(leader[0], signal.SIGTERM)  # a graceful stop of rank 0's tritonserver only
    wait_for(lambda: status(job).get("state") == "COMPLETED", 120, "the job to complete")
    ranks = rank_records(job_dir)
    assert sorted(ranks) == [0, 1]
    assert ranks[0].exit_code == 0 and ranks[1].exit_code == 0, ranks
    leader_log = JobPaths.of_folder(job_dir).rank_log(0, "err").read_text(errors="replace")
    assert "Segmentation fault" not in leader_log  # the stub's objects are released before its interpreter ends
    _assert_no_server_left(job_dir.parent.parent, job)


def test_cancel_of_tp2_across_two_nodes_is_an_ordered_stop_within_the_stop_lead(jobs, tmp_path, tiny_gpt2):
    """`hpc-serve cancel` SIGTERMs every process of the step at once: the leader stops taking requests, lets the
    requests in flight finish (or fail) within drain_s, unloads and releases its follower, which waited for that
    instead of leaving first. Nothing spins or waits on a peer that is gone: both ranks exit 0, the follower
    released by its leader, no SIGKILL; CANCELLED is reported only once every process is gone.

    The one time bound is the feature: the stop fits the budget the product gives an ordered stop, STOP_LEAD_S
    (30 s: Slurm's time-limit warning comes that long before the end, and `cancel --grace` is as long). It takes
    a few seconds (drain_s is 10 s at most), so the margin survives a machine whose cores other processes take."""
    import threading

    spec = write_spec(tmp_path, "stop", tiny_gpt2, tp=2, nodes=2, ntasks_per_node=1)
    job, job_dir = submit(spec)
    jobs.append(job)
    deploy_dir = job_dir.parent.parent
    (endpoint,) = status(job)["endpoints"]

    streaming, cancelled, outcomes = threading.Event(), threading.Event(), []

    def in_flight(i: int) -> None:
        """250-token streams one after the other until one fails or the cancel returned: streams are running
        when the cancel lands, however fast the engine (one batch of them could end before the SIGTERM came)."""
        while not cancelled.is_set():
            started = time.time()
            try:
                pieces, error = core_model_stream(endpoint, [5, 6, 7 + i], 250, on_piece=streaming.set, timeout=30)
            except Exception as exc:  # noqa: BLE001 - the stream broke: what the client saw is the result
                pieces, error = [], f"{type(exc).__name__}: {exc}"
            tokens = sum(piece.size for piece in pieces)
            outcomes.append({"tokens": tokens, "error": error, "started": started, "at": time.time()})
            if error:
                return

    requests = [threading.Thread(target=in_flight, args=(i,), daemon=True) for i in range(8)]
    for request in requests:
        request.start()
    assert streaming.wait(30), "no request started streaming"

    seen: list[tuple[str, int]] = []
    watching = threading.Event()

    def watch() -> None:  # what `status` says while the ranks stop, and whether processes are left then
        while not watching.is_set():
            state = status(job).get("state", "?")
            seen.append((state, len(processes_under(deploy_dir))))
            watching.wait(0.25)  # back to back, its CLI processes took a core from the stop being timed

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    out = cli("cancel", job, timeout=60).stdout
    returned = time.monotonic() - t0
    cancelled.set()
    wait_for(
        lambda: not processes_under(deploy_dir),
        max(0.1, t0 + STOP_LEAD_S - time.monotonic()),
        f"every process of {deploy_dir} to exit within {STOP_LEAD_S} s of the cancel",
        interval=0.1,
    )
    gone = time.monotonic() - t0
    watching.set()
    watcher.join(30)
    for request in requests:
        request.join(30)
    notice = StopNotice.read(JobPaths.of_folder(job_dir).stopping(0))
    assert notice is not None
    stopped_at = notice.at  # the leader's SIGTERM
    print(
        f"\ncancel returned after {returned:.1f} s, no process left after {gone:.1f} s; status seen: {seen}; "
        f"requests (tokens, error, s after the leader's SIGTERM): "
        f"{[(o['tokens'], o['error'], round(o['at'] - stopped_at, 2)) for o in outcomes[-12:]]}"
    )

    assert returned < STOP_LEAD_S and "CANCELLED" in out, out
    assert status(job)["state"] == "CANCELLED"
    assert not [state for state, procs in seen if state == "CANCELLED" and procs], (
        f"CANCELLED reported while processes of the job were still running: {seen}"
    )
    # requests in flight at the stop got their whole answer or a clear error, not a hang
    assert not [request for request in requests if request.is_alive()], "a request hung"
    at_stop = [o for o in outcomes if o["started"] < stopped_at < o["at"] and o["tokens"]]  # streaming then
    assert at_stop, f"no request was in flight at the stop: {outcomes}"
    assert all(o["tokens"] == 250 or o["error"] for o in outcomes), outcomes
    ranks = rank_records(job_dir)
    assert ranks[0].exit_code == 0 and ranks[1].exit_code == 0, ranks  # drained, released: clean exits
    logs = "".join(p.read_text(errors="replace") for p in JobPaths.of_folder(job_dir).rank_logs("err"))
    assert "released by the leader" in logs and "sending SIGKILL" not in logs


@pytest.mark.timelimit
def test_time_limit_under_load_is_an_ordered_stop_and_the_job_completes(jobs, tmp_path, tiny_gpt2):
    """Slurm's time-limit warning (the .sub's --signal=B:USR1) stops the ranks in order before the limit, with
    4 clients streaming through the ensemble: the .sub writes the job's stop request, which the launchers watch
    (a signal to the steps would reach the leader's tritonserver before its model drained: with streams in
    flight it would then exit 1 or be SIGKILLed). The leader drains, both ranks exit 0, every stream ends with its
    final response or a clear error, and the job ends COMPLETED, not TIMEOUT or FAILED. Three minutes: "the
    signal may be sent up to 60 seconds earlier than specified" (sbatch(1), --signal), so the warning (@30) may
    come at the first minute's end of a 2-minute job, and a job slow to be READY on a busy machine would have had
    its stop under way before its clients started."""
    import threading

    spec = write_spec(tmp_path, "limit", tiny_gpt2, tp=2, nodes=2, ntasks_per_node=1, slurm={"time": "00:03:00"})
    job, job_dir = submit(spec)
    jobs.append(job)
    (endpoint,) = status(job)["endpoints"]
    stop, endings = threading.Event(), []  # (started, ended, how), monotonic seconds
    clients = ensemble_clients(endpoint, 4, stop, endings)
    st = wait_for(
        lambda: (s := status(job)).get("state") in ("COMPLETED", "TIMEOUT", "FAILED") and s,
        260,
        "the job to reach its time limit",
    )
    stop.set()
    join_clients(clients, 60)
    paths = JobPaths.of_folder(job_dir)
    logs = "".join(p.read_text(errors="replace") for p in paths.rank_logs("err"))
    assert st["state"] == "COMPLETED", (st, logs[-3000:])
    ranks = rank_records(job_dir)
    assert ranks[0].exit_code == 0 and ranks[1].exit_code == 0, ranks
    request = StopRequest.read(paths.stop_request)  # the .sub's trap wrote it: Slurm's time-limit warning
    assert request is not None and request.by == BY_TIME_LIMIT and not paths.cancel_marker.exists()
    assert "stop requested (stop_requested)" in logs and "the model drained" in logs, logs[-3000:]
    assert "sending SIGKILL" not in logs
    notice = StopNotice.read(paths.stopping(0))
    assert notice is not None
    stopped_at = notice.at - time.time() + time.monotonic()
    assert_streams_ended_clearly(endings, stop_at=stopped_at)
    _assert_no_server_left(job_dir.parent.parent, job)
