"""Load a Hugging Face checkpoint folder (config.json + *.safetensors) into fp32 numpy arrays.

Why numpy and not torch: the CPU engine runs inside Triton's python-backend stub on machines that have
neither a GPU nor TensorRT-LLM, and must stay importable with numpy + safetensors only.

Supported architectures: ``GPT2LMHeadModel`` and ``LlamaForCausalLM`` (the two families ``init_model`` writes
and the ones most TensorRT-LLM examples start from).  Weights are returned with HF names (minus any leading
``transformer.``/``model.`` prefix is *not* stripped: the model builder knows both spellings).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SUPPORTED_ARCHITECTURES = ("GPT2LMHeadModel", "LlamaForCausalLM")


class CheckpointError(ValueError):
    """The checkpoint folder is missing, malformed, or uses a feature the CPU engine does not implement."""


@dataclass(frozen=True)
class ModelConfig:
    """The architecture facts the engine needs, normalised across GPT-2 and Llama config spellings."""

    family: str  # "gpt2" | "llama"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def parse_config(cfg: dict[str, Any]) -> ModelConfig:
    """Map an HF ``config.json`` dict onto :class:`ModelConfig`; raise :class:`CheckpointError` naming what is unsupported."""
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type", "")
    if "GPT2LMHeadModel" in archs or (not archs and model_type == "gpt2"):
        hidden = int(cfg["n_embd"])
        heads = int(cfg["n_head"])
        return ModelConfig(
            family="gpt2",
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(cfg["n_layer"]),
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=hidden // heads,
            intermediate_size=int(cfg.get("n_inner") or 4 * hidden),
            max_position_embeddings=int(cfg.get("n_positions", 1024)),
            norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            attention_bias=True,
            mlp_bias=True,
            bos_token_id=_first_id(cfg.get("bos_token_id")),
            eos_token_id=_first_id(cfg.get("eos_token_id")),
            pad_token_id=_first_id(cfg.get("pad_token_id")),
            raw=cfg,
        )
    if "LlamaForCausalLM" in archs or (not archs and model_type == "llama"):
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"Llama hidden_act {act!r} is not supported by the CPU engine (only 'silu')")
        rope_params = cfg.get("rope_parameters") or {}
        rope_scaling = cfg.get("rope_scaling") or {}
        rope_type = (
            rope_params.get("rope_type") or rope_scaling.get("rope_type") or rope_scaling.get("type") or "default"
        )
        if rope_type != "default":
            raise CheckpointError(
                f"rope scaling type {rope_type!r} is not supported by the CPU engine (only 'default')"
            )
        theta = rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise CheckpointError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
        return ModelConfig(
            family="llama",
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            bos_token_id=_first_id(cfg.get("bos_token_id")),
            eos_token_id=_first_id(cfg.get("eos_token_id")),
            pad_token_id=_first_id(cfg.get("pad_token_id")),
            raw=cfg,
        )
    raise CheckpointError(
        f"architectures={archs} model_type={model_type!r} not supported by the CPU engine; "
        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def load_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Read ``<path>/config.json``."""
    cfg_path = os.path.join(os.fspath(path), "config.json")
    if not os.path.isfile(cfg_path):
        raise CheckpointError(f"no config.json in checkpoint folder {os.fspath(path)!r}")
    with open(cfg_path, encoding="utf-8") as f:
        return parse_config(json.load(f))


def safetensors_files(path: str | os.PathLike[str]) -> list[str]:
    """The weight files of a folder: those named by ``model.safetensors.index.json`` if present, else all ``*.safetensors``."""
    root = os.fspath(path)
    index = os.path.join(root, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    else:
        names = sorted(n for n in os.listdir(root) if n.endswith(".safetensors"))
    if not names:
        raise CheckpointError(f"no *.safetensors files in checkpoint folder {root!r}")
    return [os.path.join(root, n) for n in names]


def _read_bf16_tensor(filename: str, name: str) -> np.ndarray:
    """numpy has no bfloat16, so ``safetensors.numpy`` refuses BF16 tensors: read the raw bytes and widen them."""
    with open(filename, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        info = header[name]
        start, end = info["data_offsets"]
        f.seek(8 + header_len + start)
        raw = np.frombuffer(f.read(end - start), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


def iter_tensors(files: Iterable[str]) -> Iterable[tuple[str, np.ndarray]]:
    """Yield ``(name, fp32 array)`` for every tensor of the given safetensors files."""
    from safetensors import safe_open  # safetensors.numpy backend; no torch

    for filename in files:
        with safe_open(filename, framework="np") as f:
            for name in f.keys():
                try:
                    arr = f.get_tensor(name)
                except TypeError:  # bfloat16
                    arr = _read_bf16_tensor(filename, name)
                # ml_dtypes' bfloat16 (present when jax/tensorflow-style packages are installed) is not a numpy
                # "floating" subtype, but it converts like one.
                if arr.dtype != np.float32 and (np.issubdtype(arr.dtype, np.floating) or arr.dtype.name == "bfloat16"):
                    arr = arr.astype(np.float32)
                yield name, arr
