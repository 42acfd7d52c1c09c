"""Renewal without a cluster: the `renew:` section and its checks, what render writes for it, the renewer's timing
rules and parsers (launcher/contracts/renew_plan.py), the chain marker rules, the chain view, and discovery's draining."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from hpc.jobs.chain import chain_lines, chain_links
from hpc.jobs.status import JobStatus
from hpc.render.jobfiles import render
from hpc.serving.balancer import Replica
from hpc.serving.deployment import Target
from hpc.serving.discovery import draining_jobs, mark_draining
from hpc.spec import SpecError, load_spec
from hpc.spec.checks import slurm_time_seconds
from hpc.spec.renew import duration_seconds, format_duration
from launcher.contracts import successor
from launcher.contracts.config import RENEW_NOTICE_S, RENEW_STARTUP_S, STOP_LEAD_S
from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.records import ChainRecord, EndpointRecord, RenewStop, read_chain, write_json_atomic
from launcher.contracts.renew_plan import (
    ENV_CHAIN_INDEX,
    ENV_PREDECESSOR,
    RenewPlan,
    active_requests,
    chain_place,
    successor_env,
)
from launcher.contracts.slurm import Slurm, parse_slurm_time
from launcher.contracts.stop_records import BY_CANCEL, DrainingMark, StopNotice, StopRequest
from launcher.jobscript import renew
from launcher.jobscript.renew import Renewer
from tests.e2e import bare_spec
from tests.test_slurm import fake_command


def _spec(tmp_path: Path, time_limit: str = "00:02:00", **extra) -> Path:
    return bare_spec(tmp_path, "rn", time_limit, **extra)


def _problems(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path, check_files=False)
    return "\n".join(str(p) for p in info.value.problems)


# ------------------------------------------------------------------------------------------------ the section
@pytest.mark.parametrize(
    ("text", "seconds"), [("15m", 900), ("90s", 90), ("1h30m", 5400), ("2d", 172800), ("1d2h3m4s", 93784)]
)
def test_durations(text, seconds):
    assert duration_seconds(text) == seconds
    assert duration_seconds(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("5:30", 330), ("01:02:03", 3723), ("2-3", 183600), ("1-00:30", 88200), ("1-1:1:1", 90061)],
)
def test_slurm_times(text, seconds):
    assert slurm_time_seconds(text) == seconds
    assert slurm_time_seconds("UNLIMITED") is None


def test_before_within_the_time_limit_is_accepted(tmp_path):
    spec = load_spec(
        _spec(tmp_path, renew={"before": "1m", "max_jobs": 3, "until": "2031-05-01 12:00"}), check_files=False
    )
    assert spec.renew is not None and spec.renew.before_s == 60 and spec.renew.drain_s == 60
    assert spec.renew.until_epoch == datetime(2031, 5, 1, 12, 0).timestamp()


@pytest.mark.parametrize(
    ("renew", "time_limit", "expected"),
    [
        ({"before": "30s"}, "00:02:00", "renew.before: 30s is too short: the ordered stop begins 30 s before"),
        ({"before": "2m"}, "00:02:00", "must be shorter than slurm.time 00:02:00 minus 30 s of start-up"),
        ({"before": "1m"}, "UNLIMITED", "renew: renew needs a time limit, but slurm.time is UNLIMITED"),
        ({"before": 90}, "00:02:00", "renew.before: got the number 90: give a unit"),
        ({"before": "10x"}, "00:02:00", "'10x' is not a duration; use e.g. 15m, 90s, 1h30m or 1d"),
        ({"before": "1m", "max_jobs": 0}, "00:02:00", "renew.max_jobs"),
        ({"before": "1m", "drain": "soon"}, "00:02:00", "renew.drain: 'soon' is not a duration"),
        ({"befor": "1m"}, "00:02:00", "renew.befor"),
    ],
)
def test_bad_renew_sections_name_the_field_and_the_fix(tmp_path, renew, time_limit, expected):
    assert expected in _problems(_spec(tmp_path, time_limit, renew=renew))


def test_the_bounds_of_before_are_the_stop_lead_and_the_start_up(tmp_path):
    least = STOP_LEAD_S + RENEW_STARTUP_S
    assert f"use {format_duration(least)} or more" in _problems(_spec(tmp_path, renew={"before": "59s"}))
    assert "use 1m30s at most" in _problems(_spec(tmp_path, renew={"before": "91s"}))
    load_spec(_spec(tmp_path, renew={"before": "90s"}), check_files=False)


def test_a_renewing_gateway_job_needs_a_time_longer_than_renew_before(tmp_path):
    """The gateway job renews itself by renew.before too, so its time (slurm.time when not given) must leave room."""
    load_spec(_spec(tmp_path, renew={"before": "1m"}, gateway={}), check_files=False)
    load_spec(_spec(tmp_path, renew={"before": "1m"}, gateway={"time": "7-00:00:00"}), check_files=False)
    problems = _problems(_spec(tmp_path, renew={"before": "1m"}, gateway={"time": "00:01:00"}))
    assert "gateway.time: the gateway job renews itself 1m before its time limit" in problems
    assert "use 1m30s or more" in problems


def test_until_as_a_date_is_its_midnight(tmp_path):
    path = _spec(tmp_path)
    path.write_text(path.read_text() + "renew:\n  before: 1m\n  until: 2031-05-01\n")
    spec = load_spec(path, check_files=False)
    assert spec.renew is not None and spec.renew.until == datetime(2031, 5, 1)


# ------------------------------------------------------------------------------------------------ render
def test_render_writes_the_renew_plan_and_the_renewer_line(tmp_path):
    gateway = {"time": "7-00:00:00", "refresh_s": 9}
    spec = load_spec(_spec(tmp_path, renew={"before": "1m", "max_jobs": 4}, gateway=gateway), check_files=False)
    rendered = render(spec, tmp_path / "D")
    plan = LaunchPlan.read(rendered.launch).renew
    assert plan == RenewPlan(
        before_s=60, stop_lead_s=STOP_LEAD_S, time_limit_s=120, max_jobs=4, until=None, drain_s=60, notice_s=11.0
    )
    sub = rendered.sub.read_text()
    assert f"#SBATCH --signal=B:USR1@{STOP_LEAD_S}" in sub
    renewer = f"PYTHONPATH={Deployment(rendered.deploy_dir).runtime} "
    assert renewer in sub and '-m launcher.jobscript.renew "$DEPLOY_DIR" & RENEWER=$!' in sub
    # the renewer's USR1 trap comes after the ordered stop's, so it is the one in force
    assert sub.index("trap 'kill -USR1 \"$RENEWER\" 2>/dev/null || stop_job' USR1") > sub.index(
        "trap stop_job USR1 TERM"
    )
    assert subprocess.run(["bash", "-n", str(rendered.sub)]).returncode == 0
    assert (rendered.deploy_dir / "python" / "launcher" / "jobscript" / "renew.py").is_file()


def test_without_renew_nothing_of_it_is_rendered(tmp_path):
    rendered = render(load_spec(_spec(tmp_path), check_files=False), tmp_path / "D")
    assert "renew" not in json.loads(rendered.launch.read_text())
    assert "RENEWER" not in rendered.sub.read_text() and "\n\n\n" not in rendered.sub.read_text()


# ------------------------------------------------------------------------------------------------ timing rules
PLAN = RenewPlan(before_s=900, stop_lead_s=30, drain_s=60, notice_s=7, max_jobs=3, until=2_000_000_000.0)


def test_when_a_renewer_acts():
    end = 1_900_000_000.0
    assert PLAN.renew_at(end) == end - 900
    assert PLAN.stop_at(end) == end - 30
    assert PLAN.final_drain_at(end) == end - 37  # no successor serves: no new requests 7 s before the stop
    marked = end - 800
    assert PLAN.idle_from(marked) == marked + 7
    assert PLAN.drain_until(marked, end) == marked + 67  # notice, then the drain timeout
    assert PLAN.drain_until(end - 50, end) == end - 30  # but never past the ordered stop's lead


def test_why_no_successor():
    now = 1_900_000_000.0
    assert PLAN.why_not(1, now) is None and PLAN.why_not(2, now) is None
    assert PLAN.why_not(3, now) == "renew.max_jobs 3 reached: this is job 3 of the chain"
    assert PLAN.why_not(1, 2_000_000_000.0).startswith("renew.until ")
    assert PLAN.why_not(1, now, "the deployment was cancelled") == "the deployment was cancelled"
    assert RenewPlan(before_s=60, stop_lead_s=30).why_not(10_000, now) is None


def test_plan_of_launch_json():
    plan = RenewPlan.from_dict({"before_s": 60, "stop_lead_s": 30})
    assert plan == RenewPlan(before_s=60, stop_lead_s=30, notice_s=RENEW_NOTICE_S)
    assert RenewPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ValueError, match="stop_lead_s is required"):
        RenewPlan.from_dict({"before_s": 60})
    with pytest.raises(ValueError, match="before_s must be a number"):
        RenewPlan.from_dict({"before_s": "soon", "stop_lead_s": 30})


def test_slurm_times_and_active_requests_are_parsed():
    assert parse_slurm_time("2031-05-01T12:00:00") == datetime(2031, 5, 1, 12).timestamp()
    assert parse_slurm_time("N/A") is None and parse_slurm_time("Unknown") is None
    page = (
        '# TYPE nv_trt_llm_request_metrics gauge\nnv_trt_llm_request_metrics{model="tensorrt_llm",'
        'request_type="active",version="1"} 2\nnv_trt_llm_request_metrics{model="tensorrt_llm",'
        'request_type="max",version="1"} 64\nnv_trt_llm_request_metrics{model="tensorrt_llm",'
        'request_type="waiting",version="1"} 1\n'
    )
    assert active_requests(page) == 3
    assert active_requests(page.replace(" 2\n", " 0\n").replace(" 1\n", " 0\n")) == 0
    assert active_requests("nv_inference_count 4\n") is None


def test_the_successor_gets_the_submitters_environment_not_this_jobs():
    environ = {
        "SLURM_JOB_ID": "7",
        "SLURM_MEM_PER_NODE": "4000",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SBATCH_ACCOUNT": "proj",
        "HOME": "/home/u",
        "PYTHONPATH": "/D/python:/site",
        ENV_CHAIN_INDEX: "2",
    }
    env = successor_env(environ, "7", 2, runtime_root="/D/python")
    assert "SLURM_JOB_ID" not in env and "SLURM_MEM_PER_NODE" not in env
    assert env["SLURM_CONF"] == "/etc/slurm/slurm.conf" and env["SBATCH_ACCOUNT"] == "proj"
    assert env["PYTHONPATH"] == "/site" and env[ENV_PREDECESSOR] == "7"
    assert chain_place(env) == ("7", 3)
    assert chain_place({}) == ("", 1) and chain_place({ENV_CHAIN_INDEX: "x"}) == ("", 1)
    assert "PYTHONPATH" not in successor_env({"PYTHONPATH": "/D/python"}, "7", 1, "/D/python")


# ------------------------------------------------------------------------------------------------ Slurm
@pytest.fixture
def renew_slurm(tmp_path, monkeypatch) -> Path:
    """The renewer's Slurm gateway without its back-off sleeps, and a folder on PATH for fake commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(renew, "SLURM", Slurm(timeout_s=renew.QUERY_TIMEOUT_S, sleep=lambda s: None))
    return bin_dir


def test_the_renewer_retries_a_busy_controller(renew_slurm):
    """One failed squeue is not taken as "not known" for that round: launcher/contracts/slurm.py's retries hold."""
    fake_command(
        renew_slurm,
        "squeue",
        'if [ "$COUNT" -lt 2 ]; then echo "slurm_load_jobs error: Socket timed out" >&2; exit 1; fi\n'
        'echo "9|PENDING|Resources"',
    )
    assert renew.job_state("9") == ("PENDING", "Resources") and renew.SLURM.calls["squeue"] == 3


def test_the_renewer_logs_what_failed_and_reads_a_job_gone(renew_slurm, capsys):
    fake_command(renew_slurm, "squeue", 'echo "squeue: error: Invalid user for SlurmUser" >&2; exit 1')
    fake_command(
        renew_slurm,
        "scancel",
        'echo "scancel: error: Kill job error on job id 9: Invalid job id specified" >&2; exit 1',
    )
    assert renew.job_state("9") == ("", "") and renew.job_times("9") == (None, None)
    renew.scancel("9")  # it has ended: nothing to say
    err = capsys.readouterr().err
    assert "`squeue -h -j 9 -o %S|%e` exited with 1: squeue: error: Invalid user" in err and "scancel" not in err
    fake_command(renew_slurm, "squeue", 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1')
    assert renew.job_state("9") == (successor.NOT_LISTED, "") and renew.gone_or_ended(renew.job_state("9"))


# ------------------------------------------------------------------------------------------------ markers, records
def test_a_cancel_stops_renewals_of_jobs_started_before_it_only(tmp_path):
    deploy = tmp_path / "D"
    renewer = Renewer(deploy, "7", PLAN, 1, {ENV_PREDECESSOR: "6", ENV_CHAIN_INDEX: "2"})
    assert (renewer.record.predecessor, renewer.record.index) == ("6", 2)
    assert renewer.chain_stopped() is None
    RenewStop(at=time.time()).write(Deployment(deploy).renew_stop)  # what `hpc-serve cancel` writes (hpc/jobs/chain.py)
    renewer.start = time.time() - 60
    assert renewer.chain_stopped() == "the deployment was cancelled (hpc-serve cancel)"
    renewer.start = time.time() + 60  # submitted by hand again after that cancel: it renews
    assert renewer.chain_stopped() is None
    renewer.paths.create()
    StopRequest(at=time.time(), by=BY_CANCEL).write(renewer.paths.cancel_marker)
    assert renewer.chain_stopped() == "this job was cancelled (hpc-serve cancel)"


def test_a_requeued_job_keeps_its_place_and_its_successor(tmp_path):
    paths = JobPaths(tmp_path / "D", "7")
    write_json_atomic(paths.chain, ChainRecord(job_id="7", index=4, successor="9").to_dict())
    renewer = Renewer(tmp_path / "D", "7", PLAN, 1, {})
    assert (renewer.record.index, renewer.record.successor) == (4, "9")
    renewer.save(note="x")
    assert read_chain(paths) == ChainRecord(job_id="7", index=4, successor="9", note="x")
    assert ChainRecord.from_dict({"job_id": 7, "successor": 9, "extra": 1}).successor == "9"


def test_a_successor_that_ends_before_ready_is_replaced_a_bounded_number_of_times(tmp_path, capsys):
    """A successor whose rank died while loading (e.g. tritonserver 2.51's python backend aborting under load):
    the job submits another at once, and serves on; after SUCCESSOR_ATTEMPTS lost, no more."""
    from launcher.jobscript.renew import SUCCESSOR_ATTEMPTS

    renewer = Renewer(tmp_path / "D", "7", PLAN, 1, {})
    renewer.paths.create()
    phases = [renewer.successor_lost(str(10 + n), "FAILED") for n in range(SUCCESSOR_ATTEMPTS)]
    assert phases == ["wait"] * (SUCCESSOR_ATTEMPTS - 1) + ["serve"]
    assert (
        read_chain(renewer.paths).note
        == f"successor 12 ended (FAILED) before it was READY; {SUCCESSOR_ATTEMPTS} successors did: no more"
    )
    assert (
        "successor 10 ended (FAILED) before it was READY; submitting another (2 of at most 3)"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("drain_s", "readings", "note"),
    [
        (3600, [2, 1, None, 0], "handed over to 9: no request in flight"),
        (0, [1], "handed over to 9: drain timeout with 1 requests in flight"),
        (0, [None], "handed over to 9: drain timeout with an unknown number of requests in flight"),
    ],
)
def test_the_draining_phase_stops_once_nothing_is_in_flight_or_at_the_drain_timeout(
    tmp_path, monkeypatch, drain_s, readings, note
):
    """The renewer's DRAINING phase: once the successor is READY it marks the job draining and reads what the
    replicas hold (`in_flight`: the engine's and the model's counts, renew_plan.active_requests) until it reads 0,
    then starts the ordered stop; a count it cannot read (None) is not 0. With the drain time spent, it stops with
    what is left, saying how many."""
    paths = JobPaths(tmp_path / "D", "7")
    write_json_atomic(paths.chain, ChainRecord(job_id="7", index=1, successor="9").to_dict())
    plan = RenewPlan(before_s=900, stop_lead_s=30, drain_s=drain_s, notice_s=0)
    now = time.time()
    monkeypatch.setattr(renew, "job_times", lambda job: (now - 60, now + 3600))
    monkeypatch.setattr(renew, "POLL_S", 0.01)
    left = list(readings)
    read: list[int | None] = []

    def in_flight(job_paths: JobPaths) -> int | None:
        assert job_paths == paths and DrainingMark.read(paths.draining) is not None, "read only once draining"
        read.append(left.pop(0))
        return read[-1]

    monkeypatch.setattr(renew, "in_flight", in_flight)
    monkeypatch.setattr(Renewer, "successor_ready", lambda self, successor: successor == "9")
    stops: list[str] = []
    monkeypatch.setattr(Renewer, "stop", lambda self, why: stops.append(why) or 0)
    assert Renewer(tmp_path / "D", "7", plan, 1, {}).run() == 0
    assert (read, stops) == (readings, [note])
    assert DrainingMark.read(paths.draining).successor == "9"


# ------------------------------------------------------------------------------------------------ readers
def _deployment(tmp_path: Path) -> tuple[Target, Path]:
    deploy = tmp_path / "runs" / "rn-20310101-000000"
    deploy.mkdir(parents=True)
    Deployment(deploy).spec.write_text("name: rn\n")
    return Target(tmp_path / "runs", "rn", tmp_path), deploy


def test_chain_view_names_a_pending_successor_and_why(tmp_path):
    target, deploy = _deployment(tmp_path)
    write_json_atomic(
        JobPaths(deploy, "11").chain, ChainRecord(job_id="11", successor="12", started_at=1.0, ends_at=2.0).to_dict()
    )
    JobPaths(deploy, "12").create()
    JobPaths(deploy, "5").create()  # a job that does not renew (no record, named by none): not in the chain
    statuses = {"11": JobStatus("11", "READY"), "12": JobStatus("12", "PENDING", reason="Resources")}
    first, second = chain_links(target, statuses)
    assert first.next == "successor 12 pending: Resources; 11 serves until its end"
    assert (second.job_id, second.predecessor, second.next) == ("12", "11", "-")
    lines = chain_lines([first, second])
    assert lines[0] == "chain (2 jobs):" and lines[2].split()[:2] == ["11", "READY"]


def test_discovery_drains_a_handed_over_or_stopping_job_only_while_another_serves(tmp_path):
    """A renewer's mark drains a whole job; a leader's stopping mark its own replica (job 2's replica 1, rank 2,
    serves on while replica 0 stops: replica_policy restart or keep-serving)."""
    target, deploy = _deployment(tmp_path)
    for job in ("1", "2", "3", "4"):
        JobPaths(deploy, job).create()
    DrainingMark(at=1.0, successor="3").write(JobPaths(deploy, "1").draining)
    for replica, rank in ((0, 0), (1, 2)):
        record = EndpointRecord(job_id="2", replica=replica, rank=rank, address="n", http_port=1)
        record.write(JobPaths(deploy, "2").endpoint(replica))
    StopNotice(signal="SIGTERM", at=1.0, drain_until=11.0).write(JobPaths(deploy, "2").stopping(0))
    DrainingMark(at=1.0, final=True).write(JobPaths(deploy, "4").draining)
    draining = draining_jobs(target)
    assert draining == {"1": False, "2/0": True, "4": True}
    serving_on = [Replica(key=key, http_url="", grpc_url="") for key in ("2/0", "2/1")]
    mark_draining(serving_on, draining)
    assert [r.draining for r in serving_on] == [True, False]

    def replicas(*jobs: str) -> list[Replica]:
        return [Replica(key=f"{job}/0", http_url="", grpc_url="") for job in jobs]

    both = replicas("1", "3")
    mark_draining(both, draining)
    assert [r.draining for r in both] == [True, False]
    alone = replicas("1")  # handed over, but its successor is not ready here: better a draining one than none
    mark_draining(alone, draining)
    assert [r.draining for r in alone] == [False]
    ending = replicas("2", "4")  # stopping, or ending without a successor: drain even alone
    mark_draining(ending, draining)
    assert [r.draining for r in ending] == [True, True]


def test_layout_names_are_inside_the_job_and_deployment_folders(tmp_path):
    paths = JobPaths(tmp_path / "D", "7")
    assert paths.chain.parent == paths.draining.parent == paths.folder
    assert Deployment(tmp_path / "D").renew_stop.parent == tmp_path / "D"
    assert os.path.basename(paths.chain) == "chain.json"


@pytest.mark.parametrize(
    ("slurm_says", "why"),
    [
        ("RUNNING", None),
        ("PENDING", None),
        ("COMPLETED", "no serving job of the deployment is under way"),
        ("UNKNOWN", "Slurm did not say whether a serving job of the deployment is under way; asking again"),
    ],
)
def test_the_gateway_renews_while_a_serving_job_is_under_way_and_asks_again_soon_when_slurm_cannot_say(
    tmp_path, monkeypatch, slurm_says, why
):
    """A sacct that timed out (UNKNOWN) is no "none under way": the renewer asks again within UNSURE_RETRY_S, not a
    minute later, when a gateway job with `before: 1m` would have no time left for its successor (CI, 2026-11-28:
    the predecessor ended TIMEOUT)."""
    from hpc.jobs import renewal
    from hpc.jobs.executors import SlurmExecutor
    from launcher.contracts.layout import GATEWAY_JOB_MARKER_NAME
    from tests.plans import write_plan

    deploy = tmp_path / "fake-1"
    write_plan(deploy, name="fake", replicas=1, world_size_per_replica=1)
    JobPaths(deploy, "100").create()
    gateway = JobPaths(deploy, "101").create()
    (gateway.folder / GATEWAY_JOB_MARKER_NAME).touch()
    monkeypatch.setattr(SlurmExecutor, "scheduler_state", lambda self, ref: (slurm_says, None))
    target = Target(tmp_path, "fake", tmp_path, named_folder=deploy)
    renewer = renewal.GatewayRenewer(deploy, target, "101", RenewPlan(before_s=60, stop_lead_s=30))
    assert renewer.why_not(time.time()) == why
    assert renewal.UNSURE_RETRY_S < renewal.END_REFRESH_S / 4


def test_the_gateway_logs_its_pending_successor_and_replaces_one_that_ended_before_it_served(
    tmp_path, renew_slurm, monkeypatch, caplog
):
    """A successor PENDING on Resources is said in the gateway's log (else one may wait out its predecessor's
    limit with no word of why); one that ended before it served is replaced at once, at most
    SUCCESSOR_ATTEMPTS times, as a serving job's successor is."""
    import logging

    from hpc.jobs import renewal
    from hpc.jobs.executors import SlurmExecutor
    from launcher.contracts.layout import GATEWAY_JOB_MARKER_NAME
    from tests.plans import write_plan

    deploy = tmp_path / "fake-1"
    write_plan(deploy, name="fake", replicas=1, world_size_per_replica=1)
    JobPaths(deploy, "100").create()
    (JobPaths(deploy, "101").create().folder / GATEWAY_JOB_MARKER_NAME).touch()
    monkeypatch.setattr(SlurmExecutor, "scheduler_state", lambda self, ref: ("RUNNING", None))
    target = Target(tmp_path, "fake", tmp_path, named_folder=deploy)
    renewer = renewal.GatewayRenewer(deploy, target, "101", RenewPlan(before_s=60, stop_lead_s=30))
    caplog.set_level(logging.INFO, logger="hpc_serve.gateway")
    fake_command(renew_slurm, "squeue", 'echo "9|PENDING|Resources"')
    renewer.successor = "9"
    renewer.watch_successor()
    renewer.watch_successor()  # said once, while it stays so
    assert caplog.messages == ["gateway job 101: its successor 9 is PENDING (Resources)"]
    assert renewer.successor == "9" and renewer.why_not(time.time()) is None
    fake_command(renew_slurm, "squeue", 'echo "9|FAILED|NonZeroExitCode"')
    for attempt in range(1, renewal.SUCCESSOR_ATTEMPTS + 1):
        renewer.successor = "9"
        renewer.watch_successor()
        assert renewer.successor is None and renewer.lost == attempt
    assert "ended (FAILED) before it served; submitting another" in caplog.messages[2]
    assert caplog.messages[-1].endswith(f"{renewal.SUCCESSOR_ATTEMPTS} did: no more")
    assert renewer.why_not(time.time()) == f"{renewal.SUCCESSOR_ATTEMPTS} successors ended before they served: no more"
