"""Where the gateway runs and how it is found: TARGET resolution (spec, folder, name, job ids), the `gateway:`
spec section and its rendered sbatch script, the address record (published, refused beside a live gateway,
stale ones replaced, withdrawn on a clean stop), and the gateway as a local job. No tritonserver needed: a
gateway without replicas serves its own routes. The Slurm side: tests/test_gateway_job_cluster.py."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from hpc.gateway.serve import advertised, listen
from hpc.render import jobfiles as R
from hpc.scheduler.index import register
from hpc.serving.deployment import Target, TargetError, resolve, resolve_target
from hpc.serving.gateway_record import answers, publish, record_path, withdraw
from hpc.spec import SpecError, dump_spec, parse_spec
from launcher.contracts.layout import GATEWAY_SUB_NAME, Deployment, JobPaths, gateway_record
from launcher.contracts.records import GatewayRecord, read_gateway
from tests.e2e import CLI, cli, wait_for


def spec_text(name: str, checkpoint: Path, workdir: Path, **extra) -> str:
    data = {
        "name": name,
        "workdir": str(workdir),
        "slurm": {"nodes": 1, "partition": "debug", "time": "00:20:00"},
        "model": {"backend": "cpu", "workflow": "engine", "checkpoint_dir": str(checkpoint)},
        **extra,
    }
    return yaml.safe_dump(data)


def deployment(workdir: Path, name: str, stamp: str, checkpoint: Path, jobs: tuple[str, ...] = ()) -> Path:
    """A deployment folder as render leaves it for these purposes (its resolved spec.yaml), with indexed jobs."""
    spec = parse_spec(spec_text(name, checkpoint, workdir), check_files=False)
    folder = workdir / f"{name}-{stamp}"
    folder.mkdir(parents=True)
    Deployment(folder).spec.write_text(dump_spec(spec))
    for job in jobs:
        register(job, JobPaths(folder, job).create().folder)
    return folder


# ------------------------------------------------------------------------------------------------ TARGET
@pytest.mark.slow
def test_every_form_of_target_names_the_same_deployment(hpc_home, tmp_path):
    workdir = tmp_path / "runs"
    old = deployment(workdir, "svc", "20260101-000000", tmp_path / "old-ckpt", jobs=("11",))
    new = deployment(workdir, "svc", "20260102-000000", tmp_path / "ckpt", jobs=("12", "local-ab12"))
    spec = tmp_path / "svc.yaml"
    spec.write_text(spec_text("svc", tmp_path / "ckpt", workdir))
    expected = Target(workdir.resolve(), "svc", tmp_path / "ckpt")
    for form in (str(spec), str(new), "svc", "12", "local-ab12", str(JobPaths(new, "12").folder)):
        assert resolve_target(form) == expected, form
    assert resolve_target("11").tokenizer_dir == tmp_path / "old-ckpt", "a job: its own folder's spec"
    target, jobs = resolve(["11", "12"])
    assert (target.workdir, target.name) == (workdir.resolve(), "svc")
    assert [j.job_id for j in jobs] == ["11", "12"] and jobs[0].deploy_dir == old
    assert resolve([str(spec)])[1] == [], "a spec names no job"


def test_a_target_carries_the_llmapi_max_seq_len_from_its_spec_and_its_folder(hpc_home, tmp_path):
    """The gateway's context for usage and finish_reason (hpc/spec/files.py context_length) is cut to it."""
    extra = {"model": {"backend": "cpu", "workflow": "llmapi", "checkpoint_dir": str(tmp_path / "ckpt")}}
    spec = tmp_path / "seq.yaml"
    spec.write_text(spec_text("seq", tmp_path / "ckpt", tmp_path / "runs", **extra, llm_api={"max_seq_len": 96}))
    assert resolve_target(str(spec)).max_seq_len == 96
    folder = tmp_path / "runs" / "seq-20260101-000000"
    folder.mkdir(parents=True)
    Deployment(folder).spec.write_text(dump_spec(parse_spec(spec.read_text(), check_files=False)))
    register("31", JobPaths(folder, "31").create().folder)
    assert resolve_target("31").max_seq_len == 96
    plain = tmp_path / "plain.yaml"
    plain.write_text(spec_text("plain", tmp_path / "ckpt", tmp_path / "runs"))
    assert resolve_target(str(plain)).max_seq_len is None


def test_a_name_is_the_spec_name_not_a_folder_prefix(hpc_home, tmp_path):
    workdir = tmp_path / "runs"
    deployment(workdir, "svc-2", "20260101-000000", tmp_path / "ckpt", jobs=("21",))
    with pytest.raises(TargetError) as exc:
        resolve_target("svc")
    assert not exc.value.ambiguous and str(hpc_home / "jobs") in str(exc.value)
    assert resolve_target("svc-2").name == "svc-2"


@pytest.mark.slow
def test_a_name_in_two_workdirs_is_refused_listing_both(hpc_home, tmp_path):
    deployment(tmp_path / "a", "svc", "20260101-000000", tmp_path / "ckpt", jobs=("31",))
    deployment(tmp_path / "b", "svc", "20260101-000000", tmp_path / "ckpt", jobs=("32",))
    with pytest.raises(TargetError) as exc:
        resolve_target("svc")
    assert exc.value.ambiguous
    assert str((tmp_path / "a").resolve()) in str(exc.value) and str((tmp_path / "b").resolve()) in str(exc.value)
    with pytest.raises(TargetError, match="more than one deployment"):
        resolve(["31", "32"])
    assert resolve_target("31").workdir == (tmp_path / "a").resolve(), "a job id is never ambiguous"


@pytest.mark.slow
def test_cli_exit_codes_for_targets(hpc_home, tmp_path):
    deployment(tmp_path / "a", "svc", "20260101-000000", tmp_path / "ckpt", jobs=("41",))
    deployment(tmp_path / "b", "svc", "20260101-000000", tmp_path / "ckpt", jobs=("42",))
    ambiguous = cli("gateway", "svc", check=False)
    assert ambiguous.returncode == 2 and "2 workdirs" in ambiguous.stderr, ambiguous.stderr
    unknown = cli("endpoints", "nosuch", check=False)
    assert unknown.returncode == 3 and "nosuch: not a spec file" in unknown.stderr
    mixed = cli("status", "41", "42", check=False)
    assert mixed.returncode == 2 and "more than one deployment" in mixed.stderr
    folder = cli("gateway", str(tmp_path), check=False)
    assert folder.returncode == 3 and "neither a deployment folder" in folder.stderr


# ------------------------------------------------------------------------------------- the gateway: script
def test_gateway_section_errors_name_the_field(tmp_path):
    bad = {
        "host": ("0.0.0.0; rm -rf ~", "gateway.host"),
        "port": (70000, "gateway.port"),
        "time": (90, "gateway.time"),
        "partition": ("debug -w x", "gateway.partition"),
        "mem": ("lots", "gateway.mem"),
        "sbatch_args": (["--comment=a b"], "gateway.sbatch_args"),
        "max_outstanding": (-1, "gateway.max_outstanding"),
        "prefix_chars": ("long", "gateway.prefix_chars"),
        "max_body_mb": (-1, "gateway.max_body_mb"),
        "workers": (0, "gateway.workers"),
        "prot": (9000, "gateway"),
    }
    for key, (value, field) in bad.items():
        with pytest.raises(SpecError) as exc:
            parse_spec(spec_text("s", tmp_path, tmp_path, gateway={key: value}), check_files=False)
        (problem,) = exc.value.problems
        assert problem.path.startswith(field) and problem.line > 1, (key, problem)
    assert "did you mean 'port'" in str(exc.value)
    with pytest.raises(SpecError) as exc:  # a core per worker: more workers than the job's cores are refused
        parse_spec(spec_text("s", tmp_path, tmp_path, gateway={"workers": 4, "cpus": 2}), check_files=False)
    (problem,) = exc.value.problems
    assert problem.path == "gateway.workers" and "raise gateway.cpus to 4" in problem.message


@pytest.mark.slow
def test_gateway_script_only_with_an_enabled_section(tmp_path):
    def scripts(**extra):
        return R.render_scripts(parse_spec(spec_text("s", tmp_path, tmp_path, **extra), check_files=False), tmp_path)

    assert GATEWAY_SUB_NAME not in scripts()
    assert GATEWAY_SUB_NAME not in scripts(gateway={"enabled": False})
    assert GATEWAY_SUB_NAME in scripts(gateway={})


def test_rendered_gateway_script(tmp_path):
    hostile = "py/3.11 $(touch PWNED) 'x'"
    text = spec_text(
        "svc",
        tmp_path / "ckpt",
        tmp_path / "runs",
        gateway={
            "port": 9100,
            "time": "2-00:00:00",
            "cpus": 3,
            "nodelist": "node2",
            "sbatch_args": ["--comment=gw"],
            "max_outstanding": 16,
            "prefix_chars": 0,
            "max_body_mb": 64,
            "workers": 3,
        },
    )
    spec = parse_spec(text, check_files=False)
    spec = spec.model_copy(update={"slurm": spec.slurm.model_copy(update={"modules": [hostile]})})
    deploy = tmp_path / "runs" / "svc-1"
    script = R.render_scripts(spec, deploy)[GATEWAY_SUB_NAME]
    directives = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "-J svc-gateway",
        f"-o {deploy}/logs/%j.out",
        f"-e {deploy}/logs/%j.err",
        "-p debug",  # the serving job's partition: not overridden
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=3",
        "--time=2-00:00:00",
        "--mem=2G",
        "--nodelist=node2",
        "--comment=gw",
    ]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    lines = script.splitlines()
    assert shlex.split(next(line for line in lines if line.startswith("module load"))) == ["module", "load", hostile]
    start = script.index(f"\n  {sys.executable} -m hpc.cli gateway") + 1  # in the loop that starts it again
    command = script[start : script.index(" &\n", start)].replace("\\\n", " ")
    argv = shlex.split(command)
    assert argv[:1] == [sys.executable], "the gateway runs with the interpreter that rendered it"
    assert argv[1:] == [
        "-m", "hpc.cli", "gateway", "$DEPLOY_DIR", "--host", "0.0.0.0", "--port", "9100", "--refresh", "5.0",
        "--max-outstanding", "16", "--prefix-chars", "0", "--max-body-mb", "64", "--workers", "3",
        "--job-id", "$JOB_ID",
    ]  # fmt: skip
    assert f"DEPLOY_DIR={deploy}" in lines and str(gateway_record(tmp_path / "runs", "svc")) in script


@pytest.mark.parametrize(
    ("dies", "runs", "rc"),
    [
        ("kill -SEGV $$", 6, 128 + 11),  # a crash: started again 5 times, then the job gives up with it
        ("kill -TERM $$", 1, 128 + 15),  # a stop request (scancel, the time limit): the job ends with it
        ("exit 1", 1, 1),  # it could not start: starting it again would not change that
        ("exit 0", 1, 0),  # handed over to its successor
    ],
)
def test_the_gateway_script_starts_a_crashed_gateway_again_and_nothing_else(tmp_path, dies, runs, rc):
    """gateway.sub's loop, with a stand-in for the interpreter that ends as `dies` says (the back-off between
    starts, 1 + 2 + ... s, taken out). The cluster side: tests/test_gateway_job_cluster.py."""
    spec = parse_spec(spec_text("svc", tmp_path / "ckpt", tmp_path / "runs", gateway={}), check_files=False)
    script = R.render_scripts(spec, tmp_path / "runs" / "svc-1")[GATEWAY_SUB_NAME]
    stand_in = tmp_path / "python"
    stand_in.write_text(f"#!/bin/bash\necho started >> {tmp_path}/starts\n{dies}\n")
    stand_in.chmod(0o755)
    script = script.replace(shlex.quote(sys.executable), str(stand_in)).replace('sleep "$restarts"', ":")
    env = {**os.environ, "HPC_SERVE_JOB_ID": "local-1", "HPC_SERVE_HOME": str(tmp_path / "home")}
    env.pop("SLURM_JOB_ID", None)
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, (tmp_path / "starts").read_text().count("started")) == (rc, runs), done.stderr
    if runs > 1:
        assert "starting it again (5 of 5)" in done.stderr and "giving up" in done.stderr


@pytest.mark.slow
def test_render_writes_the_gateway_script_and_removes_it_when_disabled(tmp_path, tiny_gpt2):
    deploy = tmp_path / "runs" / "svc-1"
    spec = parse_spec(spec_text("svc", tiny_gpt2, tmp_path / "runs", gateway={}))
    out = R.render(spec, deploy)
    assert out.gateway_sub == Deployment(deploy).gateway_sub and out.gateway_sub.is_file()
    again = R.render(spec.model_copy(update={"gateway": None}), deploy)
    assert again.gateway_sub is None and not Deployment(deploy).gateway_sub.exists()


# ------------------------------------------------------------------------------------- the address record
def test_accepted_connections_send_without_delay():
    """asyncio sets TCP_NODELAY on an accepted connection only when the listening socket's proto is TCP
    (asyncio.base_events._set_nodelay); a socket made without it delays every response with a body ~40 ms.
    Checked on a connection the listening socket really accepted, as asyncio's own transport sets it."""
    import asyncio
    import socket

    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    async def main() -> None:
        async def handle(reader, writer):
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()

    asyncio.run(main())
    assert seen and seen[0] != 0


def test_advertised_address():
    assert advertised("127.0.0.1") == "127.0.0.1"
    assert advertised("node7.cluster") == "node7.cluster"
    assert advertised("10.1.2.3") == "10.1.2.3"
    every = advertised("0.0.0.0")
    assert every not in ("0.0.0.0", "127.0.0.1") and not every.startswith("127."), every


def test_withdraw_removes_only_its_own_record(tmp_path):
    target = Target(tmp_path, "svc", tmp_path)
    mine = GatewayRecord(name="svc", url="http://127.0.0.1:1", host="h", pid=1, started_at=1.0)
    publish(target, mine)
    assert read_gateway(record_path(target)) == mine
    assert not withdraw(target, GatewayRecord(name="svc", url=mine.url, host="h", pid=2, started_at=2.0))
    assert record_path(target).exists() and withdraw(target, mine) and not record_path(target).exists()


def _start_gateway(target: str, log: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, "gateway", target, "--port", "auto", "--refresh", "1", *extra],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def _published(path: Path, proc: subprocess.Popen, log: Path) -> GatewayRecord:
    def record():
        assert proc.poll() is None, log.read_text()
        found = read_gateway(path)
        return found if found is not None and found.pid == proc.pid else None

    return wait_for(record, 60, "the gateway's address record")


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.mark.slow
def test_record_published_refused_beside_a_live_gateway_and_withdrawn(hpc_home, tmp_path, tiny_gpt2):
    spec = tmp_path / "svc.yaml"
    spec.write_text(spec_text("svc", tiny_gpt2, tmp_path / "runs"))
    (tmp_path / "runs").mkdir()
    path = gateway_record(tmp_path / "runs", "svc")
    # a stale record: a gateway that was SIGKILLed, its port closed now
    publish(
        Target((tmp_path / "runs").resolve(), "svc", tiny_gpt2),
        GatewayRecord(name="svc", url="http://127.0.0.1:9", pid=1),
    )
    proc = _start_gateway(str(spec), tmp_path / "gw.log", "--host", "127.0.0.1")
    try:
        record = _published(path, proc, tmp_path / "gw.log")
        assert record.url.startswith("http://127.0.0.1:") and record.job_id == "" and record.started_at > 0
        health = httpx.get(record.url + "/gateway/health", timeout=5).json()
        assert health == {
            "name": "svc",
            "workdir": str((tmp_path / "runs").resolve()),
            "pid": proc.pid,
            "replicas_ready": 0,
        }

        # no replica to send to: status says IDLE, not READY, and the access log names the 503
        from hpc.jobs.gateway import deployment_gateway
        from hpc.serving.gateway_record import IDLE, IDLE_REASON

        line = deployment_gateway(resolve_target(str(spec)))
        assert line is not None and (line.state, line.reason) == (IDLE, IDLE_REASON)
        assert line.summary().startswith(f"gateway on {record.host} (pid {proc.pid}) IDLE {record.url} (no replica")
        body = {"model": "svc", "prompt": "hi", "max_tokens": 1}
        assert httpx.post(record.url + "/v1/completions", json=body, timeout=10).status_code == 503
        log = wait_for(
            lambda: '"status": 503' in (text := (tmp_path / "gw.log").read_text()) and text, 10, "the access log"
        )
        (logged,) = [json.loads(x[x.index("{") :]) for x in log.splitlines() if '"status": 503' in x]
        assert logged["error"] == "no_replica", logged

        second = cli("gateway", str(spec), "--port", "auto", check=False, timeout=60)
        assert second.returncode == 2 and f"already runs at {record.url}" in second.stderr, second.stderr
        assert read_gateway(path) == record, "the refused gateway leaves the record alone"

        shown = cli("endpoints", str(spec)).stdout.splitlines()
        assert shown[0].startswith(f"gateway ({record.host} (pid {proc.pid})): {record.url}"), shown
        env = cli("endpoints", str(spec), "--format", "env").stdout.splitlines()
        assert env == [f"GATEWAY_URL={record.url}", f"OPENAI_BASE_URL={record.url}/v1"]
        assert _stop(proc) in (0, -signal.SIGTERM)
        assert not path.exists(), "a clean stop removes the record"
        assert cli("endpoints", str(spec), check=False).returncode == 3
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_record_answered_by_another_deployment_is_stale(hpc_home, tmp_path, tiny_gpt2):
    """Another deployment's gateway now listens where this one's record points (a reused port): not live."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for name in ("one", "two"):
        (tmp_path / f"{name}.yaml").write_text(spec_text(name, tiny_gpt2, runs))
    one = _start_gateway(str(tmp_path / "one.yaml"), tmp_path / "one.log", "--host", "127.0.0.1")
    two = None
    try:
        record = _published(gateway_record(runs, "one"), one, tmp_path / "one.log")
        target_two = Target(runs.resolve(), "two", tiny_gpt2)
        assert not answers(GatewayRecord(name="two", url=record.url), target_two)
        publish(target_two, GatewayRecord(name="two", url=record.url, pid=one.pid))
        two = _start_gateway(str(tmp_path / "two.yaml"), tmp_path / "two.log", "--host", "127.0.0.1")
        assert _published(gateway_record(runs, "two"), two, tmp_path / "two.log").url != record.url
    finally:
        for proc in (one, two):
            if proc is not None and proc.poll() is None:
                _stop(proc)


@pytest.mark.slow
def test_the_gateway_as_a_local_job(hpc_home, tmp_path, tiny_gpt2):
    """A `GatewayJob` with the local executor: status READY with the URL once the record answers; cancel by
    its id stops it and the record goes (the Slurm side: tests/test_gateway_job_cluster.py)."""
    from hpc.jobs.executors import LocalExecutor
    from hpc.jobs.kinds import GatewayJob, job_class_of
    from hpc.jobs.track import cancel, job_status

    runs = tmp_path / "runs"
    spec = parse_spec(spec_text("svc", tiny_gpt2, runs, gateway={"host": "127.0.0.1"}))
    deploy = R.render(spec, runs / "svc-1").deploy_dir
    ref = LocalExecutor().submit(GatewayJob, deploy)
    try:
        assert job_class_of(ref.job_dir) is GatewayJob and job_status(ref).kind == "gateway"
        ready = wait_for(lambda: (s := job_status(ref)).state == "READY" and s, 60, "the gateway job to be READY")
        record = read_gateway(gateway_record(runs, "svc"))
        assert record is not None and record.job_id == ref.job_id and ready.url == record.url
        assert f"{ref.job_id} READY (gateway) {record.url}" == ready.summary()
        shown = json.loads(cli("status", "svc", "--json").stdout)
        assert shown["gateway"]["job_id"] == ref.job_id and shown["gateway"]["state"] == "READY"
        # a second gateway job (two submits at once): it finds the first one live, and says so as it fails
        second = LocalExecutor().submit(GatewayJob, deploy)
        failed = wait_for(lambda: (s := job_status(second)).done and s, 60, "the second gateway job to end")
        assert failed.state == "FAILED" and f"already runs at {record.url}" in (failed.reason or ""), failed
        assert read_gateway(gateway_record(runs, "svc")) == record
        started = time.monotonic()
        status = cancel(ref, grace_s=10)
        assert status.state == "CANCELLED" and status.gateway is not None and status.gateway.state == "CANCELLED"
        assert not gateway_record(runs, "svc").exists()
        # the bound that is the feature: a cancel ends within its grace (10 s), SIGKILL after it; 60 s leaves the
        # cancel's own start and the kill room on a machine whose cores other processes take, and still tells
        # a cancel that waits for good
        assert time.monotonic() - started < 60
    finally:
        state = json.loads(ref.paths.local_state.read_text())
        if state.get("state") == "RUNNING":
            os.kill(int(state["child_pid"]), signal.SIGKILL)


@pytest.mark.slow
def test_two_submits_at_once_start_one_gateway_job(hpc_home, tmp_path, tiny_gpt2):
    """ensure_gateway under the deployment's gateway lock: of two submits deciding at the same moment, one submits
    the gateway job and the other finds it under way (without the lock both saw none and submitted one each)."""
    from concurrent.futures import ThreadPoolExecutor

    from hpc.jobs.executors import LocalExecutor
    from hpc.jobs.gateway import ensure_gateway, gateway_jobs
    from hpc.jobs.track import cancel
    from hpc.serving.deployment import target_of_folder

    runs = tmp_path / "runs"
    spec = parse_spec(spec_text("duo", tiny_gpt2, runs, gateway={"host": "127.0.0.1"}))
    deploy = R.render(spec, runs / "duo-1").deploy_dir
    barrier = threading.Barrier(2)

    def submit_one():
        barrier.wait()
        return ensure_gateway(deploy, LocalExecutor())

    with ThreadPoolExecutor(2) as pool:
        starts = list(pool.map(lambda _: submit_one(), range(2)))
    jobs = gateway_jobs(target_of_folder(deploy))
    try:
        assert sorted(s.submitted for s in starts) == [False, True], starts
        assert len(jobs) == 1 and {s.line.job_id for s in starts} == {jobs[0].job_id}
    finally:
        for ref in jobs:
            cancel(ref, grace_s=10)


@pytest.mark.slow
def test_cancel_of_a_deployment_whose_serving_jobs_ended_stops_its_gateway_too(hpc_home, tmp_path, tiny_gpt2):
    """After the serving job FAILED (a worker killed), `hpc-serve cancel NAME` must not say "no job under way" and
    leave the gateway job serving 503s until its time limit: the gateway goes with the cancel of the last serving
    job (hpc/jobs/track.py `after_cancel`), or, when none is left, with the cancel of the deployment."""
    from hpc.jobs.chain import cancel_deployment
    from hpc.jobs.executors import LocalExecutor
    from hpc.jobs.gateway import ensure_gateway, gateway_jobs
    from hpc.jobs.kinds import GatewayJob
    from hpc.jobs.track import cancel
    from hpc.serving.deployment import target_of_folder

    runs = tmp_path / "runs"
    spec = parse_spec(spec_text("ended", tiny_gpt2, runs, gateway={"host": "127.0.0.1"}))
    deploy = R.render(spec, runs / "ended-1").deploy_dir
    started = ensure_gateway(deploy, LocalExecutor())
    target = target_of_folder(deploy)
    (gateway,) = gateway_jobs(target)
    try:
        wait_for(lambda: GatewayJob(gateway, target).status().state == "READY", 60, "the gateway to serve")
        result = cancel_deployment(target, grace_s=10)
        assert [s.job_id for s in result.statuses] == [started.line.job_id], result
        assert result.statuses[0].state == "CANCELLED" and not result.not_cancelled, result
        assert read_gateway(record_path(target)) is None
    finally:
        cancel(gateway, grace_s=5)  # a no-op once the test passed


def test_a_gateway_job_that_ended_leaving_its_record_is_shown_ended_with_how_to_start_another(
    hpc_home, tmp_path, monkeypatch
):
    """Not "UNREACHABLE ... a stale record", which reads as if it might still come back (what it
    said once the gateway was killed and its job FAILED)."""
    from hpc.jobs.executors import SlurmExecutor
    from hpc.jobs.gateway import deployment_gateway
    from launcher.contracts.layout import GATEWAY_JOB_MARKER_NAME
    from tests.plans import write_plan

    deploy = tmp_path / "runs" / "svc-1"
    write_plan(deploy, name="svc")
    job = JobPaths(deploy, "77").create()
    (job.folder / GATEWAY_JOB_MARKER_NAME).touch()
    monkeypatch.setattr(SlurmExecutor, "scheduler_state", lambda self, ref: ("FAILED", None))
    target = Target(tmp_path / "runs", "svc", tmp_path, named_folder=deploy)
    dead = GatewayRecord(name="svc", url="http://127.0.0.1:9", host="node1", pid=1, job_id="77", started_at=1.0)
    publish(target, dead)
    line = deployment_gateway(target)
    assert line is not None and (line.state, line.job_id) == ("FAILED", "77"), line
    assert line.reason is not None and line.reason.endswith(f"`sbatch {deploy}/gateway.sub` starts another"), line
    publish(target, dataclasses.replace(dead, job_id=""))  # a gateway started by hand, killed: no job to ask
    assert deployment_gateway(target).state == "UNREACHABLE"
