"""What the leader- and worker-node stand-ins share: TensorRT-LLM's device choice, the memory they hold, their report.

The device choice is TensorRT-LLM's PyTorch worker's (`BaseWorker._get_comm_ranks_device_id`,
NVIDIA/TensorRT-LLM@000bd1a6 tensorrt_llm/executor/base_worker.py): ``device_id = global_rank %
torch.cuda.device_count(); torch.cuda.set_device(device_id)``, with ``global_rank`` = MPI COMM_WORLD's rank; not the
local rank, and blind to ``CUDA_VISIBLE_DEVICES``. Its ``Mapping`` (tensorrt_llm/mapping.py) also takes
``local_rank = rank % gpus_per_node`` as a CUDA ordinal in some paths (the MNNVL all-reduce workspace, MoE):
``mapping_probe`` opens that ordinal too (docs/decisions.md "One GPU per rank").

Read by the stand-in nodes, the stand-in model (scripts/gpu/llmapi_standin/model/) and the proof script, so the
report's names are written once. Standard library at import; torch only inside ``open_gpu``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

#: the folder the stand-ins write their reports to (set by the proof script on both ranks)
REPORT_DIR_VAR = "LLMAPI_PROOF_REPORTS"
#: what model.yaml's ``gpus_per_node`` tells TensorRT-LLM's Mapping (the proof script writes both from one value)
GPUS_PER_NODE_VAR = "LLMAPI_PROOF_GPUS_PER_NODE"
#: memory each node holds on its device while it runs, as a TensorRT-LLM worker holds weights and KV cache
HELD_MIB = 256
#: where the MPI world rank comes from. TensorRT-LLM asks mpi4py (COMM_WORLD.Get_rank()); under
#: `srun --mpi=pmix` that is SLURM_PROCID. The device machine has no MPI job (no srun, no mpirun, and mpi4py would
#: make each process a singleton of rank 0), so the stand-in reads the starter's variable, in the order
#: trtllm-llmapi-launch reads them (`mpi_rank=${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-...}}}`).
RANK_VARS = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LEADER, WORKER, MODEL = "leader-node", "worker-node", "model"


def global_rank() -> tuple[int, str]:
    """The process's global rank and the variable it came from (see RANK_VARS)."""
    for name in RANK_VARS:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value), name
    raise RuntimeError(f"none of {', '.join(RANK_VARS)} is set: started outside srun/mpirun")


def report_dir() -> Path:
    value = os.environ.get(REPORT_DIR_VAR)
    if not value:
        raise RuntimeError(f"{REPORT_DIR_VAR} is not set: the proof script names the folder for the reports")
    return Path(value)


def report_path(role: str, rank: int | None = None) -> Path:
    """``<dir>/leader-node-rank0.json``, ``<dir>/worker-node-rank1.json``, ``<dir>/model.json``."""
    return report_dir() / (f"{role}-rank{rank}.json" if rank is not None else f"{role}.json")


def leader_done_path() -> Path:
    """Touched by the leader node when it ends: the worker nodes end then (a stand-in for the MPI session's end)."""
    return report_dir() / f"{LEADER}.done"


def write_report(path: Path, data: dict[str, Any]) -> None:
    """Write a report whole (a reader polls for it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def read_report(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _uuid(props: Any) -> str:
    text = str(getattr(props, "uuid", ""))
    return text if text.startswith("GPU-") else "GPU-" + text


def _pci(props: Any) -> str:
    try:
        return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except AttributeError as exc:
        return repr(exc)


def mapping_probe(torch: Any, rank: int) -> dict[str, Any]:
    """Open ``torch.device("cuda", rank % gpus_per_node)`` as TensorRT-LLM's Mapping users do; what happened."""
    gpus_per_node = int(os.environ.get(GPUS_PER_NODE_VAR) or torch.cuda.device_count())
    local_rank = rank % gpus_per_node
    probe: dict[str, Any] = {"gpus_per_node": gpus_per_node, "local_rank": local_rank}
    try:
        torch.ones(1, device=torch.device("cuda", local_rank)).sum().item()
        probe["opened"] = f"cuda:{local_rank}"
    except Exception as exc:  # the point of the probe: report it
        probe["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return probe


def open_gpu(role: str) -> tuple[dict[str, Any], Any]:
    """Choose the device as TensorRT-LLM's worker does, hold HELD_MIB there; (report, the held tensor).
    A failure (no GPU, no torch) is in the report's ``error``: the proof says why instead of hanging."""
    rank, source = global_rank()
    info: dict[str, Any] = {
        "role": role,
        "pid": os.getpid(),
        "global_rank": rank,
        "rank_from": source,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER"),
    }
    block = None
    try:
        import torch

        count = torch.cuda.device_count()
        info["device_count"] = count
        device_id = rank % count  # BaseWorker._get_comm_ranks_device_id
        torch.cuda.set_device(device_id)
        block = torch.ones(HELD_MIB << 20, dtype=torch.uint8, device=torch.device("cuda", device_id))
        torch.cuda.synchronize()
        props = torch.cuda.get_device_properties(device_id)
        info.update(
            device_index=device_id,
            uuid=_uuid(props),
            pci_bus_id=_pci(props),
            name=props.name,
            held_MiB=block.numel() >> 20,
            mapping=mapping_probe(torch, rank),
        )
    except Exception as exc:  # reported, see the docstring
        info["error"] = f"{type(exc).__name__}: {exc}"
    info["reported_at"] = time.time()
    return info, block
