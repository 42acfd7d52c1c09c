"""Sharded checkpoints for the CPU engine: one `rank<r>.safetensors` per tensor-parallel rank, as TensorRT-LLM's
`convert_checkpoint.py --tp_size N` writes them, so each rank of a served model reads only its own part.

Layout of a sharded folder (the build step writes it: ``python -m backend.cpu_engine.shards SRC OUT --tp N``):

    config.json            the source's Hugging Face config plus `mapping` {world_size, tp_size, pp_size}
                           (convert_checkpoint's name for it) and `hpc_serve_shards` {format}
    rank0.safetensors …    rank r's matrices, already split, fused (q|k|v, gate|up) and [out, in]: exactly what
                           that rank computes with (backend/cpu_engine/weights.py decides the split, once)
    tokenizer files        copied from the source, so the folder serves on its own

`load_weights` (backend/cpu_engine/tensors.py) returns a `ShardedWeights` for such a folder: nothing is read
until the shard asks for its rank's file with `for_rank`, which also refuses a tp_size the folder was not cut
for (with both numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from launcher.contracts.build_records import SHARD_FORMAT

from .checkpoint import CheckpointError, load_config
from .model import TransformerShard
from .tensors import FORMAT_KEY, MAPPING_KEY, ShardedWeights, load_weights, rank_file

#: what the source folder holds that is not the model's weights or config: copied along (tokenizer and friends)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5")


def write_sharded(source: str | os.PathLike[str], out: str | os.PathLike[str], tp_size: int) -> list[str]:
    """Cut the checkpoint in `source` into `tp_size` rank files in `out` (a new folder); the files written.

    Each rank's part is what `TransformerShard` keeps of the whole checkpoint for that rank, so a sharded folder
    serves token for token what the whole one does."""
    from safetensors.numpy import save_file

    config = load_config(source)
    weights = load_weights(source)
    if isinstance(weights, ShardedWeights):
        raise CheckpointError(f"{os.fspath(source)} is sharded already; shard the whole checkpoint")
    target = Path(out)
    target.mkdir(parents=True, exist_ok=False)
    written = []
    for rank in range(tp_size):
        shard = TransformerShard(config, weights, comm=_Place(tp_size, rank), max_slots=1, max_seq_len=64)
        tensors = {name: np.ascontiguousarray(t, dtype=np.float32) for name, t in shard.rank_tensors().items()}
        save_file(tensors, rank_file(target, rank), metadata={"rank": str(rank), "tp_size": str(tp_size)})
        written.append(rank_file(target, rank))
    raw: dict[str, Any] = dict(config.raw)
    raw[MAPPING_KEY] = {"world_size": tp_size, "tp_size": tp_size, "pp_size": 1}
    raw[FORMAT_KEY] = {"format": SHARD_FORMAT}
    (target / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for entry in sorted(Path(source).iterdir()):
        skip = (
            entry.name == "config.json" or entry.name.endswith(_WEIGHT_SUFFIXES) or entry.name.endswith(".index.json")
        )
        if entry.is_file() and not skip and not entry.name.startswith("."):
            shutil.copy2(entry, target / entry.name)
    return written


class _Place:
    """A rank's place without any communication: enough for `TransformerShard` to cut its part."""

    def __init__(self, size: int, rank: int) -> None:
        self.size, self.rank = size, rank

    def allreduce_sum(self, buf: np.ndarray) -> np.ndarray:  # pragma: no cover - never computes
        raise RuntimeError("a shard cut for writing does not compute")

    def bcast_obj(self, obj: Any) -> Any:  # pragma: no cover
        raise RuntimeError("a shard cut for writing does not compute")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backend.cpu_engine.shards", description=__doc__.split("\n")[0])
    parser.add_argument("source", help="a whole Hugging Face checkpoint folder")
    parser.add_argument("out", help="the sharded folder to write (must not exist)")
    parser.add_argument("--tp", type=int, required=True, help="tensor-parallel ranks")
    args = parser.parse_args(argv)
    try:
        files = write_sharded(args.source, args.out, args.tp)
    except (CheckpointError, FileExistsError) as exc:
        print(f"shards: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(files)} rank file(s) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
