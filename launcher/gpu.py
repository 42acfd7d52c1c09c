"""One GPU per rank: which GPUs each rank's tritonserver sees, and the policy that decides whether to narrow them.

Why: a CUDA process makes a context (~580 MiB measured with tritonserver 2.51, the python stub too) on every GPU
it can see, so with every rank seeing every GPU of its node, 8 ranks cost each GPU ~4 GiB before the engine sizes
its KV cache; ``CUDA_VISIBLE_DEVICES=<the rank's GPU>`` stops it (issue 12, DEVELOPERS.md "One GPU per rank").

Slurm's styles, as the launcher finds them in its environment:

- ``--gpus-per-task`` / ``--gpu-bind``: Slurm already narrowed ``CUDA_VISIBLE_DEVICES`` per task: kept.
- ``--gres=gpu:N`` per node (or per step, hpc/placement.py): every task of the step sees the step's N GPUs: the
  rank takes entry ``SLURM_LOCALID`` of that list (not ordinal ``SLURM_LOCALID``: a step sharing a node with
  another gets e.g. ``2,3``, and entries may be UUIDs).
- none: no GPU in the environment (CPU nodes, the CPU engine): nothing changes.

When binding is on, TensorRT-LLM must agree: by default it picks device ``rank % gpus_per_node`` (with
``gpus_per_node`` clamped to the visible count) and the backend always passes ``num_nodes`` (default 1), so the
rendered ``tensorrt_llm`` config gets ``gpu_device_ids "0"`` and ``num_nodes = tp × pp`` (``bound_parameters``).
Sources (read for issue 12, /work/notes/issue12_device_research.md):

- tensorrtllm_backend@c2e65b88d852 ``inflight_batcher_llm/src/model_state.cc:97-146`` (``gpu_device_ids``: ``,``
  list, ``;`` per instance) and ``model_instance_state.cc:239-284`` (``getParallelConfigFromParams``:
  ``setDeviceIds``, always ``setNumNodes(num_nodes)``); the backend never calls ``cudaSetDevice`` itself.
- TensorRT-LLM ``cpp/tensorrt_llm/runtime/worldConfig.cpp``@65b31db1 (device ids default ``iota(gpusPerNode)``,
  ``mpi()`` clamps ``gpusPerNode`` to ``cudaGetDeviceCount``, ``getDevice() = deviceIds[rank % size]``);
  ``executorImpl.cpp``@b35ac1b6 ``initializeWorkers``: with ``numNodes`` set, ``deviceIds.size() × numNodes``
  must equal ``tp × pp × cp``.
- The caveat that makes ``auto`` keep a node's GPUs visible when peers of a replica share it:
  ``allreducePlugin.cpp``@005b299b ``setGroupTopology`` uses node-local ranks as CUDA ordinals, so with one visible
  GPU ``cudaDeviceCanAccessPeer(0, 1)`` fails with an invalid ordinal and the rank aborts (TensorRT-LLM#1667;
  NVIDIA reverted ``CUDA_VISIBLE_DEVICES=$SLURM_LOCALID`` in its own Slurm scripts, PRs #16892/#16893), and NCCL
  cannot use P2P/IPC between processes that do not see each other's GPU (nccl#129, #324).
  Reordering the list (own GPU first) would not help: TensorRT-LLM and the plugin both take ordinal = local rank.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

POLICIES = ("auto", "per-rank", "none")
#: what a resolved policy (launch.json ``gpu_binding``) holds
PER_RANK, NONE = "per-rank", "none"
VISIBLE = "CUDA_VISIBLE_DEVICES"
#: CUDA's own order is "fastest first"; Slurm and nvidia-smi number GPUs by PCI bus, so ordinals agree only with this
ORDER = "CUDA_DEVICE_ORDER"


class GpuBindingError(ValueError):
    """The rank cannot be given a GPU of its own (more ranks on the node than GPUs in its environment)."""


@dataclass(frozen=True)
class Decision:
    """The render side's resolution of ``slurm.gpu_binding`` for one spec: ``binding`` and why."""

    binding: str  # PER_RANK | NONE
    why: str


def decide(
    policy: str, gpus_per_node: int, ranks_per_replica: int, tasks_per_node: int, orchestrator: bool = False
) -> Decision:
    """Resolve ``auto`` from the layout: bind per rank unless there are no GPUs, or ranks of one replica share a
    node (their all-reduce plugin and NCCL need to see each other's GPUs; the module docstring cites why).
    ``ranks_per_replica`` is tp × pp; ``gpus_per_node`` 0: a CPU job."""
    if policy not in POLICIES:
        raise ValueError(f"slurm.gpu_binding must be one of {', '.join(POLICIES)}, got {policy!r}")
    peers_share = ranks_per_replica > 1 and tasks_per_node > 1
    if policy == NONE:
        return Decision(NONE, "slurm.gpu_binding: none: every rank sees every GPU of its node")
    if gpus_per_node == 0:
        return Decision(NONE, "no GPUs requested (slurm.gpus_per_node 0): nothing to bind")
    if orchestrator:  # one process per replica, whose spawned workers pick their GPUs among the node's
        return Decision(NONE, "orchestrator mode: TensorRT-LLM's spawned workers need every GPU of the node")
    if policy == PER_RANK:
        risk = (
            "; WARNING: ranks of one replica share a node, so TensorRT-LLM's custom all-reduce plugin aborts "
            "(cudaDeviceCanAccessPeer on an invalid ordinal) unless the engine uses NCCL all-reduce, and NCCL "
            "loses P2P between them"
            if peers_share
            else ""
        )
        return Decision(PER_RANK, "slurm.gpu_binding: per-rank: CUDA_VISIBLE_DEVICES=<the rank's GPU>" + risk)
    if peers_share:
        return Decision(
            NONE,
            f"auto: the {ranks_per_replica} ranks of a replica share nodes ({tasks_per_node} per node), and "
            "TensorRT-LLM's all-reduce plugin and NCCL P2P need to see each other's GPUs: every rank sees its "
            "node's GPUs (each loses ~0.6 GiB per other rank on the node to contexts)",
        )
    return Decision(
        PER_RANK,
        "auto: no two ranks of a replica share a node: CUDA_VISIBLE_DEVICES=<the rank's GPU>, "
        'tensorrt_llm gets gpu_device_ids "0" and num_nodes = tp × pp',
    )


def bound_parameters(binding: str, tp_size: int, pp_size: int) -> dict[str, str]:
    """The ``tensorrt_llm`` config.pbtxt parameters that make TensorRT-LLM's device choice agree with a per-rank
    binding: each rank's only device is ordinal 0, and the world is ``tp × pp`` single-GPU "nodes"."""
    if binding != PER_RANK:
        return {}
    return {"gpu_device_ids": "0", "num_nodes": str(tp_size * pp_size)}


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

    ``local_rank`` is the rank on its node within its step (``SLURM_LOCALID``, launcher/rank.py ``detect``);
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
