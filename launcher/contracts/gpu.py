"""One GPU per rank: which GPUs each rank's tritonserver sees (what a rank does with launch.json's `gpu_binding`).

Why: a CUDA process makes a context (~580 MiB measured with tritonserver 2.51, the python stub too) on every GPU
it can see, so with every rank seeing every GPU of its node, 8 ranks cost each GPU ~4 GiB before the engine sizes
its KV cache; ``CUDA_VISIBLE_DEVICES=<the rank's GPU>`` stops it (DEVELOPERS.md "One GPU per rank").
Whether a job binds at all, and the ``tensorrt_llm`` parameters that agree with it, is decided on the submit side
once per spec (hpc/render/gpu_binding.py, which also cites why ``auto`` keeps a node's GPUs visible for peers); a rank
reads only the result.

Slurm's styles, as the launcher finds them in its environment:

- ``--gpus-per-task`` / ``--gpu-bind``: Slurm already narrowed ``CUDA_VISIBLE_DEVICES`` per task: kept.
- ``--gres=gpu:N`` per node (or per step, hpc/spec/placement.py): every task of the step sees the step's N GPUs: the
  rank takes entry ``SLURM_LOCALID`` of that list (not ordinal ``SLURM_LOCALID``: a step sharing a node with
  another gets e.g. ``2,3``, and entries may be UUIDs).
- none: no GPU in the environment (CPU nodes, the CPU engine): nothing changes.

TensorRT-LLM ``cpp/tensorrt_llm/runtime/worldConfig.cpp``@65b31db1 clamps ``gpusPerNode`` to
``cudaGetDeviceCount`` and picks ``deviceIds[rank % size]``: with the rank's one GPU visible and told
``gpu_device_ids "0"``, that is its own (sources: docs/decisions.md "One GPU per rank").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

#: what a resolved policy (launch.json ``gpu_binding``) holds
PER_RANK, NONE = "per-rank", "none"
#: the spec's ``slurm.gpu_binding``: ``auto`` is resolved to one of the two above by hpc/render/gpu_binding.py
POLICIES = ("auto", PER_RANK, NONE)
VISIBLE = "CUDA_VISIBLE_DEVICES"
#: CUDA's own order is "fastest first"; Slurm and nvidia-smi number GPUs by PCI bus, so ordinals agree only with this
ORDER = "CUDA_DEVICE_ORDER"


class GpuBindingError(ValueError):
    """The rank cannot be given a GPU of its own (more ranks on the node than GPUs in its environment)."""


def _devices(value: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as a list; None: unset (the process would see every GPU); []: none."""
    if value is None:
        return None
    value = value.strip()
    if value in ("", "NoDevFiles", "-1"):  # "NoDevFiles": Slurm's value for a step without GPUs
        return []
    return [part.strip() for part in value.split(",") if part.strip()]


@dataclass(frozen=True)
class RankGpus:
    """What one rank's tritonserver gets: ``visible`` (None: leave the environment as it is) and why."""

    visible: str | None
    style: str  # "per-task" | "per-node" | "none" | "off"
    why: str

    def apply(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with this rank's ``CUDA_VISIBLE_DEVICES`` (and PCI bus order, so ordinals are Slurm's)."""
        if self.visible is None:
            return env
        out = dict(env)
        out[VISIBLE] = self.visible
        out.setdefault(ORDER, "PCI_BUS_ID")
        return out


def node_gpu_count(root: str = "/proc/driver/nvidia/gpus") -> int:
    """GPUs the NVIDIA driver shows on this node (one folder each), 0 without the driver: what a process with no
    ``CUDA_VISIBLE_DEVICES`` sees (a local ``mpirun``, a step without GPU binding)."""
    try:
        return len(os.listdir(root))
    except OSError:
        return 0


def rank_gpus(env: Mapping[str, str], binding: str, local_rank: int, node_gpus: int = 0) -> RankGpus:
    """This rank's GPU from the starter's environment (the module docstring lists the styles).

    ``local_rank`` is the rank on its node within its step (``SLURM_LOCALID``, launcher/contracts/rank.py ``detect``);
    ``node_gpus`` (``node_gpu_count``) stands for the list when nothing in the environment names one: the rank
    would see every GPU and TensorRT-LLM, told ``gpu_device_ids "0"``, would put every rank on the first."""
    visible = _devices(env.get(VISIBLE))
    if visible is None:  # Slurm sets it for every GPU step; a bare step on a GPU node may not
        visible = _devices(env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"))
    if visible is None and node_gpus:
        visible = [str(i) for i in range(node_gpus)]
    if binding != PER_RANK:
        return RankGpus(None, "off", f"gpu_binding {binding}: {VISIBLE} left as it is")
    if not visible:
        return RankGpus(None, "none", "no GPUs in this rank's environment: nothing to bind")
    if len(visible) == 1:
        return RankGpus(None, "per-task", f"Slurm already gave this task one GPU ({VISIBLE}={visible[0]}): kept")
    if env.get("SLURM_GPUS_PER_TASK"):  # the task owns several GPUs (--gpus-per-task=N>1): its first is its own
        return RankGpus(visible[0], "per-task", f"--gpus-per-task: the first of the task's GPUs {','.join(visible)}")
    if not 0 <= local_rank < len(visible):
        raise GpuBindingError(
            f"rank with node-local rank {local_rank} sees only {len(visible)} GPUs ({VISIBLE}={','.join(visible)}): "
            "ask for at least one GPU per rank on each node (slurm.gpus_per_node ≥ ranks per node), "
            "or set slurm.gpu_binding: none"
        )
    return RankGpus(
        visible[local_rank],
        "per-node",
        f"{VISIBLE}={visible[local_rank]}: entry {local_rank} (node-local rank) of the step's {','.join(visible)}",
    )
