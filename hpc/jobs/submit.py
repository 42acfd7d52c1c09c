"""Submit a spec: plan its jobs once (`JobsPlan`), render the plan into a fresh deployment folder, then hand them to
an executor (hpc/jobs/executors.py: exactly their scripts to sbatch, or the local executor) in dependency order. The
other end of a job's life, `cancel`, is hpc/jobs/track.py's.

A submission is up to three jobs, one of each kind (hpc/jobs/kinds.py): the engine build (a `build:` section whose
engine is not built yet), the deployment's gateway (an enabled `gateway:` section), and the serving job, which
runs after the build. Each of the first two may turn out not to need a job of this submission: an engine built
already, or being built by another submission, is served or waited for; a gateway that runs or is on its way
is reused.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpc.jobs.build import PreparedBuild, prepare, start
from hpc.jobs.executors import Executor, executor_named
from hpc.jobs.gateway import ensure_gateway
from hpc.jobs.kinds import ServingJob
from hpc.jobs.model_init import create_model, model_to_create
from hpc.jobs.track import wait
from hpc.render.deployment_plan import DeploymentPlan, deployment_folder, plan_deployment
from hpc.render.jobfiles import render_plan
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import SlurmError
from hpc.spec import ModelInit, Spec
from hpc.spec.site import profile_summary
from launcher.contracts.config import CANCEL_GRACE_S


class SubmitError(RuntimeError):
    """sbatch refused the job; the message names the command and quotes sbatch's own words."""


def new_deployment_dir(spec: Spec) -> Path:
    """`<workdir>/<name>-<time>`: a new folder per submission, so a job never runs from files that a later
    submission rewrote."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = spec.workdir / f"{spec.name}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


@dataclass(frozen=True)
class JobsPlan:
    """What one submission of a spec runs, decided once from the spec: the deployment folder the serving job runs
    from (its served spec, GPU binding, replica steps, gateway job, token and launch plan:
    hpc/render/deployment_plan.py), the engine to build first, and the model `model.init` asks for. `submit`,
    `submit --dry-run` and the CLI's `render` read it; none asks the spec again."""

    deployment: DeploymentPlan  # its spec: a build's engine in place of `build:` (hpc/jobs/build_plan.py served_spec)
    build: PreparedBuild | None = None  # the engine to build first (BuildJob); None: no `build:` section
    model: tuple[Path, ModelInit] | None = None  # the checkpoint `model.init` asks for, missing (model_to_create)

    @property
    def served(self) -> Spec:
        """The spec the serving job serves."""
        return self.deployment.spec

    @property
    def gateway(self) -> bool:
        """The deployment's gateway job (GatewayJob), unless one runs or is on its way."""
        return self.deployment.gateway


def plan_jobs(spec: Spec, deploy_dir: Path) -> JobsPlan:
    """The jobs `spec` needs, its serving job run from `deploy_dir` (absolute: deployment_folder). Reads the engine
    cache; creates nothing. The model `model.init` asks for is the one input of the serving job that no job makes
    (with a `build:` section the build job creates it): `submit` creates it (render never does)."""
    build = prepare(spec) if spec.build is not None else None
    served = build.served if build is not None else spec
    return JobsPlan(plan_deployment(served, deploy_dir), build, model_to_create(spec))


def submit_jobs(jobs: JobsPlan, runner: Executor, started: list[JobRef], note: Callable[[str], object]) -> JobRef:
    """Each job in dependency order: the build first (nothing is served from an engine that will not be there), the
    gateway next (a gateway job sbatch refuses leaves no serving job behind), the serving job last, after the build.
    A build job renders its script as it is submitted (hpc/jobs/build.py `start`: none when the engine is
    cached or another submission builds it). `started` gets each job made for this submission; the serving job is
    returned."""
    deploy_dir = jobs.deployment.deploy_dir
    after = None
    if jobs.build is not None:
        after = start(jobs.build, runner, deploy_dir, note)
        if after is not None and after.deploy_dir == deploy_dir:  # not another submission's build
            started.append(after)
    if jobs.gateway:
        gateway = ensure_gateway(deploy_dir, runner)
        if gateway.job is not None:
            started.append(gateway.job)
    return runner.submit(ServingJob, deploy_dir, after=after)


def submit(
    spec: Spec,
    executor: str | None = None,
    deploy_dir: Path | None = None,
    note: Callable[[str], object] = lambda _: None,
) -> JobRef:
    """Plan the spec's jobs once (`plan_jobs`), create the model it asks for, render the plan, submit its jobs; the
    serving job. Nothing is submitted if planning or rendering fails, and what a refused sbatch interrupts is
    undone: the jobs made for this submission are cancelled and a folder made for it removed. `note` hears which site profile the spec was merged with (the
    scripts hold its values) and what the build does."""
    runner = executor_named(executor)  # ValueError for an unknown name, before anything is written
    note(profile_summary(spec, explained=True))
    jobs = plan_jobs(spec, deployment_folder(deploy_dir or new_deployment_dir(spec)))
    create_model(jobs.model)
    # the serving job's scripts, launch.json and model repository, and the gateway's script: one folder
    folder = render_plan(jobs.deployment).deploy_dir
    started: list[JobRef] = []
    try:
        return submit_jobs(jobs, runner, started, note)
    except SlurmError as exc:
        undo(started, runner)
        if deploy_dir is None:  # a folder made for this submission only: nothing half-done is left behind
            shutil.rmtree(folder, ignore_errors=True)
        raise SubmitError(str(exc)) from exc


def undo(started: list[JobRef], runner: Executor) -> None:
    """Cancel the jobs a submission made before sbatch refused one (the last first), and wait for their end: one
    that had started would otherwise write into its folder (its script makes its job folder) after that folder
    was removed."""
    for ref in reversed(started):
        runner.cancel(ref, 0, stoppable=False)
    for ref in started:
        wait(ref, until=(), timeout=CANCEL_GRACE_S)
