"""The llmapi workflow's checks of the Hugging Face checkpoint it serves (model.checkpoint_dir): what
`LLM(model=...)` and the CPU engine read, refused here rather than on a node after the job has waited in the
queue. Only a folder that exists is read: one that `model.init` has yet to make, or that is missing (a finding
of hpc/spec/files.py `missing_inputs`), is not.

Findings are `(field path, message)`, as in hpc/spec/files.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpc.spec.schema import Spec

Finding = tuple[tuple[str, ...], str]

#: the tokenizer files of a Hugging Face folder, any one set of them: the fast tokenizer, a sentencepiece model,
#: GPT-2's byte-level BPE
TOKENIZER_FILE_SETS: tuple[tuple[str, ...], ...] = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("vocab.json", "merges.txt"),
)
#: weight files `from_pretrained` loads
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def _folder(spec: Spec) -> Path | None:
    """The checkpoint to read: the llmapi workflow's, when it exists."""
    m = spec.model
    folder = m.checkpoint_dir
    return folder if m.workflow_strategy.serves_checkpoint and folder is not None and folder.is_dir() else None


def checkpoint_missing(spec: Spec) -> list[Finding]:
    """The files a checkpoint folder must hold (config.json, weights, tokenizer): missing inputs, like a folder
    that is not there yet (a download under way)."""
    folder = _folder(spec)
    if folder is None:
        return []
    loc: tuple[str, ...] = ("model", "checkpoint_dir")
    found: list[Finding] = []
    if not (folder / "config.json").is_file():
        found.append((loc, f"{folder} has no config.json: not a Hugging Face checkpoint folder (yet)"))
    if spec.model.backend_strategy.needs_weights and not any(any(folder.glob(p)) for p in WEIGHT_PATTERNS):
        found.append((loc, f"{folder} has no weights ({' or '.join(WEIGHT_PATTERNS)})"))
    if not any(all((folder / name).is_file() for name in names) for names in TOKENIZER_FILE_SETS):
        sets = ", ".join(" + ".join(names) for names in TOKENIZER_FILE_SETS)
        found.append((loc, f"{folder} has no tokenizer files (one of: {sets})"))
    return found


def checkpoint_conflicts(spec: Spec) -> list[Finding]:
    """config.json that names no architecture (or one the CPU engine does not run), a tp × pp the model cannot
    be split by."""
    folder = _folder(spec)
    if folder is None or not (folder / "config.json").is_file():
        return []
    loc = ("model", "checkpoint_dir")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return [(loc, f"{folder}/config.json cannot be read as JSON: {exc}")]
    if not isinstance(config, dict):
        return [(loc, f"{folder}/config.json is not a JSON object")]
    return _architecture(config, folder, spec.model.backend_strategy.supported_architectures()) + _split(config, spec)


def _architecture(config: dict, folder: Path, supported: tuple[str, ...] | None) -> list[Finding]:
    """`architectures` names the model class TensorRT-LLM (or the CPU engine) builds."""
    loc = ("model", "checkpoint_dir")
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        return [(loc, f'{folder}/config.json names no architecture ("architectures": ["LlamaForCausalLM"], ...)')]
    if supported is not None:  # the CPU engine's (None: whatever TensorRT-LLM builds)
        if not set(archs) & set(supported):
            return [
                (
                    loc,
                    f"{folder}: architecture {', '.join(archs)} is not one the CPU engine runs "
                    f"({', '.join(supported)})",
                )
            ]
    return []


def _split(config: dict, spec: Spec) -> list[Finding]:
    """Tensor parallelism splits the attention heads (the CPU engine the KV heads too: TensorRT-LLM copies a KV
    head onto several ranks), pipeline parallelism the layers."""
    m, found = spec.model, list[Finding]()
    nested = config.get("text_config")  # a multimodal model's language part
    text: dict = nested if isinstance(nested, dict) else config
    heads = _number(text, "num_attention_heads", "n_head")
    kv = _number(text, "num_key_value_heads") or heads
    split = (heads, kv) if m.backend_strategy.splits_kv_heads else (heads,)
    if any(h and h % m.tp_size for h in split):
        found.append(
            (
                ("model", "tp_size"),
                f"tp_size {m.tp_size} does not divide the model's attention heads "
                f"({', '.join(str(h) for h in split if h)}); use a divisor",
            )
        )
    layers = _number(text, "num_hidden_layers", "n_layer")
    if layers and m.pp_size > layers:
        found.append((("model", "pp_size"), f"pp_size {m.pp_size} is more than the model's {layers} layers"))
    return found


def _number(config: dict, *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
