"""Deployment plan → deployment folder: the sbatch script, the per-rank script, the launch plan and the model
repository.

This is the one place where a `DeploymentPlan` (hpc/render/deployment_plan.py: made once from the spec) is turned into
things that run: the `#SBATCH` lines (hpc/render/sbatch.py), the srun line and its container flags, the per-rank
environment, the upstream model-repository parameters, and the launch plan the per-rank launcher reads. Every user
string that reaches a script is shell-quoted here (the `q` filter) or was rejected by the spec.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

import launcher.contracts.rank
from hpc import __version__
from hpc.render.deployment_plan import DeploymentPlan, deployment_folder, plan_deployment
from hpc.render.llmapi import model_yaml_args, model_yaml_header
from hpc.render.sbatch import gateway_options, serving_gres, serving_options
from hpc.serving.auth import ensure_deployment_token
from hpc.spec import NAMED_PARAMETERS, Spec, dump_spec, provenance
from hpc.spec.files import is_script_safe_path
from hpc.spec.placement import step_options
from launcher.contracts import job_index, model_names
from launcher.contracts.config import START_CRASH_RESTARTS, STOP_ACK_S

# the folder's names live in launcher/contracts/layout.py (SUB_NAME and SH_NAME are also render_scripts' keys)
from launcher.contracts.layout import (
    ENDPOINT_NAME,
    ENDPOINTS_NAME,
    GATEWAY_SUB_NAME,
    LAUNCH_NAME,
    SH_NAME,
    SHIPPED_PACKAGES,
    SOURCE_ROOT,
    STARTING_NAME,
    SUB_NAME,
    Deployment,
    gateway_record,
    template_values,
)
from launcher.contracts.llmapi import OWN_MODEL
from launcher.contracts.plan import FAIL_JOB, RESTART
from launcher.contracts.records import GAVE_UP, NOT_RESTARTABLE, RESTARTING, ReplicaRestart
from launcher.contracts.shm import shm_glob_shell
from launcher.contracts.stop_records import stop_request_format

DEFAULT_TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Rendered:
    """Where `render` put things."""

    deploy_dir: Path
    sub: Path
    sh: Path
    model_repository: Path
    launch: Path
    gateway_sub: Path | None = None  # only for a spec with an enabled `gateway:` section


def repository_parameters(plan: DeploymentPlan) -> dict[str, Any]:
    """The upstream fill_template parameters for the five models, from the plan's spec and GPU binding (the one
    place this mapping is decided). `triton.parameters` entries override or add to them."""
    spec = plan.spec
    t, m = spec.triton, spec.model
    params: dict[str, Any] = {
        param: getattr(t, field) for field, param in NAMED_PARAMETERS.items() if getattr(t, field) is not None
    }
    params.update(
        {
            "engine_dir": str(m.source_dir),
            "tokenizer_dir": str(m.tokenizer),
            "max_beam_width": 1,
            "logits_datatype": "TYPE_FP32",
            "encoder_input_features_data_type": "TYPE_FP16",
            "accumulate_tokens": False,
            "tensorrt_llm_model_name": model_names.TENSORRT_LLM,
        }
    )
    if m.backend_strategy.tp_size_parameter:
        params["tp_size"] = m.tp_size
    params.update(plan.gpu.parameters)  # what TensorRT-LLM needs to agree with the binding
    params.update(t.parameters)
    return params


def write_repository(plan: DeploymentPlan, out_dir: Path) -> None:
    """The model repository of the plan's workflow: llmapi's one `tensorrt_llm` model configured by model.yaml
    (hpc/render/llmapi.py), or the engine workflow's five models filled with `repository_parameters`."""
    spec = plan.spec
    if spec.workflow_strategy.ensemble_repository:
        from backend.repository import write_model_repository

        write_model_repository(out_dir, spec.model.backend, repository_parameters(plan))
    else:
        from backend.llmapi_repository import write_llmapi_repository

        own = spec.model.llmapi_model == OWN_MODEL  # else the image's model files (the launcher copies them)
        write_llmapi_repository(out_dir, model_yaml_args(spec), OWN_MODEL if own else None, model_yaml_header(spec))


def _container_mounts(spec: Spec, deploy_dir: Path, paths: Sequence[Path | None] | None = None) -> list[str]:
    """User mounts plus what every rank must see at the same path: the deployment folder, the hpc-serve
    source, the model folders (`paths`: other folders instead, e.g. a build's source and output). A path already
    visible at its own path (under a SRC:SRC mount) is not mounted again."""
    mounts = list(spec.container.mounts)

    def same_path_roots() -> list[Path]:
        roots = []
        for mount in mounts:
            parts = mount.split(":")
            if len(parts) == 1 or parts[0] == parts[1]:
                roots.append(Path(parts[0]))
        return roots

    if paths is None:
        paths = (spec.model.source_dir, spec.model.tokenizer)
    for path in (deploy_dir, *paths):  # the code ships inside deploy_dir
        if path is not None and not any(path == root or root in path.parents for root in same_path_roots()):
            mounts.append(f"{path}:{path}")
    return mounts


def srun_and_wrapper(
    spec: Spec, deploy_dir: Path, paths: Sequence[Path | None] | None = None
) -> tuple[list[str], list[str]]:
    """srun flags and the command prefix that wraps `bash tensorrt_llm_triton.sh` for the container kind (`paths`:
    the folders to mount besides the deployment, default the model's; hpc/jobs/build_script.py passes its own)."""
    c = spec.container
    srun = list(spec.slurm.srun_args)
    wrapper: list[str] = []
    if c.type == "pyxis":
        mounts = ",".join(_container_mounts(spec, deploy_dir, paths))
        srun += [f"--container-image={c.image}", f"--container-mounts={mounts}"]
        if c.workdir:
            srun.append(f"--container-workdir={c.workdir}")
        if c.name:
            srun.append(f"--container-name={c.name}")
    elif c.type == "apptainer":
        wrapper = ["apptainer", "exec", "--nv"]
        for mount in _container_mounts(spec, deploy_dir, paths):
            wrapper += ["-B", mount]
        if c.workdir:
            wrapper += ["--pwd", c.workdir]
        wrapper.append(str(c.image))
    return srun, wrapper


@functools.lru_cache(maxsize=8)
def template_environment(templates: Path | None) -> jinja2.Environment:
    """One environment per templates folder, kept: jinja compiles each template once and recompiles one whose
    file changed (auto_reload), so a site template edited between two renders is read again."""
    search = [str(templates)] if templates else []
    search.append(str(DEFAULT_TEMPLATES))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(search),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


def render_scripts(spec: Spec, deploy_dir: Path, templates: Path | None = None) -> dict[str, str]:
    """The text of the scripts of `spec` served from `deploy_dir`, without touching the disk (`plan_scripts`)."""
    return plan_scripts(plan_deployment(spec, deploy_dir), templates)


def plan_scripts(plan: DeploymentPlan, templates: Path | None = None) -> dict[str, str]:
    """The text of the two scripts (and the gateway's, when the plan runs one), without touching the disk (what
    `submit --dry-run` prints)."""
    spec, deploy_dir = plan.spec, plan.deploy_dir
    env = template_environment(templates)
    srun, wrapper = srun_and_wrapper(spec, deploy_dir)
    python = sys.executable if spec.container.type == "none" else spec.container.python
    context = {
        "spec": spec,
        "version": __version__,
        "deploy_dir": str(deploy_dir),
        "sbatch_lines": serving_options(spec, deploy_dir).lines(),
        "srun_args": srun,
        "wrapper": wrapper,
        "python": python,
        "source_root": str(Deployment(deploy_dir).runtime),
        "stop_ack_s": STOP_ACK_S,  # the stop request unanswered this long: scancel --signal=TERM (the .sub's trap)
        "stop_request_format": stop_request_format(),  # what the trap writes (launcher/contracts/stop_records.py StopRequest)
        # renewal (launcher/jobscript/renew.py): run on the batch node with this install's interpreter, as gateway.sub is
        "renew": spec.renew is not None,
        "renew_python": sys.executable,
        "site_profile": site_profile(spec),
        **replica_context(plan, serving_gres(spec) is not None),
        **template_values(deploy_dir),  # every name and path in the folder (launcher/contracts/layout.py)
        **job_index.template_values(),  # the lines that index the job (launcher/contracts/job_index.py)
        **launcher.contracts.rank.template_values(),  # the variables the scripts set for a rank or read (launcher/contracts/rank.py)
    }
    scripts = {
        SUB_NAME: env.get_template(SUB_NAME + ".j2").render(context),
        SH_NAME: env.get_template(SH_NAME + ".j2").render(context),
    }
    if plan.gateway:
        scripts[GATEWAY_SUB_NAME] = env.get_template(GATEWAY_SUB_NAME + ".j2").render(
            context | gateway_context(spec, deploy_dir)
        )
    return scripts


def site_profile(spec: Spec) -> str | None:
    """The site profile the spec was merged with, as an absolute path for the script's header (the script holds
    its values; nothing reads the profile at run time)."""
    origin = provenance(spec)
    if origin is None or origin.profile is None:
        return None
    return " ".join(str(Path(origin.profile).resolve()).splitlines())


def replica_context(plan: DeploymentPlan, gpus: bool) -> dict[str, Any]:
    """What the `.sub` needs to run the plan's srun step per replica (hpc/spec/placement.py) and to clean up after
    one: each step's placement options, and the nodes and shared-memory regions of its ranks."""
    spec, steps = plan.spec, plan.steps
    # restart: its bound; any other policy restarts a start crash only (launcher/contracts/config.py)
    max_restarts = spec.restart_bounds.max_restarts if spec.replica_policy == RESTART else START_CRASH_RESTARTS
    return {
        "steps": [
            {
                "replica": step.replica,
                "options": step_options(step, spec.slurm.cpus_per_task, gpus),
                # one task on each of the step's nodes, beside whatever still runs there
                "cleanup": [f"--nodes={step.nodes}", f"--ntasks={step.nodes}", f"--relative={step.relative}"],
                "shm": [shm_glob_shell(rank) for rank in step.ranks()],
                "endpoint": f"{ENDPOINTS_NAME}/{ENDPOINT_NAME.format(replica=step.replica)}",
                "starting": f"{ENDPOINTS_NAME}/{STARTING_NAME.format(replica=step.replica)}",
                "ranks": list(step.ranks()),
            }
            for step in steps
        ],
        "step_cpus": any(step.shares_node for step in steps) and not spec.slurm.cpus_per_task,
        "fail_job": spec.replica_policy in (FAIL_JOB, RESTART),  # restart: once a replica is not restarted
        "restart": spec.replica_policy == RESTART,
        "restart_bounds": spec.restart_bounds,
        "max_restarts": max_restarts,
        "start_crash_restarts": START_CRASH_RESTARTS,
        "restart_format": ReplicaRestart.shell(max_restarts),
        "restart_outcomes": {"restarting": RESTARTING, "gave_up": GAVE_UP, "not_restartable": NOT_RESTARTABLE},
    }


#: how many times a gateway job starts its gateway again after it died of a signal it was not sent (gateway.sub)
GATEWAY_RESTARTS = 5


def gateway_context(spec: Spec, deploy_dir: Path) -> dict[str, Any]:
    """What the gateway's own script adds: its job's #SBATCH lines (hpc/render/sbatch.py), and the interpreter
    and source of this hpc-serve install (the gateway is `hpc/` code, never run in the serving job's container)."""
    g = spec.gateway
    assert g is not None
    return {
        "gateway": g,
        "workdir": str(deploy_dir.parent),
        "record_path": str(gateway_record(deploy_dir.parent, spec.name)),
        "sbatch_lines": gateway_options(spec, deploy_dir).lines(),
        "python": sys.executable,
        "source_root": str(SOURCE_ROOT),
        # the gateway job renews itself too (hpc/jobs/renewal.py), and runs the autoscaling controller: both read
        # the deployment folder it is named (`--renew-from`)
        "renew": spec.renew is not None or spec.autoscale is not None,
        "gateway_restarts": GATEWAY_RESTARTS,
    }


def ship_packages(dest: Path) -> None:
    """Copy hpc-serve's rank-side packages (launcher/, backend/) into `dest` (`D/python`): the ranks import
    exactly the code that rendered the folder, and nothing else of the environment it was installed into."""
    for name in SHIPPED_PACKAGES:
        shutil.copytree(SOURCE_ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def render(spec: Spec, out_dir: str | Path, templates: Path | None = None) -> Rendered:
    """Write the deployment folder of `spec` into `out_dir` (`render_plan` of its plan)."""
    return render_plan(plan_deployment(spec, deployment_folder(out_dir)), templates)


def render_plan(plan: DeploymentPlan, templates: Path | None = None) -> Rendered:
    """Write the plan's deployment folder. Files are written to a temporary sibling first and moved into place, so
    a failure leaves no half-written deployment behind; an existing folder's job records are kept.

    Render is a preview: it writes into the plan's folder only and never creates the model a spec's `model.init`
    asks for (hpc/jobs/model_init.py does, from `submit`, `launch SPEC` or `hpc-serve init-model`)."""
    from backend.repository import check_replaceable

    spec, deploy_dir = plan.spec, plan.deploy_dir
    if not is_script_safe_path(deploy_dir):
        raise ValueError(
            f"{deploy_dir}: the deployment folder's path must not contain spaces, quotes or shell characters "
            "(Slurm's #SBATCH -o cannot quote them)"
        )
    if spec.container.type != "none" and ("," in str(deploy_dir) or ":" in str(deploy_dir)):
        raise ValueError(
            f"{deploy_dir}: with container.type {spec.container.type} the deployment folder is mounted as SRC:DST "
            "in a comma-separated list, so its path must not contain ',' or ':'"
        )
    scripts = plan_scripts(plan, templates)
    dep = Deployment(deploy_dir)
    check_replaceable(dep.model_repository)  # before anything is written: nothing half-done
    deploy_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{deploy_dir.name}.", dir=deploy_dir.parent))
    staged = Deployment(staging)
    try:
        write_repository(plan, staged.model_repository)
        ship_packages(staged.runtime)
        for name, text in scripts.items():
            (staging / name).write_text(text)
            (staging / name).chmod(0o755)
        plan.launch.write(staged.launch)
        staged.spec.write_text(dump_spec(spec))
        deploy_dir.mkdir(exist_ok=True)
        dep.logs_dir.mkdir(exist_ok=True)
        dep.jobs_dir.mkdir(exist_ok=True)
        if plan.token:  # before launch.json: a rank that sees it reads the token
            ensure_deployment_token(deploy_dir, spec.workdir, spec.name)
        # launch.json goes last: ranks of `hpc-serve launch SPEC` wait for it as the sign that all is in place.
        for entry in sorted(staging.iterdir(), key=lambda e: e.name == LAUNCH_NAME):
            target = deploy_dir / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)
        if GATEWAY_SUB_NAME not in scripts:
            dep.gateway_sub.unlink(missing_ok=True)  # a re-render without the gateway leaves no stale script
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Rendered(
        deploy_dir=deploy_dir,
        sub=dep.sub,
        sh=dep.sh,
        model_repository=dep.model_repository,
        launch=dep.launch,
        gateway_sub=dep.gateway_sub if GATEWAY_SUB_NAME in scripts else None,
    )
