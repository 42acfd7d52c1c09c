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

from hpc.spec.checkpoint import checkpoint_conflicts, checkpoint_missing

if TYPE_CHECKING:
    from hpc.spec.model import ModelSpec
    from hpc.spec.schema import Spec

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
    if m.backend_strategy.serves_built_engine and m.engine_dir is not None and not m.engine_dir.is_dir():
        found.append((("model", "engine_dir"), f"{m.engine_dir} does not exist; point it at the trtllm-build output"))
    if m.checkpoint_dir is not None and not m.checkpoint_dir.is_dir() and m.init is None:
        found.append(
            (
                ("model", "checkpoint_dir"),
                f"{m.checkpoint_dir} does not exist; create one with `hpc-serve init-model {m.checkpoint_dir}` "
                "or add `init: {family: gpt2}` to have `hpc-serve submit` create it"
                if m.backend_strategy.makes_checkpoints
                else f"{m.checkpoint_dir} does not exist; point it at a Hugging Face checkpoint folder "
                "(config.json, *.safetensors, tokenizer files)",
            )
        )
    if m.model_files_from is not None and spec.container.type == "none" and not Path(m.model_files_from).is_dir():
        found.append(
            (
                ("model", "model_files_from"),
                f"{m.model_files_from} does not exist here, and with container.type none the ranks run here: point "
                "model.model_files_from at the folder holding TensorRT-LLM's llmapi model.py and helpers.py "
                "(triton_backend/all_models/llmapi/tensorrt_llm/1 of its source)",
            )
        )
    b = spec.build
    if b is not None and b.checkpoint_dir is not None and not b.checkpoint_dir.is_dir() and m.init is None:
        found.append(
            (
                ("build", "checkpoint_dir"),
                f"{b.checkpoint_dir} does not exist; point it at the checkpoint to build from",
            )
        )
    if m.tokenizer_dir is not None and not m.tokenizer_dir.is_dir():
        found.append((("model", "tokenizer_dir"), f"{m.tokenizer_dir} does not exist"))
    found += checkpoint_missing(spec)
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
    found = _parallelism_conflicts(spec.model) + engine_limit_conflicts(spec) + checkpoint_conflicts(spec)
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
        # Model folders are mounted at their own path as SRC:SRC in a comma-separated list (hpc/render/jobfiles.py).
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
    if m.backend_strategy.serves_built_engine and m.engine_dir is not None and m.engine_dir.is_dir():
        built = _engine_parallelism(m.engine_dir)
        if built and built != (m.tp_size, m.pp_size):
            return [
                (
                    ("model", "tp_size"),
                    f"engine in {m.engine_dir} was built for tp_size {built[0]} × pp_size {built[1]}, "
                    f"the spec says tp_size {m.tp_size} × pp_size {m.pp_size}; rebuild or change the spec",
                )
            ]
    shards = m.workflow_strategy.ensemble_repository and not m.serves_built_engine  # the CPU engine shards it
    if shards and m.checkpoint_dir is not None and m.checkpoint_dir.is_dir():
        heads = _attention_heads(m.checkpoint_dir)
        if heads and any(h % m.tp_size for h in heads):
            return [(("model", "tp_size"), f"tp_size {m.tp_size} does not divide the model's attention heads {heads}")]
    return []


def engine_limits(config: dict) -> dict[str, int | None] | None:
    """What an engine was built for, from trtllm-build's config.json; None when it is not one.

    The layout is TensorRT-LLM's `EngineConfig.to_dict()` (tensorrt_llm/builder.py, written by `Engine.save` as
    `<engine_dir>/config.json`): {"version", "pretrained_config": {..., "mapping": Mapping.to_dict()},
    "build_config": BuildConfig.to_dict()}. `mapping` (tensorrt_llm/mapping.py) has world_size, rank,
    gpus_per_node, tp_size, pp_size; trtllm-build sets its gpus_per_node from `--gpus_per_node` (default 8,
    tensorrt_llm/commands/build.py: `model_config.mapping.gpus_per_node = build_config.auto_parallel_config.
    gpus_per_node`). `build_config` has max_batch_size, max_input_len, max_seq_len, max_num_tokens. Engines of
    the older `build.py` scripts have a `builder_config` with tensor_parallel, pipeline_parallel, max_batch_size,
    max_input_len and max_output_len instead."""
    build = config.get("build_config")
    if isinstance(build, dict) or isinstance(config.get("pretrained_config"), dict):
        build = build if isinstance(build, dict) else {}
        mapping = (config.get("pretrained_config") or {}).get("mapping") or {}
        return {
            "tp_size": _int(mapping.get("tp_size", 1)),
            "pp_size": _int(mapping.get("pp_size", 1)),
            "gpus_per_node": _int(mapping.get("gpus_per_node")),
            "max_batch_size": _int(build.get("max_batch_size")),
            "max_input_len": _int(build.get("max_input_len")),
            "max_seq_len": _int(build.get("max_seq_len")),
            "max_num_tokens": _int(build.get("max_num_tokens")),
        }
    legacy = config.get("builder_config")
    if isinstance(legacy, dict):
        inputs, outputs = _int(legacy.get("max_input_len")), _int(legacy.get("max_output_len"))
        return {
            "tp_size": _int(legacy.get("tensor_parallel", 1)),
            "pp_size": _int(legacy.get("pipeline_parallel", 1)),
            "gpus_per_node": None,
            "max_batch_size": _int(legacy.get("max_batch_size")),
            "max_input_len": inputs,
            "max_seq_len": inputs + outputs if inputs and outputs else None,
            "max_num_tokens": _int(legacy.get("max_num_tokens")),
        }
    return None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def engine_limit_conflicts(spec: Spec) -> list[Finding]:
    """The serving side against what the engine was built for: its GPUs per node (rank → GPU) and its limits. The
    engine's config.json when `model.engine_dir` holds one; with a `build:` section, the build's own arguments
    (hpc/spec/build.py `build_limits`): both refused here, before a GPU hour is spent."""
    m = spec.model
    if not m.serves_built_engine:
        return []
    if spec.build is not None:
        from hpc.spec.build import build_limits

        limits: dict[str, int | None] | None = build_limits(spec)
        where, fix = "the build: section's", "build.{field} {value}"
    elif m.engine_dir is not None and m.engine_dir.is_dir():
        limits = engine_limits(_read_config(m.engine_dir))
        where, fix = f"the engine in {m.engine_dir}", "trtllm-build --{field} {value} (then serve that engine)"
    else:
        return []
    if limits is None:
        return []
    found: list[Finding] = []
    t, per_node = spec.triton, spec.tasks_per_node
    built_gpn, ranks = limits["gpus_per_node"], spec.world_size_per_replica
    if built_gpn and built_gpn != per_node and ranks > min(built_gpn, per_node):
        found.append(
            (
                ("slurm", "gpus_per_node"),
                f"{where} mapping.gpus_per_node is {built_gpn}, but the job runs {per_node} ranks per node "
                f"(slurm.gpus_per_node {spec.slurm.gpus_per_node}): TensorRT-LLM puts rank r on GPU r % {built_gpn}, "
                f"so rank {min(built_gpn, per_node)} would look for a GPU of another node; build with "
                + fix.format(field="gpus_per_node", value=per_node),
            )
        )
    batch = limits["max_batch_size"]
    if batch and t.triton_max_batch_size > batch:
        found.append(
            (
                ("triton", "triton_max_batch_size"),
                f"{t.triton_max_batch_size} is more than {where} max_batch_size {batch}; lower it to {batch} or "
                "build with " + fix.format(field="max_batch_size", value=t.triton_max_batch_size),
            )
        )
    seq = limits["max_seq_len"]
    if seq and t.max_tokens_in_paged_kv_cache is not None and t.max_tokens_in_paged_kv_cache < seq:
        found.append(
            (
                ("triton", "max_tokens_in_paged_kv_cache"),
                f"{t.max_tokens_in_paged_kv_cache} tokens cannot hold one sequence of {where} max_seq_len {seq} "
                f"(prompt plus output); raise it to {seq} or more, or build with "
                + fix.format(field="max_seq_len", value=t.max_tokens_in_paged_kv_cache),
            )
        )
    windows = t.max_attention_window_size
    if seq and windows is not None and windows > seq:
        found.append(
            (
                ("triton", "max_attention_window_size"),
                f"{windows} is more than {where} max_seq_len {seq}: no sequence is that long; use {seq} or less",
            )
        )
    return found


def context_length(model: ModelSpec, max_seq_len: int | None = None) -> int | None:
    """The longest sequence (prompt plus new tokens) a replica of `model` serves: the engine's max_seq_len
    (trtllm-build's config.json), else the checkpoint's positions, cut to the llmapi workflow's `max_seq_len`
    when the spec sets one (the CPU engine caps so, backend/cpu_engine/model.py; TensorRT-LLM takes the LLM API's
    max_seq_len). None while its files do not say: an engine not built yet, a checkpoint `model.init` has yet to
    make.
    Why the gateway asks: a request whose new tokens would pass it is cut to the room left (a warning, not an
    error, in TensorRT-LLM and the CPU engine alike), and OpenAI clients read `finish_reason` "length" for a cut."""
    config = _read_config(model.source_dir)
    if model.serves_built_engine:
        limits = engine_limits(config)
        return limits["max_seq_len"] if limits else None
    from backend.cpu_engine.checkpoint import CheckpointError, parse_config

    try:
        positions = parse_config(config).max_position_embeddings
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None
    return positions if max_seq_len is None else min(positions, max_seq_len)


def _read_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _engine_parallelism(engine_dir: Path) -> tuple[int, int] | None:
    """(tp, pp) an engine was built for, from trtllm-build's config.json (new or legacy layout)."""
    config = _read_config(engine_dir)
    if not (config.get("pretrained_config") or {}).get("mapping") and "tensor_parallel" not in config.get(
        "builder_config", {}
    ):
        return None
    limits = engine_limits(config)
    return (limits["tp_size"] or 1, limits["pp_size"] or 1) if limits else None


def _attention_heads(checkpoint: Path) -> tuple[int, ...] | None:
    config = _read_config(checkpoint)
    heads = config.get("num_attention_heads", config.get("n_head"))
    kv = config.get("num_key_value_heads", heads)
    return tuple(int(h) for h in (heads, kv) if h) or None
