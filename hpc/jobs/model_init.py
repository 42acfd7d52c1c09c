"""Creating the checkpoint a spec's `model.init` asks for (random weights for backend cpu, a simulated model's
config.json and tokenizer for backend sim): an explicit step, never a side effect
of `render` or `submit --dry-run` (those are previews; training a tokenizer is not something a preview does).

Who calls `ensure_model`: `hpc-serve submit` (and `hpc.api.submit`) and `hpc-serve launch SPEC`, just before
they render the folder that will run. By hand: `hpc-serve init-model DIR ...`, the command `init_command` gives.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hpc.spec import ModelInit, Spec


def model_to_create(spec: Spec) -> tuple[Path, ModelInit] | None:
    """The checkpoint folder `model.init` asks for and how, when it does not hold a checkpoint yet; else None."""
    m = spec.model
    if not m.backend_strategy.makes_checkpoints or m.init is None or m.checkpoint_dir is None or spec.build is not None:
        return None  # with a build: section the build job creates it (hpc/jobs/build_script.py)
    return None if (m.checkpoint_dir / "config.json").exists() else (m.checkpoint_dir, m.init)


def init_command(spec: Spec) -> str | None:
    """`hpc-serve init-model ...` that creates exactly what `ensure_model` would, or None if nothing is due."""
    return create_command(model_to_create(spec))


def create_command(due: tuple[Path, ModelInit] | None) -> str | None:
    """`hpc-serve init-model ...` that creates `due` (`model_to_create`'s), or None if nothing is due."""
    if due is None:
        return None
    target, init = due
    if init.model is not None:  # backend sim: a simulated model's config.json and tokenizer
        return f"hpc-serve init-model {shlex.quote(str(target))} --sim-model {init.model}"
    return f"hpc-serve init-model {shlex.quote(str(target))} --family {init.family} --size {init.size} --weights-seed {init.seed}"


def ensure_model(spec: Spec) -> Path | None:
    """Create the checkpoint and tokenizer `model.init` asks for if they are missing; the folder created, or None."""
    return create_model(model_to_create(spec))


def create_model(due: tuple[Path, ModelInit] | None) -> Path | None:
    """Create `due` (`model_to_create`'s: the checkpoint folder and how); the folder created, or None."""
    if due is None:
        return None
    target, init = due
    if init.model is not None:  # backend sim (its check_init always names one)
        from backend.sim_engine.checkpoint import create_sim_checkpoint

        create_sim_checkpoint(target, init.model)
        return target
    from backend.cpu_engine.init_model import create_checkpoint

    create_checkpoint(target, family=init.family, size=init.size, seed=init.seed)
    return target
