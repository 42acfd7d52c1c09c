"""The simulated engine's test spec (tests/test_sim_e2e.py, tests/test_sim_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import yaml


def sim_spec(folder: Path, name: str, *, tp: int = 1, nodes: int = 1, extra_slurm: dict | None = None) -> Path:
    """A spec of configs/sim-h200.yaml's kind, small: batch 8, its checkpoint made by `submit` (model.init)."""
    spec = {
        "name": name,
        "workdir": str(folder / "runs"),
        "slurm": {
            "nodes": nodes,
            "ntasks_per_node": max(1, tp // nodes),
            "time": "00:10:00",
            "env": {"OMPI_MCA_btl": "self,tcp"},
            **(extra_slurm or {}),
        },
        "model": {
            "backend": "sim",
            "checkpoint_dir": str(folder / "sim-llama"),
            "init": {"model": "llama-3.1-8b"},
            "sim": {"gpu": "h200"},
            "tp_size": tp,
        },
        "triton": {"ready_timeout_s": 120},
        "llm_api": {"max_batch_size": 8, "kv_cache_config": {"enable_block_reuse": True, "event_buffer_max_size": 64}},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path
