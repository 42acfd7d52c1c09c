"""The spec checks that need the file system, in two kinds.

*Missing inputs* are folders and images a job reads that are not there (yet) on this machine: the engine,
checkpoint, tokenizer, an Apptainer image, mount sources. `validate` and `submit` refuse them; `render` and
`submit --dry-run` only note them, because a preview of the scripts is useful before the engine is built.
*Conflicts* make scripts that cannot work whatever exists later (an engine built for another TP×PP, paths
Slurm or a mount list cannot take); every command refuses them.

Findings are `(field path, message)`; hpc/spec/load.py turns them into located Problems (types only from hpc.spec.schema, so no cycle).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpc.spec.schema import ModelSpec, Spec

Finding = tuple[tuple[str, ...], str]

_SAFE_PATH = re.compile(r"^[A-Za-z0-9_.,:+@=/~\-]+$")


def is_script_safe_path(path: str | Path) -> bool:
    """True if a path can be written into `#SBATCH -o` and scripts without quoting problems."""
    return bool(_SAFE_PATH.fullmatch(str(path)))


def missing_inputs(spec: Spec) -> list[Finding]:
    """Folders and images the job reads that do not exist here. A checkpoint that `model.init` will create
    is not missing."""
    found: list[Finding] = []
    m = spec.model
    if m.backend == "tensorrtllm" and m.engine_dir is not None and not m.engine_dir.is_dir():
        found.append((("model", "engine_dir"), f"{m.engine_dir} does not exist; point it at the trtllm-build output"))
    if m.backend == "cpu" and m.checkpoint_dir is not None and not m.checkpoint_dir.is_dir() and m.init is None:
        found.append(
            (
                ("model", "checkpoint_dir"),
                f"{m.checkpoint_dir} does not exist; create one with `hpc-serve init-model {m.checkpoint_dir}` "
                "or add `init: {family: gpt2}` to have `hpc-serve submit` create it",
            )
        )
    if m.tokenizer_dir is not None and not m.tokenizer_dir.is_dir():
        found.append((("model", "tokenizer_dir"), f"{m.tokenizer_dir} does not exist"))
    image = spec.container.image
    if spec.container.type == "apptainer" and image and image.endswith(".sif") and not Path(image).exists():
        found.append((("container", "image"), f"{image} does not exist"))
    for i, mount in enumerate(spec.container.mounts):
        src = Path(mount.split(":")[0])
        if not src.exists():
            found.append((("container", "mounts", str(i)), f"mount source {src} does not exist"))
    return found


def conflicts(spec: Spec) -> list[Finding]:
    """What makes the rendered scripts wrong whatever is created later."""
    found = _parallelism_conflicts(spec.model)
    workdir = str(spec.workdir)
    if not is_script_safe_path(workdir):
        found.append(
            (("workdir",), f"{workdir!r} has characters (spaces, quotes, $...) that Slurm's #SBATCH -o cannot take")
        )
    for i, mount in enumerate(spec.container.mounts):
        if "," in mount:
            found.append(
                (
                    ("container", "mounts", str(i)),
                    f"{mount!r}: a ',' would split it into several mounts "
                    "(pyxis --container-mounts and apptainer -B take comma-separated lists)",
                )
            )
    if spec.container.type != "none":
        # Model folders are mounted at their own path as SRC:SRC in a comma-separated list (hpc/render.py).
        for field in ("engine_dir", "checkpoint_dir", "tokenizer_dir"):
            value = getattr(spec.model, field)
            if value is not None and ("," in str(value) or ":" in str(value)):
                found.append(
                    (
                        ("model", field),
                        f"{value}: a path with ',' or ':' cannot be mounted into the "
                        "container (they separate mounts and SRC:DST); rename or symlink the folder",
                    )
                )
    return found


def _parallelism_conflicts(m: ModelSpec) -> list[Finding]:
    """An engine built for another TP×PP, or a CPU checkpoint whose heads tp_size does not divide."""
    if m.backend == "tensorrtllm" and m.engine_dir is not None and m.engine_dir.is_dir():
        built = _engine_parallelism(m.engine_dir)
        if built and built != (m.tp_size, m.pp_size):
            return [
                (
                    ("model", "tp_size"),
                    f"engine in {m.engine_dir} was built for tp_size {built[0]} × pp_size {built[1]}, "
                    f"the spec says tp_size {m.tp_size} × pp_size {m.pp_size}; rebuild or change the spec",
                )
            ]
    if m.backend == "cpu" and m.checkpoint_dir is not None and m.checkpoint_dir.is_dir():
        heads = _attention_heads(m.checkpoint_dir)
        if heads and any(h % m.tp_size for h in heads):
            return [(("model", "tp_size"), f"tp_size {m.tp_size} does not divide the model's attention heads {heads}")]
    return []


def _read_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _engine_parallelism(engine_dir: Path) -> tuple[int, int] | None:
    """(tp, pp) an engine was built for, from trtllm-build's config.json (new or legacy layout)."""
    config = _read_config(engine_dir)
    mapping = config.get("pretrained_config", {}).get("mapping")
    if mapping:
        return int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    builder = config.get("builder_config", {})
    if "tensor_parallel" in builder:
        return int(builder["tensor_parallel"]), int(builder.get("pipeline_parallel", 1))
    return None


def _attention_heads(checkpoint: Path) -> tuple[int, ...] | None:
    config = _read_config(checkpoint)
    heads = config.get("num_attention_heads", config.get("n_head"))
    kv = config.get("num_key_value_heads", heads)
    return tuple(int(h) for h in (heads, kv) if h) or None
