"""The build job's script and request (`D/build.sub`, `D/build_request.json`): hpc/jobs/build_script.py's steps
rendered with hpc/render/templates/build.sub.j2, its #SBATCH lines from hpc/render/sbatch.py, its srun flags and
container wrapper the serving job's (hpc/render/jobfiles.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import launcher.contracts.rank
from hpc import __version__
from hpc.jobs.build_plan import BuildPlan
from hpc.jobs.build_script import STAGING, build_steps
from hpc.render.jobfiles import _environment, _srun_and_wrapper, ship_packages
from hpc.render.sbatch import build_options
from hpc.spec import Spec
from launcher.contracts import job_index
from launcher.contracts.build_records import FAILURE_FORMAT, STEP_FORMAT
from launcher.contracts.layout import (
    BUILD_STAGING_NAME,
    BUILD_SUB_NAME,
    BUILDING_MARKER_NAME,
    RUNTIME_NAME,
    Deployment,
    template_values,
)
from launcher.jobscript.build_record import BUILD_STARTED_ENV


def shell_word(arg: object) -> str:
    """Shell text of one argument: quoted, except the staging folder's variable in front."""
    text = str(arg)
    if text == STAGING or text.startswith(STAGING + "/"):
        rest = text[len(STAGING) :]
        return '"$STAGING"' + (shlex.quote(rest) if rest else "")
    return shlex.quote(text)


def render_build_script(spec: Spec, plan: BuildPlan, deploy_dir: Path, templates: Path | None = None) -> str:
    """The text of `D/build.sub` (what `render` writes and the golden tests compare)."""
    b = spec.build
    assert b is not None
    env = _environment(templates)
    env.filters["sh"] = shell_word
    srun, wrapper = _srun_and_wrapper(spec, deploy_dir, (plan.source, b.output_dir))
    context = {
        "spec": spec,
        "version": __version__,
        "deploy_dir": str(deploy_dir),
        "backend_words": "TensorRT-LLM" if spec.model.backend == "tensorrtllm" else "CPU engine shards",
        "source": str(plan.source),
        "engine_dir": str(plan.engine_dir),
        "output_root": str(b.output_dir),
        "key": plan.key,
        # the job's own names in the engine cache, with its id as the script knows it (launcher/contracts/layout.py)
        "staging_name": BUILD_STAGING_NAME.format(key=plan.key, job="$JOB_ID"),
        "building_marker_name": BUILDING_MARKER_NAME.format(key=plan.key, job="$JOB_ID"),
        "sbatch_lines": build_options(spec, deploy_dir).lines(),
        "srun_args": srun,
        "wrapper": wrapper,
        "steps": build_steps(spec, plan, deploy_dir),
        "runtime_name": RUNTIME_NAME,
        "build_started_env": BUILD_STARTED_ENV,
        # how the steps record themselves (launcher/contracts/build_records.py): `status` reads those records, not the log
        "build_step_format": STEP_FORMAT,
        "build_failure_format": FAILURE_FORMAT,
        **template_values(deploy_dir),
        **job_index.template_values(),
        **launcher.contracts.rank.template_values(),
    }
    return env.get_template(BUILD_SUB_NAME + ".j2").render(context)


def write_build(spec: Spec, plan: BuildPlan, deploy_dir: Path, templates: Path | None = None) -> Path:
    """Write `D/build.sub` and `D/build_request.json` (and the shipped packages, when `render` has not) into an
    existing or new deployment folder; the script's path. Creates no checkpoint and no engine. `templates`: a
    site's folder that overrides hpc/render/templates/ (`hpc-serve render --templates`), as for the other scripts."""
    dep = Deployment(deploy_dir)
    deploy_dir.mkdir(parents=True, exist_ok=True)
    dep.logs_dir.mkdir(exist_ok=True)
    dep.jobs_dir.mkdir(exist_ok=True)
    if not (dep.runtime / "launcher").is_dir():
        ship_packages(dep.runtime)
    steps = build_steps(spec, plan, deploy_dir)
    plan.request_file([{"name": s["name"], "command": " ".join(map(shell_word, s["argv"]))} for s in steps]).write(
        dep.build_request
    )
    dep.build_sub.write_text(render_build_script(spec, plan, deploy_dir, templates))
    dep.build_sub.chmod(0o755)
    return dep.build_sub
