"""Autoscaling without a cluster: the `autoscale:` section and its checks, the policy (hpc/serving/autoscale.py)
on replayed traces with a fake clock, the decisions record, and the actuator's acts on a deployment folder."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from hpc.cli.views import deployment_status
from hpc.jobs.autoscale import DRAIN_NOTICE_S, Controller, Load, balancer_load, decision_lines
from hpc.jobs.kinds import ServingJob
from hpc.render.jobfiles import render
from hpc.serving.autoscale import Decision, JobView, Phase, Policy, Settings, Snapshot
from hpc.serving.balancer import Balancer, NoReplica, Replica
from hpc.serving.gateway_record import record_path
from hpc.spec import SpecError, load_spec
from launcher.contracts.autoscale import Action, AutoscaleRecord, DecisionRecord
from launcher.contracts.layout import SUB_NAME, Deployment, JobPaths
from launcher.contracts.records import GatewayRecord, RenewStop
from launcher.contracts.renew_plan import RenewPlan
from launcher.contracts.stop_records import BY_AUTOSCALE, DrainingMark, StopRequest
from launcher.jobscript.renew import Renewer

PLAN = RenewPlan(before_s=120, stop_lead_s=30, drain_s=60, notice_s=7)


def _spec(tmp_path: Path, **extra) -> Path:
    from tests.e2e import bare_spec  # (tests/test_renew.py's spec writer too)

    return bare_spec(tmp_path, "as", **extra)


def _problems(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path, check_files=False)
    return "\n".join(str(p) for p in info.value.problems)


# ------------------------------------------------------------------------------------------------ the section
def test_an_autoscale_section_with_a_gateway_is_accepted(tmp_path):
    spec = load_spec(
        _spec(
            tmp_path,
            gateway={},
            slurm={"time": "00:10:00", "gpus_per_node": 1},
            autoscale={"min_jobs": 0, "max_jobs": 3, "scale_up_after": "5s", "scale_down_after": "1m", "gpu_budget": 2},
        ),
        check_files=False,
    )
    scale = spec.autoscale
    assert scale is not None and scale.min_jobs == 0 and scale.max_jobs == 3 and scale.gpu_budget == 2
    assert (scale.scale_up_after_s, scale.scale_down_after_s, scale.horizon_s) == (5, 60, 900)
    assert spec.gpus_per_job == 1 and not scale.advisory


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"autoscale": {"max_jobs": 2}}, "autoscale: autoscale: runs in the gateway job, but the spec has no gateway:"),
        (
            {"gateway": {"enabled": False}, "autoscale": {"max_jobs": 2}},
            "gateway.enabled is false; set it true",
        ),
        ({"gateway": {}, "autoscale": {}}, "autoscale.max_jobs"),
        ({"gateway": {}, "autoscale": {"max_jobs": 1, "min_jobs": 2}}, "min_jobs 2 is more than max_jobs 1"),
        ({"gateway": {}, "autoscale": {"max_jobs": 2, "min_jobs": -1}}, "autoscale.min_jobs"),
        ({"gateway": {}, "autoscale": {"max_jobs": 2, "scale_up_after": 30}}, "got the number 30: give a unit"),
        ({"gateway": {}, "autoscale": {"max_jobs": 2, "scale_down_after": "later"}}, "'later' is not a duration"),
        ({"gateway": {}, "autoscale": {"max_jobs": 2, "scale_up_afer": "1m"}}, "did you mean 'scale_up_after'?"),
        (
            {"gateway": {"max_outstanding": 8}, "autoscale": {"max_jobs": 2, "target_outstanding": 8}},
            "autoscale.target_outstanding: 8 requests per replica is not below gateway.max_outstanding 8",
        ),
        (
            {"gateway": {}, "autoscale": {"max_jobs": 2, "gpu_budget": 4}},
            "autoscale.gpu_budget: the budget counts slurm.nodes × slurm.gpus_per_node per job, but "
            "slurm.gpus_per_node is 0",
        ),
        (
            {
                "gateway": {},
                "slurm": {"time": "00:10:00", "gpus_per_node": 2},
                "autoscale": {"max_jobs": 3, "min_jobs": 2, "gpu_budget": 3},
            },
            "autoscale.gpu_budget: 3 GPUs cannot hold 2 job(s) of 2 GPUs; use 4 or more",
        ),
    ],
)
def test_bad_autoscale_sections_name_the_field_and_the_fix(tmp_path, extra, expected):
    assert expected in _problems(_spec(tmp_path, **extra))


# ------------------------------------------------------------------------------------------------ the policy
def _settings(**changes) -> Settings:
    base = {"min_jobs": 1, "max_jobs": 3, "target": 4.0, "up_after_s": 10.0, "down_after_s": 30.0}
    return Settings(**{**base, **changes})


def _job(job_id: str, phase: Phase = Phase.READY, **fields) -> JobView:
    return JobView(job_id, phase, replicas=fields.pop("replicas", 1), gpus=fields.pop("gpus", 0), **fields)


@dataclass
class World:
    """The jobs a replayed trace's decisions make: a submitted job is PENDING `start_s`, then READY; a drained one
    leaves `drain_s` later; a cancelled one at once. Every decision is kept, with the jobs it saw."""

    policy: Policy
    start_s: float = 20.0
    drain_s: float = 5.0
    jobs: dict[str, JobView] = field(default_factory=dict)
    left_at: dict[str, float] = field(default_factory=dict)
    log: list[tuple[Decision, tuple[JobView, ...]]] = field(default_factory=list)
    made: int = 0

    def step(self, now: float, outstanding: int, held: int = 0) -> Decision:
        for job_id, job in list(self.jobs.items()):
            if job.phase == Phase.PENDING and job.starts_at is not None and job.starts_at <= now:
                self.jobs[job_id] = dataclasses.replace(job, phase=Phase.READY)
            if job.phase == Phase.DRAINING and now >= self.left_at[job_id]:
                del self.jobs[job_id]
        seen = tuple(self.jobs.values())
        decision = self.policy.decide(Snapshot(now, seen, outstanding=outstanding, held=held))
        self.log.append((decision, seen))
        if decision.action == Action.SUBMIT:
            self.made += 1
            job_id = f"j{self.made}"
            self.jobs[job_id] = _job(job_id, Phase.PENDING, starts_at=now + self.start_s)
        elif decision.action == Action.CANCEL:
            del self.jobs[decision.job_id]
        elif decision.action == Action.DRAIN:
            self.jobs[decision.job_id] = dataclasses.replace(self.jobs[decision.job_id], phase=Phase.DRAINING)
            self.left_at[decision.job_id] = now + self.drain_s
        elif decision.action == Action.EXPIRE:
            self.jobs[decision.job_id] = dataclasses.replace(self.jobs[decision.job_id], phase=Phase.EXPIRING)
        return decision

    def replay(self, trace: list[tuple[float, float, int]], every_s: float = 1.0) -> None:
        """(from, to, requests in flight) spans, a decision every `every_s` seconds of the fake clock."""
        for start, end, outstanding in trace:
            now = start
            while now < end:
                self.step(now, outstanding)
                now += every_s

    def acts(self, action: Action) -> list[Decision]:
        return [d for d, _ in self.log if d.action == action]

    def serving(self) -> int:
        return sum(1 for j in self.jobs.values() if j.phase not in (Phase.DRAINING, Phase.EXPIRING))


def test_a_step_up_a_plateau_a_drop_and_idle():
    """One job at a light load; a step to 12 in flight grows it to 3 jobs, one submit at a time, none while one
    pends; the drop shrinks it by drain back to min_jobs, and idle keeps that one."""
    world = World(Policy(_settings()), jobs={"j0": _job("j0")})
    world.replay([(0, 20, 2), (20, 200, 12), (200, 400, 2), (400, 600, 0)])
    submits = world.acts(Action.SUBMIT)
    assert [d.at for d in submits] == [30, 60]  # 10 s above target; again 10 s after the first job served
    for decision, seen in world.log:
        if decision.action == Action.SUBMIT:
            assert not any(j.phase == Phase.PENDING for j in seen), "a submit while a job was pending"
    drains = world.acts(Action.DRAIN)
    assert len(drains) == 2 and drains[0].at >= 200 + 30 and drains[1].at - drains[0].at >= 30
    assert world.serving() == 1 and not world.acts(Action.CANCEL)
    assert max(len([j for j in seen if j.phase not in (Phase.DRAINING,)]) for _, seen in world.log) == 3
    on_the_way = [d for d, _ in world.log if "capacity on the way" in d.reason]
    assert on_the_way and all(d.action == Action.HOLD for d in on_the_way)


def test_a_short_spike_adds_no_job():
    world = World(Policy(_settings()), jobs={"j0": _job("j0")})
    world.replay([(0, 9, 20), (9, 60, 1)])
    assert not world.acts(Action.SUBMIT)


def test_a_pending_job_is_capacity_on_the_way_and_its_late_start_is_said():
    """Hot for a long time with a job that stays PENDING: no second submit; the reason says when it may start."""
    policy = Policy(_settings(horizon_s=600))
    jobs = (_job("j0"), _job("j1", Phase.PENDING, starts_at=5000.0))
    decisions = [policy.decide(Snapshot(float(t), jobs, outstanding=20)) for t in range(0, 300, 5)]
    assert {d.action for d in decisions} == {Action.HOLD}
    assert "capacity on the way: job j1 PENDING, estimated start" in decisions[-1].reason
    assert "beyond the horizon of 600 s" in decisions[-1].reason
    soon = policy.decide(Snapshot(300.0, (_job("j0"), _job("j1", Phase.PENDING, starts_at=400.0)), outstanding=20))
    assert "beyond the horizon" not in soon.reason


def test_the_budget_counts_hand_submitted_and_draining_jobs():
    """Budget 8 GPUs, 4 a job: a job submitted by hand (only the queue shows it) or one draining leaves no room."""
    settings = _settings(gpus_per_job=4, gpu_budget=8, up_after_s=0)
    hand = _job("h1", Phase.READY, gpus=4, ours=False)
    for other in (hand, _job("d1", Phase.DRAINING, gpus=4)):
        decision = Policy(settings).decide(Snapshot(0.0, (_job("j0", gpus=4), other), outstanding=40))
        assert decision.action == Action.HOLD and "the GPU budget 8 holds 8 in use, a job needs 4" in decision.reason
    roomy = Policy(dataclasses.replace(settings, gpu_budget=12))
    assert roomy.decide(Snapshot(0.0, (_job("j0", gpus=4), hand), outstanding=40)).action == Action.SUBMIT


def test_the_budget_holds_the_floor_too():
    settings = _settings(gpus_per_job=4, gpu_budget=4, min_jobs=2)
    decision = Policy(settings).decide(Snapshot(0.0, (_job("j0", gpus=4),)))
    assert decision.action == Action.HOLD and "below min_jobs 2" in decision.reason and "GPU budget" in decision.reason


def test_min_jobs_zero_goes_to_zero_when_idle_and_back_on_a_request():
    """Idle for scale_down_after: the last job drains. A request held with nothing serving: one submit at once,
    none more while it starts; once READY the held request is served and nothing more is submitted."""
    world = World(Policy(_settings(min_jobs=0)), jobs={"j0": _job("j0")})
    world.replay([(0, 60, 0)])
    assert [d.job_id for d in world.acts(Action.DRAIN)] == ["j0"] and world.acts(Action.DRAIN)[0].at == 30
    world.replay([(60, 100, 0)])
    assert not world.jobs and not world.acts(Action.SUBMIT)
    for t in range(100, 120):  # a request arrives and waits
        world.step(float(t), outstanding=0, held=1)
    submits = world.acts(Action.SUBMIT)
    assert [d.at for d in submits] == [100] and "1 request(s) wait with nothing serving" in submits[0].reason
    world.replay([(120, 130, 1)])
    assert len(world.acts(Action.SUBMIT)) == 1 and world.serving() == 1


def test_the_floor_is_kept_at_once():
    decision = Policy(_settings(min_jobs=2)).decide(Snapshot(0.0, (_job("j0"),)))
    assert decision.action == Action.SUBMIT and "1 job(s) under way, below min_jobs 2" in decision.reason


def test_scale_down_only_where_the_load_fits_one_job_fewer():
    """N/(N−1): two jobs at 3 in flight each (target 4) stay two, since one would carry 6; at 1.5 each one goes."""
    jobs = {"a": _job("a"), "b": _job("b")}
    world = World(Policy(_settings()), jobs=dict(jobs))
    world.replay([(0, 200, 6)])
    assert not world.acts(Action.DRAIN)
    world = World(Policy(_settings()), jobs=dict(jobs))
    world.replay([(0, 200, 3)])
    assert len(world.acts(Action.DRAIN)) == 1 and world.serving() == 1


def test_a_surplus_pending_job_is_cancelled_before_any_drain():
    world = World(Policy(_settings()), jobs={"a": _job("a"), "p": _job("p", Phase.PENDING, starts_at=1e9)})
    world.replay([(0, 100, 1)])
    assert [d.job_id for d in world.acts(Action.CANCEL)] == ["p"] and not world.acts(Action.DRAIN)


def test_a_job_close_to_its_time_limit_expires_instead_of_draining():
    settings = _settings(expire_within_s=600)
    jobs = (_job("a", ends_at=10_000.0), _job("b", ends_at=500.0))
    policy = Policy(settings)
    decisions = [policy.decide(Snapshot(float(t), jobs, outstanding=1)) for t in range(0, 40)]
    assert [(d.action, d.job_id) for d in decisions if d.action != Action.HOLD] == [(Action.EXPIRE, "b")]
    far = Policy(settings)
    decisions = [far.decide(Snapshot(float(t), (jobs[0], _job("b", ends_at=5000.0)), outstanding=1)) for t in range(40)]
    assert [(d.action, d.job_id) for d in decisions if d.action != Action.HOLD] == [(Action.DRAIN, "b")]


def test_a_renewal_successor_is_neither_new_capacity_nor_surplus():
    """A's renewer submitted B: B stands in for A. Hot: a job is still added; cool: B is never cancelled."""
    jobs = (_job("a"), _job("b", Phase.PENDING, renews="a"))
    policy = Policy(_settings(up_after_s=0))
    assert policy.decide(Snapshot(0.0, jobs, outstanding=20)).action == Action.SUBMIT
    cool = Policy(_settings())
    assert {cool.decide(Snapshot(float(t), jobs, outstanding=0)).action for t in range(100)} == {Action.HOLD}


def test_max_jobs_bounds_the_growth():
    policy = Policy(_settings(max_jobs=2, up_after_s=0))
    decision = policy.decide(Snapshot(0.0, (_job("a"), _job("b")), outstanding=40))
    assert decision.action == Action.HOLD and "at max_jobs 2" in decision.reason and decision.signal == 20


def test_a_ttft_over_the_sla_counts_as_above_target():
    policy = Policy(_settings(up_after_s=0, ttft_sla_s=1.0))
    decision = policy.decide(Snapshot(0.0, (_job("a"),), outstanding=1, ttft_s=2.5))
    assert decision.action == Action.SUBMIT and "TTFT 2.50 s above the SLA 1 s" in decision.reason


def test_a_restored_controller_keeps_its_timers():
    """A gateway job's successor passes the record's timers in: the wait for scale_up_after goes on, not anew."""
    jobs = (_job("a"),)
    assert Policy(_settings()).decide(Snapshot(100.0, jobs, outstanding=20)).action == Action.HOLD
    restored = Policy(_settings(), up_since=90.0)
    assert restored.decide(Snapshot(100.0, jobs, outstanding=20)).action == Action.SUBMIT


# ------------------------------------------------------------------------------------------------ the actuator
def _deployment(tmp_path: Path, **autoscale) -> Path:
    scale = {"max_jobs": 2, **autoscale}
    spec = load_spec(_spec(tmp_path, gateway={}, renew={"before": "2m"}, autoscale=scale), check_files=False)
    return render(spec, tmp_path / "D").deploy_dir


def _serving_job(deploy_dir: Path, job_id: str) -> JobPaths:
    paths = JobPaths(deploy_dir, job_id).create()
    ServingJob.mark(paths)
    return paths


@pytest.mark.cluster
def test_advisory_decides_records_and_acts_on_nothing(tmp_path, slurm_cluster, hpc_home):
    """Below min_jobs with no job: the decision is a submit, recorded as advised; no job is submitted."""
    deploy_dir = _deployment(tmp_path, advisory=True)
    controller = Controller.of_folder(deploy_dir, controller="g1")
    assert controller is not None
    decision = controller.tick(Load(), now=1000.0)
    assert decision.action == Action.SUBMIT and "below min_jobs 1" in decision.reason
    assert not list(Deployment(deploy_dir).jobs_dir.glob("*"))
    record = AutoscaleRecord.read(Deployment(deploy_dir).autoscale)
    assert record is not None and record.controller == "g1"
    assert [(d.action, d.advisory) for d in record.decisions] == [(Action.SUBMIT, True)]
    view = deployment_status(controller.target)
    assert view.autoscale is not None and view.to_json()["autoscale"]["decisions"][0]["action"] == "submit"
    lines = decision_lines(view.autoscale)
    assert "\n".join(lines) in view.summary()
    assert lines[0] == "autoscale decisions (controller: gateway job g1)"
    assert "submit?" in lines[2] and "below min_jobs 1" in lines[2]


@pytest.mark.cluster
def test_the_record_hands_the_controller_over(tmp_path, slurm_cluster, hpc_home):
    """A gateway job's successor reads its predecessor's record: the decisions and the timers go on."""
    deploy_dir = _deployment(tmp_path, advisory=True, min_jobs=0, scale_up_after="30s")
    first = Controller.of_folder(deploy_dir, controller="g1")
    assert first is not None
    first.tick(Load(held=0), now=1000.0)
    first.policy.up_since = 990.0
    first.note(first.policy.decide(Snapshot(1001.0, (_job("x"),), outstanding=50)))
    second = Controller.of_folder(deploy_dir, controller="g2")
    assert second is not None and second.policy.up_since == 990.0
    assert second.record.controller == "g2" and len(second.record.decisions) == 2


def test_of_two_gateways_in_a_handover_only_the_one_the_record_names_acts(tmp_path):
    deploy_dir = _deployment(tmp_path)
    first, successor = Controller.of_folder(deploy_dir, "g1"), Controller.of_folder(deploy_dir, "g2")
    assert first is not None and successor is not None
    assert first.in_charge() and successor.in_charge()  # no gateway published yet: whichever looks
    GatewayRecord(name="as", url="http://node1:1", job_id="g2").write(record_path(first.target))
    assert not first.in_charge() and successor.in_charge()


def test_a_drain_marks_the_job_then_stops_it_in_order_and_an_expiry_stops_its_renewal(tmp_path):
    deploy_dir = _deployment(tmp_path)
    controller = Controller.of_folder(deploy_dir, controller="g1")
    assert controller is not None
    paths = _serving_job(deploy_dir, "41")
    drain = Decision(1000.0, Action.DRAIN, "the load fits 1 job(s)", 1.0, 4.0, "41")
    assert controller.act(drain, 1000.0) == ("41", "")
    mark = DrainingMark.read(paths.draining)
    assert mark is not None and mark.final and paths.no_successor.exists()
    controller.follow_up(1000.0 + DRAIN_NOTICE_S / 2)
    assert not paths.stop_request.exists()  # the gateway has not looked at the mark yet
    controller.follow_up(1000.0 + DRAIN_NOTICE_S)
    stop = StopRequest.read(paths.stop_request)
    assert stop is not None and stop.by == BY_AUTOSCALE and not controller.record.draining
    other = _serving_job(deploy_dir, "42")
    assert controller.act(Decision(1000.0, Action.EXPIRE, "near its end", 1.0, 4.0, "42"), 1000.0) == ("42", "")
    assert RenewStop.read(other.no_successor) is not None and not other.draining.exists()
    renewer = Renewer(deploy_dir, "42", PLAN, 1, {})
    assert renewer.chain_stopped() == "the autoscaling controller scales the deployment down by this job"
    assert Renewer(deploy_dir, "43", PLAN, 1, {}).chain_stopped() is None


@pytest.fixture
def held_job(slurm_cluster) -> Iterator[Callable[..., str]]:
    """Submit a held job (`sbatch --hold`: PENDING (JobHeldUser) until released), as a user would by hand: a script
    under a job name; every one is scancel'ed at the end."""
    made: list[str] = []

    def submit(script: Path, name: str = "") -> str:
        named = ["-J", name] if name else []
        out = subprocess.run(
            ["sbatch", "--parsable", "--hold", "-o", "/dev/null", *named, str(script)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        made.append(out.strip().split(";")[0])
        return made[-1]

    yield submit
    for job_id in made:
        subprocess.run(["scancel", job_id], capture_output=True, check=False)


@pytest.mark.cluster
def test_a_hand_submitted_pending_job_counts_for_capacity_and_budget(tmp_path, hpc_home, held_job):
    """A job of the deployment's name that only Slurm's queue shows (submitted by hand, held): the controller
    sees it PENDING with no start estimate, counts it as capacity on the way and its GPU against the budget."""
    spec = load_spec(
        _spec(
            tmp_path,
            gateway={},
            slurm={"time": "00:10:00", "gpus_per_node": 1},
            autoscale={"min_jobs": 1, "max_jobs": 2, "gpu_budget": 1},
        ),
        check_files=False,
    )
    deploy_dir = render(spec, tmp_path / "D").deploy_dir
    controller = Controller.of_folder(deploy_dir, controller="g1")
    assert controller is not None
    advised = Controller(
        deploy_dir, spec.model_copy(update={"autoscale": spec.autoscale.model_copy(update={"advisory": True})})
    )
    assert advised.tick(Load(), now=time.time()).action == Action.SUBMIT  # nothing of the name queued: the floor
    # another deployment of the same name (another workdir): its script is not this one's, its jobs not counted
    other = tmp_path / "elsewhere" / SUB_NAME
    other.parent.mkdir()
    other.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\nsleep 300\n")
    held_job(other, spec.name)
    job_id = held_job(Deployment(deploy_dir).sub)  # the deployment's own script, by hand: its name is the spec's
    snap = controller.snapshot(Load(outstanding=10), time.time())
    assert [(j.job_id, j.phase, j.ours, j.gpus, j.starts_at) for j in snap.jobs] == [
        (job_id, Phase.PENDING, False, 1, None)
    ]
    decision = controller.tick(Load(outstanding=10))
    assert decision.action == Action.HOLD, decision
    assert f"capacity on the way: job {job_id} PENDING, estimated start unknown, beyond the horizon" in decision.reason
    record = AutoscaleRecord.read(Deployment(deploy_dir).autoscale)
    assert record is not None and record.expected_at is None and record.expected_job == job_id
    assert "when it serves is not known yet" in record.expected_note
    assert record.samples[-1][1:5] == (1, 0, 0, 0) and record.samples[-1].in_flight == 10  # one look: one PENDING
    floor = Policy(dataclasses.replace(controller.policy.settings, min_jobs=2)).decide(snap)
    assert floor.action == Action.HOLD and "the GPU budget 1 holds 1 in use, a job needs 1" in floor.reason
    assert not list(Deployment(deploy_dir).jobs_dir.glob("*"))  # nothing was submitted


@pytest.mark.cluster
def test_a_cancel_of_the_deployment_stops_the_controller(tmp_path, slurm_cluster, hpc_home):
    """After `hpc-serve cancel` of the deployment (its RenewStop) the controller acts no more: a look that decided
    to submit records the decision as not done, and nothing is submitted."""
    deploy_dir = _deployment(tmp_path)
    controller = Controller.of_folder(deploy_dir, controller="g1")
    assert controller is not None and not controller.stopped()
    RenewStop(at=time.time()).write(Deployment(deploy_dir).renew_stop)
    assert controller.stopped()
    decision = controller.tick(Load())
    assert decision.action == Action.SUBMIT and not list(Deployment(deploy_dir).jobs_dir.glob("*"))
    assert controller.record.decisions[-1].error == "not done: the deployment was cancelled"


def test_the_load_is_the_gateways_in_flight_count_and_its_refusals_with_nothing_serving():
    """Requests in flight on replicas that take new ones (a draining one's not), and the requests the balancer
    found no replica for since the last look."""
    balancer = Balancer()
    load = balancer_load(balancer)
    with pytest.raises(NoReplica):
        balancer.pick()
    with pytest.raises(NoReplica):
        balancer.pick()
    assert load() == Load(outstanding=0, held=2) and load() == Load(outstanding=0, held=0)
    balancer.update(
        [Replica("1/0", "http://a", "a:1", outstanding=3), Replica("2/0", "http://b", "b:1", draining=True)]
    )
    for replica in balancer.replicas:
        replica.outstanding = 3
    assert load() == Load(outstanding=3, held=0)


def test_the_load_carries_the_mean_ttft_of_the_requests_since_the_last_look():
    from hpc.gateway.metrics import Metrics

    balancer = Balancer()
    metrics = Metrics(lambda: balancer)
    load = balancer_load(balancer)
    assert load().ttft_s is None  # no first token since
    metrics.first_token("/v1/completions", 1.0)
    metrics.first_token("/v1/chat/completions", 3.0)
    assert load().ttft_s == 2.0 and load().ttft_s is None


def test_the_gateways_metrics_carry_the_controllers_decisions():
    """Every decision has a reason in the log and `status`, and as metrics: how many of each action, when each was
    last decided, the signal against its target at the last one; a deployment without a record shows none."""
    from prometheus_client import generate_latest

    from hpc.gateway.metrics import Metrics
    from launcher.contracts.autoscale import DecisionRecord

    rows = (
        DecisionRecord(at=100.0, action=Action.HOLD, reason="r", signal=0.5, target=1.0),
        DecisionRecord(at=200.0, action=Action.SUBMIT, job_id="7", reason="above", signal=2.5, target=1.0),
        DecisionRecord(at=300.0, action=Action.DRAIN, job_id="7", reason="fits", signal=0.25, target=1.0),
    )
    record = AutoscaleRecord(controller="5", decisions=rows)
    metrics = Metrics(lambda: None, autoscale=lambda: record)
    metrics.autoscale_read = record  # what `/metrics` reads on a worker thread before each page
    page = generate_latest(metrics.registry).decode()
    assert 'hpc_serve_autoscale_decisions{action="submit"} 1.0' in page
    assert 'hpc_serve_autoscale_decisions{action="cancel"} 0.0' in page
    assert 'hpc_serve_autoscale_last_decision_timestamp_seconds{action="drain"} 300.0' in page
    assert "hpc_serve_autoscale_signal 0.25" in page and "hpc_serve_autoscale_target 1.0" in page
    assert "hpc_serve_autoscale" not in generate_latest(Metrics(lambda: None).registry).decode()


def test_metrics_draws_the_controllers_record(tmp_path, hpc_home):
    """`hpc-serve metrics TARGET --autoscale-plot PNG`: the record as a picture, from the deployment's folder even
    with nothing serving (a deployment at zero has no replica to ask); no record: exit 3 saying so."""
    from hpc.cli.main import main
    from launcher.contracts.autoscale import DecisionRecord

    spec = tmp_path / "svc.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "svc",
                "workdir": str(tmp_path / "runs"),
                "model": {"backend": "cpu", "checkpoint_dir": str(tmp_path / "ckpt"), "init": {"family": "gpt2"}},
            }
        )
    )
    folder = tmp_path / "runs" / "svc-20261202-000000"
    render(load_spec(spec, check_files=False), folder)
    assert main(["metrics", str(folder), "--autoscale-plot", str(tmp_path / "none.png")]) == 3
    rows = tuple(
        DecisionRecord(at=100.0 + i * 5, action=a, job_id=j, signal=s, target=1.0)
        for i, (a, j, s) in enumerate(
            [(Action.HOLD, "", 0.5), (Action.SUBMIT, "8", 2.5), (Action.HOLD, "", 1.5), (Action.DRAIN, "7", 0.2)]
        )
    )
    AutoscaleRecord(controller="5", decisions=rows).write(Deployment(folder).autoscale)
    png = tmp_path / "autoscale.png"
    assert main(["metrics", str(folder), "--autoscale-plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# ------------------------------------------------------------------------------------------------ the account's limits
#: `sacctmgr -nP show assoc where cluster=hpcserve format=<ASSOC_FIELDS>` on the test cluster with a parent account
#: (GrpTRES gres/gpu and node, GrpJobs), a child (GrpSubmitJobs) and the user's association in the child
ASSOC_OUTPUT = """hpcserve|root||||||||
hpcserve|root|root|||||||
hpcserve|hs_probe_parent||root|gres/gpu=6,node=2|5||||
hpcserve|hs_probe_child||hs_probe_parent|||7|||
hpcserve|hs_probe_child|root||cpu=8,gres/gpu=4|1||3|4|
"""
#: `squeue -h -a -O JobID:|,State:|,Account:|,UserName:|,tres-alloc:|`: a PENDING job's tres-alloc is its request
QUEUE_OUTPUT = """2155|RUNNING|hs_probe_child|root|cpu=1,node=1,billing=1,gres/gpu=4|
2158|PENDING|hs_probe_child|alice|cpu=2,mem=4000M,node=1,billing=2,gres/gpu=2|
2159|RUNNING|hs_probe_parent|bob|cpu=2,mem=4000M,node=1,billing=2|
2160|RUNNING|elsewhere|root|cpu=2,node=1,gres/gpu=8|
"""


def test_the_association_limits_are_read_up_the_tree_from_sacctmgrs_own_output():
    from hpc.scheduler.limits import CPU, GPU, NODE, AccountLimits, parse_associations, parse_queue, parse_tres

    assert parse_tres("cpu=8,gres/gpu=4,mem=4000M") == {"cpu": 8, "gres/gpu": 4}
    assert parse_tres("") == {} and parse_tres("N/A") == {}
    rows = parse_associations(ASSOC_OUTPUT + "a line of another shape\n")
    assert [(r.account, r.user, r.parent) for r in rows][2:] == [
        ("hs_probe_parent", "", "root"),
        ("hs_probe_child", "", "hs_probe_parent"),
        ("hs_probe_child", "root", ""),
    ]
    limits = AccountLimits.of_associations(rows, "hs_probe_child", "root")
    named = [(limit.who, limit.name, limit.tres, limit.value) for limit in limits.limits]
    assert named == [
        ("user 'root' in account 'hs_probe_child'", "GrpTRES", GPU, 4),
        ("user 'root' in account 'hs_probe_child'", "GrpTRES", CPU, 8),
        ("user 'root' in account 'hs_probe_child'", "GrpJobs", "", 1),
        ("account 'hs_probe_child'", "GrpSubmitJobs", "", 7),
        ("account 'hs_probe_parent'", "GrpTRES", GPU, 6),
        ("account 'hs_probe_parent'", "GrpTRES", NODE, 2),
        ("account 'hs_probe_parent'", "GrpJobs", "", 5),
        ("user 'root' in account 'hs_probe_child'", "MaxJobs", "", 3),
        ("user 'root' in account 'hs_probe_child'", "MaxSubmitJobs", "", 4),
    ]
    # Slurm keeps account names in lower case: a spec's `MyProj` is `myproj`
    assert AccountLimits.of_associations(rows, "HS_Probe_Child", "root").limits == limits.limits
    jobs = parse_queue(QUEUE_OUTPUT)
    assert [(j.job_id, j.state, j.account, j.user, j.tres.get(GPU, 0)) for j in jobs][1] == (
        "2158",
        "PENDING",
        "hs_probe_child",
        "alice",
        2,
    )
    # the user's own GrpTRES counts root's jobs in the child only: 4 GPUs of job 2155
    assert limits.refusal(jobs, {GPU: 1, NODE: 1, CPU: 1}) == (
        "user 'root' in account 'hs_probe_child' GrpTRES gres/gpu=4: 4 in use, a job needs 1"
    )
    # without the user's association: the parent's GrpTRES counts every user's jobs of its tree, PENDING ones too
    tree = AccountLimits.of_associations(rows[:4], "hs_probe_child", "root")
    assert (
        tree.refusal(jobs, {GPU: 1, NODE: 1}) == "account 'hs_probe_parent' GrpTRES gres/gpu=6: 6 in use, a job needs 1"
    )
    assert tree.refusal(jobs, {GPU: 0, NODE: 0}) == ""  # a CPU job: 3 of GrpJobs 5, 2 of GrpSubmitJobs 7
    assert (
        tree.refusal(jobs[1:], {GPU: 2, NODE: 1}) == "account 'hs_probe_parent' GrpTRES node=2: 2 in use, a job needs 1"
    )
    assert AccountLimits.of_associations(rows, "root", "root").limits == ()  # no limit set: nothing refused


def test_a_max_limit_is_the_users_own_else_the_nearest_accounts_default():
    """MaxJobs set on an account is a default its users' associations inherit, not a limit beside theirs: the
    user's own value replaces it (16 allowed, not the account's 4); without one, the nearest account's holds."""
    from hpc.scheduler.limits import AccountLimits, parse_associations

    parent = "hpcserve|proj||root|||||8|\n"
    account = "hpcserve|team||proj||||4||\n"
    own = "hpcserve|team|svc|||||16||\n"
    bare = "hpcserve|team|svc|||||||\n"

    def maxes(text: str) -> list[tuple[str, str, int]]:
        found = AccountLimits.of_associations(parse_associations(text), "team", "svc").limits
        return [(limit.who, limit.name, limit.value) for limit in found]

    assert maxes(parent + account + own) == [
        ("user 'svc' in account 'team'", "MaxJobs", 16),
        ("account 'proj'", "MaxSubmitJobs", 8),
    ]
    assert maxes(parent + account + bare) == [("account 'team'", "MaxJobs", 4), ("account 'proj'", "MaxSubmitJobs", 8)]


def test_a_submit_the_account_refuses_is_a_hold_naming_the_limit():
    """Hot past scale_up_after: the account's answer is asked before the submit and its refusal is the reason;
    the wait is not started again, so the submit comes at the look the account allows it. Never asked otherwise."""
    asked: list[float] = []
    answer = ["account 'x' GrpTRES gres/gpu=4: 4 in use, a job needs 1"]

    def account() -> str:
        asked.append(0)
        return answer[0]

    policy = Policy(_settings(up_after_s=10))
    jobs = (_job("j0"),)
    calm = policy.decide(Snapshot(0.0, jobs, outstanding=1, account=account))
    assert calm.action == Action.HOLD and not asked
    decisions = [policy.decide(Snapshot(float(t), jobs, outstanding=20, account=account)) for t in range(0, 20, 5)]
    assert [d.action for d in decisions] == [Action.HOLD] * 4 and len(asked) == 2  # asked at 10 s and 15 s
    assert decisions[-1].reason.endswith("; account 'x' GrpTRES gres/gpu=4: 4 in use, a job needs 1")
    answer[0] = ""
    assert policy.decide(Snapshot(20.0, jobs, outstanding=20, account=account)).action == Action.SUBMIT


@pytest.mark.cluster
def test_a_failing_sacctmgr_is_no_limit_known_said_once(slurm_cluster, caplog, monkeypatch):
    """An account with no association row: no limit. sacctmgr failing (slurmdbd away: its words, as Slurm's
    runner reports them): no limit known, said once in the log however often it is asked; asked again only after
    LIMITS_TTL_S."""
    from hpc.scheduler import slurm
    from hpc.scheduler.limits import GPU, LIMITS_TTL_S, AccountWatch

    clock = [0.0]
    watch = AccountWatch("no-such-account", user="nobody-here", clock=lambda: clock[0])
    known = watch.limits()
    assert known is not None and known.limits == ()

    def slurmdbd_away(argv, timeout, **kw):
        if argv[0] == "sacctmgr":
            return subprocess.CompletedProcess(argv, 1, "", "sacctmgr: error: Problem talking to the database")
        return slurm.run_subprocess(argv, timeout, **kw)

    monkeypatch.setattr(slurm, "default", slurm.Slurm(runner=slurmdbd_away, sleep=lambda s: None))
    with caplog.at_level("WARNING", logger="hpc_serve.gateway"):
        assert watch.refusal({GPU: 1}) == ""  # the cached answer: sacctmgr not asked yet
        for _ in range(3):
            clock[0] += LIMITS_TTL_S
            assert watch.limits() is None and watch.refusal({GPU: 1}) == ""
    said = [r.message for r in caplog.records if "limits are unknown" in r.message]
    assert len(said) == 1 and "Problem talking to the database" in said[0]
    assert slurm.default.calls["sacctmgr"] == 3


# ------------------------------------------------------------------------------------------------ when capacity comes
def test_capacity_is_expected_at_the_earliest_start_plus_the_time_to_ready():
    from hpc.serving.autoscale import READY_AFTER_S, expected

    now = 1000.0
    assert expected(Snapshot(now, (_job("j0"),)), None, 900) is None
    late = _job("j2", Phase.PENDING, starts_at=now + 4000)
    soon = _job("j1", Phase.PENDING, starts_at=now + 100)
    guess = expected(Snapshot(now, (_job("j0"), late, soon)), None, 900)
    assert guess is not None and (guess.at, guess.job_id) == (now + 100 + READY_AFTER_S, "j1")
    assert "by default" in guess.words and "beyond the horizon" not in guess.words
    measured = expected(Snapshot(now, (late,)), 30.0, 900)
    assert measured is not None and measured.at == now + 4030 and "beyond the horizon of 900 s" in measured.words
    assert "30 s to READY as measured" in measured.words
    started = expected(Snapshot(now, (_job("j3", Phase.STARTING, starts_at=now - 50),)), 30.0, 900)
    assert started is not None and started.at == now  # later than measured: any moment now
    unknown = expected(Snapshot(now, (_job("j4", Phase.PENDING),)), 30.0, 900)
    assert unknown is not None and unknown.at is None and "when it serves is not known yet" in unknown.words


def test_the_time_to_ready_is_measured_once_from_the_newest_ready_job(tmp_path):
    """Slurm's start of the newest READY job to its replica's endpoint record: the record keeps it (and which job);
    a job whose replica was started again is not measured."""
    from launcher.contracts.records import EndpointRecord

    deploy_dir = _deployment(tmp_path)
    controller = Controller(deploy_dir, load_spec(Deployment(deploy_dir).spec, check_files=False))
    for job_id, ready_at, restarts in (("7", 1042.0, 0), ("8", 2090.0, 1)):
        paths = _serving_job(deploy_dir, job_id)
        EndpointRecord(job_id=job_id, address="n", http_port=1, ready_at=ready_at, restarts=restarts).write(
            paths.endpoint(0)
        )
    queue = {"7": ("RUNNING", 1000.0, None), "8": ("RUNNING", 2000.0, None)}
    controller.measure([_job("7")], queue)
    assert (controller.record.ready_after_s, controller.record.measured_job) == (42.0, "7")
    controller.measure([_job("7"), _job("8")], queue)
    assert (controller.record.ready_after_s, controller.record.measured_job) == (42.0, "7")


def test_a_held_request_is_told_to_come_back_when_the_controllers_job_should_serve(tmp_path):
    """The gateway's 503 after the hold: Retry-After from the controller's record (bounded to 1 s .. an hour),
    the message names the job and when; with no estimate, the hold as before."""
    import asyncio

    from hpc.gateway.errors import APIError, no_replica
    from hpc.gateway.state import Gateway
    from hpc.jobs.autoscale import Capacity, capacity
    from hpc.serving.deployment import target_of_folder
    from hpc.serving.discovery import Discovery
    from hpc.serving.model_io import GenerateParams
    from hpc.serving.text import ChatTemplate

    deploy_dir = _deployment(tmp_path, min_jobs=0, max_jobs=1)
    target = dataclasses.replace(target_of_folder(deploy_dir), hold_s=0.2)
    assert capacity(target) is None and no_replica(0.2).headers == {"Retry-After": "1"}
    now = time.time()
    AutoscaleRecord(expected_at=now + 300, expected_job="17").write(Deployment(deploy_dir).autoscale)
    balancer = Balancer()
    discovery = Discovery(None, balancer, None)  # type: ignore[arg-type]
    gateway = Gateway(target, balancer, discovery, None, None, None, ChatTemplate(None))  # type: ignore[arg-type]

    async def ask() -> None:
        await gateway.first(gateway.generate(GenerateParams(prompt="x", max_tokens=2)))

    with pytest.raises(APIError) as refused:
        asyncio.run(ask())
    assert refused.value.status == 503 and 295 <= int(refused.value.headers["Retry-After"]) <= 300
    assert "job 17 is expected to serve at about" in str(refused.value)
    assert Capacity(now + 9999, "1").retry_after_s(now) == 3600 and Capacity(now - 5, "1").retry_after_s(now) == 1


def test_status_says_when_the_capacity_on_the_way_is_beyond_the_horizon():
    record = AutoscaleRecord(
        decisions=(DecisionRecord(at=0.0, action=Action.SUBMIT, job_id="8", reason="below min_jobs 1"),),
        expected_note="job 8 PENDING, estimated start 14:00:00, beyond the horizon of 900 s; serving from about ...",
    )
    lines = decision_lines(record)
    assert lines[1] == f"  capacity on the way: {record.expected_note}"


# ------------------------------------------------------------------------------------------------ jobs over time
def test_the_record_keeps_a_bounded_series_of_samples_and_old_records_still_read(tmp_path):
    from launcher.contracts.autoscale import KEEP_SAMPLES, Sample

    record = AutoscaleRecord()
    for i in range(KEEP_SAMPLES * 3):
        record = record.with_sample(Sample(float(i), 0, 0, 1, 0, 0.5, 1.0, 0.5))
    ats = [s.at for s in record.samples]
    assert len(ats) <= KEEP_SAMPLES and ats == sorted(ats) and ats[-1] == KEEP_SAMPLES * 3 - 1
    assert ats[-KEEP_SAMPLES // 2 :] == [float(i) for i in range(KEEP_SAMPLES * 5 // 2, KEEP_SAMPLES * 3)]
    assert ats[0] < KEEP_SAMPLES, "the older hours kept, sparser"
    path = tmp_path / "autoscale.json"
    record.write(path)
    assert AutoscaleRecord.read(path) == record
    path.write_text('{"version": 1, "controller": "5", "decisions": [], "samples": [[1, 2], "x"]}')
    old = AutoscaleRecord.read(path)
    assert old is not None and old.samples == () and old.expected_at is None and old.controller == "5"


def test_metrics_draws_jobs_over_time_from_a_replayed_record(tmp_path, hpc_home):
    """A replayed trace's looks, as the controller records them: the plot has the jobs band (stacked by phase)
    beside the signal on its own axis."""
    from hpc.bench.plots import autoscale_timeline
    from launcher.contracts.autoscale import Sample

    world = World(Policy(_settings()), jobs={"j0": _job("j0")})
    world.replay([(0, 20, 2), (20, 200, 12), (200, 400, 2)])
    samples, rows = [], []
    for decision, seen in world.log:
        phases = [j.phase for j in seen]
        count = phases.count
        samples.append(
            Sample(decision.at, count(Phase.PENDING), count(Phase.STARTING), count(Phase.READY),
                   count(Phase.DRAINING), decision.signal, decision.target, decision.signal)
        )  # fmt: skip
        if decision.action != Action.HOLD:
            rows.append(DecisionRecord(at=decision.at, action=decision.action, job_id=decision.job_id))
    assert max(s.ready for s in samples) == 3 and any(s.pending for s in samples)
    png = autoscale_timeline(rows, tmp_path / "jobs.png", "replayed", samples)
    assert _has_colour(png, "#4a9a5a") and _has_colour(png, "#e8c860")  # READY and PENDING jobs drawn
    without = autoscale_timeline(rows, tmp_path / "old.png", "replayed")  # an old record: no band, the rest drawn
    assert not _has_colour(without, "#4a9a5a") and _has_colour(without, "#2a8a3a")  # the submits' markers


def _has_colour(png: Path, colour: str, alpha: float = 0.8) -> bool:
    """Whether the picture has a pixel of `colour` as the plot blends it on white (`alpha`: the jobs band's)."""
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(str(png))[..., :3] * 255
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=float)
    blends = [rgb] + ([rgb * alpha + 255 * (1 - alpha)] if alpha < 1 else [])
    return any(bool((np.abs(pixels - b).max(axis=-1) < 3).any()) for b in blends)
