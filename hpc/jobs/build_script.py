"""What the build job runs (`D/build.sub`, rendered by hpc/render/build.py): its steps' exact command lines.

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

import sys
from pathlib import Path
from typing import Any

from hpc.jobs.build_plan import BuildPlan
from hpc.render.build import STAGING, BuildScript, render_build, shell_word
from hpc.render.jobfiles import ship_packages
from hpc.spec import Spec
from hpc.spec.build import build_gpus_per_node
from launcher.contracts.layout import Deployment


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
    if m.backend_strategy.makes_checkpoints:
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


def render_build_script(spec: Spec, plan: BuildPlan, deploy_dir: Path, templates: Path | None = None) -> str:
    """The text of `D/build.sub` (what `render` writes and the golden tests compare): the plan's steps, rendered
    by hpc/render/build.py."""
    b = spec.build
    assert b is not None
    build = BuildScript(plan.source, plan.engine_dir, b.output_dir, plan.key, build_steps(spec, plan, deploy_dir))
    return render_build(spec, build, deploy_dir, templates)


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
