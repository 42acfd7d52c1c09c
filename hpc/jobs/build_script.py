"""The build job's script (`D/build.sub`, hpc/render/templates/build.sub.j2): its steps' exact command lines.

For `backend: tensorrtllm`, upstream's workflow: `convert_checkpoint.py --tp_size --pp_size` (or `quantize.py
--qformat` when `build.quantization` is set) into a TensorRT-LLM checkpoint with one `rank<r>.safetensors` per
rank, then `trtllm-build` with the plugin flags and limits, which builds every rank's engine. Both tools cut
the ranks themselves in one process (`--workers` of them in parallel on the node's GPUs), so the job is one task
on one node with min(tp × pp, gpus_per_node) GPUs; `--gpus_per_node` is what TensorRT-LLM's rank → GPU mapping
uses at serve time (tensorrt_llm/commands/build.py sets `mapping.gpus_per_node` from it).
For `backend: cpu`: `model.init`'s checkpoint when it is missing, then one rank file per tensor-parallel rank
(backend/cpu_engine/shards.py). Last, both record what built the engine and move it into place
(launcher/jobscript/build_record.py).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import launcher.contracts.rank
from hpc import __version__
from hpc.jobs.build_plan import BuildPlan
from hpc.render.jobfiles import _environment, _srun_and_wrapper, ship_packages
from hpc.spec import Spec
from hpc.spec.build import build_gpus_per_node
from launcher.contracts import job_index
from launcher.contracts.build_records import BUILD_STARTED_ENV, FAILURE_FORMAT, STEP_FORMAT
from launcher.contracts.layout import (
    BUILD_STAGING_NAME,
    BUILD_SUB_NAME,
    BUILDING_MARKER_NAME,
    RUNTIME_NAME,
    Deployment,
    template_values,
)

#: the placeholder of the job's staging folder in command lines (the script's `$STAGING`, known only at run time)
STAGING = "$STAGING"


def _sh(arg: object) -> str:
    """Shell text of one argument: quoted, except the staging folder's variable in front."""
    text = str(arg)
    if text == STAGING or text.startswith(STAGING + "/"):
        rest = text[len(STAGING) :]
        return '"$STAGING"' + (shlex.quote(rest) if rest else "")
    return shlex.quote(text)


def _python(spec: Spec) -> str:
    return sys.executable if spec.container.type == "none" else spec.container.python


def build_steps(spec: Spec, plan: BuildPlan, deploy_dir: Path) -> list[dict[str, Any]]:
    """Every step: its name, its command (argv), and `unless` (a path whose existence skips it, or None)."""
    return [{"unless": None, **step} for step in _steps(spec, plan, deploy_dir)]


def _steps(spec: Spec, plan: BuildPlan, deploy_dir: Path) -> list[dict[str, Any]]:
    b, m = spec.build, spec.model
    assert b is not None
    python, src = _python(spec), str(plan.source)
    record = [python, "-m", "launcher.jobscript.build_record", "finish", str(Deployment(deploy_dir).build_request)]
    if m.backend == "cpu":
        steps: list[dict[str, Any]] = []
        if m.init is not None:  # the checkpoint model.init asks for, made here rather than by submit
            init = ["--family", m.init.family, "--size", m.init.size, "--weights-seed", str(m.init.seed)]
            steps.append(
                {
                    "name": "init-model",
                    "argv": [python, "-m", "backend.cpu_engine.init_model", src, *init],
                    "unless": f"{src}/config.json",
                }
            )
        steps.append(
            {
                "name": "shard",
                "argv": [python, "-m", "backend.cpu_engine.shards", src, f"{STAGING}/engine", "--tp", str(m.tp_size)],
            }
        )
        steps.append({"name": "record", "argv": [*record, f"{STAGING}/engine"]})
        return steps
    workers = str(b.workers or min(m.tp_size * m.pp_size, build_gpus_per_node(spec)))
    parallel = ["--tp_size", str(m.tp_size), "--pp_size", str(m.pp_size)]
    dtype = [] if b.dtype == "auto" else ["--dtype", b.dtype]  # auto: the tools' own default (the model's)
    checkpoint = f"{STAGING}/checkpoint"
    if b.quantization:
        quant = ["--qformat", b.quantization]
        quant += ["--kv_cache_dtype", b.kv_cache_dtype] if b.kv_cache_dtype else []
        quant += ["--calib_size", str(b.calib_size)] if b.calib_size else []
        convert = {
            "name": "quantize",
            "argv": [python, b.quantize_script, "--model_dir", src, "--output_dir", checkpoint, *dtype, *quant]
            + [*parallel, *b.quantize_args],
        }
    else:
        assert b.convert_script is not None
        convert = {
            "name": "convert",
            "argv": [python, b.convert_script, "--model_dir", src, "--output_dir", checkpoint, *dtype, *parallel]
            + ["--workers", workers, *b.convert_args],
        }
    limits = ["--max_batch_size", str(b.max_batch_size or spec.triton.triton_max_batch_size)]
    limits += ["--max_input_len", str(b.max_input_len)]
    limits += ["--max_seq_len", str(b.max_seq_len)] if b.max_seq_len else []
    limits += ["--max_num_tokens", str(b.max_num_tokens)] if b.max_num_tokens else []
    plugins = [arg for key, value in sorted(b.plugin_flags().items()) for arg in (f"--{key}", value)]
    trtllm_build = ["trtllm-build", "--checkpoint_dir", checkpoint, "--output_dir", f"{STAGING}/engine"]
    trtllm_build += ["--gpus_per_node", str(build_gpus_per_node(spec)), *limits, "--workers", workers]
    return [
        convert,
        {"name": "trtllm-build", "argv": [*trtllm_build, *plugins, *b.build_args]},
        {"name": "record", "argv": [*record, f"{STAGING}/engine"]},
    ]


def build_gres(spec: Spec) -> str | None:
    """The build job's GPUs: as many as the tools use at once (one per rank, at most a node's)."""
    if spec.model.backend != "tensorrtllm":
        return None
    count = min(spec.model.tp_size * spec.model.pp_size, build_gpus_per_node(spec))
    return f"gpu:{count}"


def render_build_script(spec: Spec, plan: BuildPlan, deploy_dir: Path, templates: Path | None = None) -> str:
    """The text of `D/build.sub` (what `render` writes and the golden tests compare)."""
    b = spec.build
    assert b is not None
    env = _environment(templates)
    env.filters["sh"] = _sh
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
        "partition": b.partition or spec.slurm.partition,
        "time": b.time or spec.slurm.time,
        "gres": build_gres(spec),
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
    plan.request_file([{"name": s["name"], "command": " ".join(_sh(a) for a in s["argv"])} for s in steps]).write(
        dep.build_request
    )
    dep.build_sub.write_text(render_build_script(spec, plan, deploy_dir, templates))
    dep.build_sub.chmod(0o755)
    return dep.build_sub
