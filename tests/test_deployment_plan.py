"""The submission plan (hpc/jobs/submit.py `JobsPlan`, hpc/render/deployment_plan.py `DeploymentPlan`): made once
per `submit` from the spec, and what render and the jobs read; nothing asks the spec again."""

from __future__ import annotations

from pathlib import Path

import pytest

import hpc.jobs.submit as submit_module
import hpc.render.deployment_plan as plan_module
from hpc.jobs.executors import Executor
from hpc.jobs.kinds import BuildJob, JobKind, ServingJob
from hpc.scheduler.index import JobRef
from hpc.spec import load_spec
from launcher.contracts.layout import Deployment
from launcher.contracts.plan import LaunchPlan
from tests.test_build import CPU, write
from tests.test_render import cpu_spec

pytestmark = pytest.mark.timeout(60)


class Recorder(Executor):
    """An executor that submits nothing: each job's kind and folder, in order."""

    name = "recorder"

    def __init__(self) -> None:
        self.submitted: list[tuple[type[JobKind], Path, JobRef | None]] = []

    def submit(self, job_kind: type[JobKind], deploy_dir: Path, after: JobRef | None = None) -> JobRef:
        self.submitted.append((job_kind, deploy_dir, after))
        job_dir = Deployment(deploy_dir).jobs_dir / str(len(self.submitted))
        job_dir.mkdir(parents=True)
        return JobRef(str(len(self.submitted)), job_dir)

    def scheduler_state(self, ref: JobRef) -> tuple[str, str | None]:
        return "PENDING", None

    def cancel(self, ref: JobRef, grace_s: float, stoppable: bool) -> None:
        raise AssertionError("nothing is cancelled")


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of the plan's constructor and of the GPU decision (which only the constructor makes)."""
    calls = {"plan_deployment": 0, "gpu_decision": 0}

    def counting(name: str, real):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(submit_module, "plan_deployment", counting("plan_deployment", plan_module.plan_deployment))
    monkeypatch.setattr(plan_module, "gpu_decision", counting("gpu_decision", plan_module.gpu_decision))
    return calls


def test_submit_plans_once_and_renders_the_plan(tmp_path, hpc_home, monkeypatch, counted):
    runner = Recorder()
    monkeypatch.setattr(submit_module, "executor_named", lambda name: runner)
    spec = cpu_spec(tmp_path)
    ref = submit_module.submit(spec, deploy_dir=tmp_path / "d")
    assert counted == {"plan_deployment": 1, "gpu_decision": 1}
    assert runner.submitted == [(ServingJob, (tmp_path / "d").resolve(), None)]
    assert ref.deploy_dir == (tmp_path / "d").resolve()
    written = LaunchPlan.read(Deployment(ref.deploy_dir).launch)
    assert written == plan_module.plan_deployment(spec, ref.deploy_dir).launch


def test_submit_with_a_build_plans_once_and_serves_the_built_engine(tmp_path, hpc_home, monkeypatch, counted):
    runner = Recorder()
    monkeypatch.setattr(submit_module, "executor_named", lambda name: runner)
    spec = load_spec(write(tmp_path, CPU), check_files=False)
    ref = submit_module.submit(spec, deploy_dir=tmp_path / "d")
    assert counted == {"plan_deployment": 1, "gpu_decision": 1}
    (build, folder, _), (serving, _, after) = runner.submitted
    assert (build, serving) == (BuildJob, ServingJob) and after is not None and after.job_id == "1"
    assert folder == ref.deploy_dir
    launch = LaunchPlan.read(Deployment(ref.deploy_dir).launch)
    assert launch.backend == "cpu" and not (tmp_path / "ckpt").exists()  # the build job creates the model


def test_the_plan_holds_what_render_reads(tmp_path):
    spec = cpu_spec(tmp_path, gateway={"enabled": True}, auth="token", replicas=2, slurm={"nodes": 2})
    plan = plan_module.plan_deployment(spec, tmp_path / "d")
    assert plan.gateway and plan.token and [step.replica for step in plan.steps] == [0, 1]
    assert plan.launch.gpu_binding == plan.gpu.binding and plan.launch.replicas == 2
    jobs = submit_module.plan_jobs(spec, tmp_path / "d")
    assert jobs.served is spec and jobs.build is None and jobs.model is None and jobs.gateway
