"""The build job's script (`D/build.sub`, hpc/render/templates/build.sub.j2): the steps hpc/jobs/build_script.py
decides, rendered with the job's #SBATCH lines (hpc/render/sbatch.py) and the serving job's srun flags and
container wrapper (hpc/render/jobfiles.py), mounting the build's own folders."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import launcher.contracts.rank
from hpc import __version__
from hpc.render.jobfiles import srun_and_wrapper, template_environment
from hpc.render.sbatch import build_options
from hpc.spec import Spec
from launcher.contracts import job_index
from launcher.contracts.build_records import BUILD_STARTED_ENV, FAILURE_FORMAT, STEP_FORMAT
from launcher.contracts.layout import (
    BUILD_STAGING_NAME,
    BUILD_SUB_NAME,
    BUILDING_MARKER_NAME,
    RUNTIME_NAME,
    template_values,
)

#: the placeholder of the job's staging folder in command lines (the script's `$STAGING`, known only at run time)
STAGING = "$STAGING"


def shell_word(arg: object) -> str:
    """Shell text of one argument: quoted, except the staging folder's variable in front."""
    text = str(arg)
    if text == STAGING or text.startswith(STAGING + "/"):
        rest = text[len(STAGING) :]
        return '"$STAGING"' + (shlex.quote(rest) if rest else "")
    return shlex.quote(text)


@dataclass(frozen=True)
class BuildScript:
    """What a build job does (hpc/jobs/build_script.py decides it): builds `source` into `engine_dir` under
    `output_root`, named by `key`, with `steps` (each one's name, argv, and `unless`: a path whose existence skips
    it, or None)."""

    source: Path
    engine_dir: Path
    output_root: Path
    key: str
    steps: list[dict[str, Any]]


def render_build(spec: Spec, build: BuildScript, deploy_dir: Path, templates: Path | None = None) -> str:
    """The text of `D/build.sub`."""
    env = template_environment(templates)
    env.filters["sh"] = shell_word
    srun, wrapper = srun_and_wrapper(spec, deploy_dir, (build.source, build.output_root))
    context = {
        "spec": spec,
        "version": __version__,
        "deploy_dir": str(deploy_dir),
        "backend_words": spec.model.backend_strategy.build_words,
        "source": str(build.source),
        "engine_dir": str(build.engine_dir),
        "output_root": str(build.output_root),
        "key": build.key,
        # the job's own names in the engine cache, with its id as the script knows it (launcher/contracts/layout.py)
        "staging_name": BUILD_STAGING_NAME.format(key=build.key, job="$JOB_ID"),
        "building_marker_name": BUILDING_MARKER_NAME.format(key=build.key, job="$JOB_ID"),
        "sbatch_lines": build_options(spec, deploy_dir).lines(),
        "srun_args": srun,
        "wrapper": wrapper,
        "steps": build.steps,
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
