"""The weights of a checkpoint folder as a shard reads them: a whole Hugging Face checkpoint's every tensor, or a
sharded checkpoint (one `rank<r>.safetensors` per tensor-parallel rank, written by backend/cpu_engine/shards.py)
as a `ShardedWeights` that reads a rank's file only when the rank asks (backend/cpu_engine/weights.py).

Why apart from shards.py: cutting a checkpoint needs the model (`TransformerShard` keeps each rank's part), and
the model reads sharded folders; this, the reading side, sits below both, over checkpoint.py.
"""

from __future__ import annotations

import json
import os

import numpy as np

from .checkpoint import CheckpointError, iter_tensors, safetensors_files

MAPPING_KEY = "mapping"
FORMAT_KEY = "hpc_serve_shards"


def rank_file(folder: str | os.PathLike[str], rank: int) -> str:
    return os.path.join(os.fspath(folder), f"rank{rank}.safetensors")


def sharded_mapping(folder: str | os.PathLike[str]) -> dict[str, int] | None:
    """The folder's `mapping` when it is a sharded checkpoint of ours (config + rank0 file), else None."""
    try:
        with open(os.path.join(os.fspath(folder), "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    mapping = config.get(MAPPING_KEY) if isinstance(config, dict) else None
    if not isinstance(mapping, dict) or FORMAT_KEY not in config or not os.path.isfile(rank_file(folder, 0)):
        return None
    return {k: int(v) for k, v in mapping.items() if isinstance(v, int)}


class ShardedWeights(dict):
    """A sharded checkpoint, not yet read: `TransformerShard` asks for its own rank's tensors (`for_rank`)."""

    def __init__(self, folder: str | os.PathLike[str], mapping: dict[str, int]) -> None:
        super().__init__()
        self.folder = os.fspath(folder)
        self.tp_size = int(mapping.get("tp_size", 1))

    def for_rank(self, tp_size: int, rank: int) -> dict[str, np.ndarray]:
        if tp_size != self.tp_size:
            raise CheckpointError(
                f"{self.folder} is sharded for tp_size {self.tp_size}, but the model runs with tp_size {tp_size}; "
                "build it again for this tp_size (hpc-serve build) or serve the whole checkpoint"
            )
        path = rank_file(self.folder, rank)
        if not os.path.isfile(path):
            raise CheckpointError(f"sharded checkpoint {self.folder} has no {os.path.basename(path)}")
        return dict(iter_tensors([path]))


def load_weights(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint folder as fp32 numpy arrays, keyed by HF name; for a sharded folder (one file
    per tensor-parallel rank, backend/cpu_engine/shards.py) a `ShardedWeights` that reads only the rank's file
    when the shard asks for it."""
    mapping = sharded_mapping(path)
    if mapping is not None:
        return ShardedWeights(path, mapping)
    return dict(iter_tensors(safetensors_files(path)))
