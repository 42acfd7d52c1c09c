"""What one deployment folder holds, decided once from the spec it serves: `DeploymentPlan`.

`plan_deployment` is the one place render's facts are derived: the GPU binding decision (hpc/render/gpu_binding.py),
each replica's srun step (hpc/spec/placement.py), whether the deployment runs a gateway job, whether render writes an
access token, and launch.json's plan. The writers (hpc/render/jobfiles.py) and `submit` (hpc/jobs/submit.py, whose
submission plan holds this one beside the build and the model to create) read the plan; none asks the spec again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpc.render.gpu_binding import Decision, gpu_decision
from hpc.spec import Spec
from hpc.spec.checks import slurm_time_seconds
from hpc.spec.placement import ReplicaStep, replica_steps
from launcher.contracts import model_names
from launcher.contracts.auth import TOKEN as AUTH_TOKEN
from launcher.contracts.config import STOP_LEAD_S, default_env, renew_notice_s
from launcher.contracts.layout import Deployment
from launcher.contracts.llmapi import ENGINE
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.renew_plan import RenewPlan


@dataclass(frozen=True)
class DeploymentPlan:
    """One deployment folder's decisions: `spec` (the spec it serves: after a build, the built engine's), the
    folder, the GPU binding, the replicas' srun steps, the gateway job, the access token, and launch.json's plan."""

    spec: Spec
    deploy_dir: Path
    gpu: Decision
    steps: tuple[ReplicaStep, ...]
    gateway: bool  # an enabled `gateway:` section: gateway.sub is rendered and submit starts (or reuses) its job
    token: bool  # auth: token: render makes the deployment's access token
    launch: LaunchPlan


def deployment_folder(out_dir: str | Path) -> Path:
    """The absolute folder a deployment is rendered into (the scripts hold it)."""
    return Path(out_dir).expanduser().resolve()


def plan_deployment(spec: Spec, deploy_dir: Path) -> DeploymentPlan:
    """The plan of `spec` served from `deploy_dir` (as given: `deployment_folder` makes it absolute). Reads and
    writes nothing."""
    gpu = gpu_decision(spec)
    gateway = spec.gateway is not None and spec.gateway.enabled
    steps = replica_steps(spec.replicas, spec.world_size_per_replica, spec.slurm.nodes, spec.tasks_per_node)
    return DeploymentPlan(
        spec=spec,
        deploy_dir=deploy_dir,
        gpu=gpu,
        steps=tuple(steps),
        gateway=gateway,
        token=spec.auth == AUTH_TOKEN,
        launch=_launch_plan(spec, deploy_dir, gpu, gateway),
    )


def _launch_plan(spec: Spec, deploy_dir: Path, gpu: Decision, gateway: bool) -> LaunchPlan:
    """The launcher's only input (DEVELOPERS.md, "launch.json"): what every rank needs and nothing else."""
    return LaunchPlan(
        name=spec.name,
        deployment_dir=deploy_dir,
        model_repository=str(Deployment(deploy_dir).model_repository),
        tp_size=spec.model.tp_size,
        pp_size=spec.model.pp_size,
        replicas=spec.replicas,
        world_size_per_replica=spec.world_size_per_replica,
        mode=spec.mode,
        tritonserver=spec.triton.server,
        ports=spec.triton.ports.model_dump(),
        follower_models=(model_names.TENSORRT_LLM,),
        server_args=(f"--log-verbose={spec.triton.log_verbose}", *spec.triton.server_args),
        ready_timeout_s=spec.triton.ready_timeout_s,
        warmup_timeout_s=spec.triton.warmup_timeout_s,
        env={**default_env(spec.mode), **spec.backend_strategy.rank_env(spec.model)},
        auth=spec.auth,
        gpu_binding=gpu.binding,
        replica_policy=spec.replica_policy,
        renew=_renew_plan(spec, gateway) if spec.renew is not None else None,
        workflow=spec.model.workflow or ENGINE,  # never None once validated (hpc/spec/schema.py ModelSpec._dirs)
        backend=spec.model.backend,
        model_files_from=spec.model.model_files_from,
        decoupled=spec.triton.decoupled,
    )


def _renew_plan(spec: Spec, gateway: bool) -> RenewPlan:
    """launch.json's `renew` block: what the job's renewer (launcher/jobscript/renew.py, launcher/contracts/renew_plan.py) acts on.
    `notice_s`: how long until every client has seen a draining mark (their discovery's refresh, plus
    `NOTICE_MARGIN_S`)."""
    r, g = spec.renew, spec.gateway
    assert r is not None
    refresh = g.refresh_s if gateway and g is not None else 0.0
    return RenewPlan(
        before_s=r.before_s,
        stop_lead_s=STOP_LEAD_S,
        time_limit_s=slurm_time_seconds(spec.slurm.time),
        max_jobs=r.max_jobs,
        until=r.until_epoch,
        drain_s=r.drain_s,
        notice_s=renew_notice_s(refresh),
    )
