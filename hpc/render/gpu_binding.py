"""The spec's `slurm.gpu_binding` decided for one spec: per-rank binding or none, why, and the `tensorrt_llm`
parameters that agree with it. What a rank then does with the decision is launcher/contracts/gpu.py's (`rank_gpus`).

Why here, once: launch.json's `gpu_binding`, the tensorrt_llm config parameters (hpc/render/jobfiles.py) and the line
`validate` / `render` print must never disagree, so all three read one `Decision`; render only writes it down.
Login side and light to import (`validate` prints the decision).

When binding is on, TensorRT-LLM must agree: by default it picks device ``rank % gpus_per_node`` (with
``gpus_per_node`` clamped to the visible count) and the backend always passes ``num_nodes`` (default 1), so the
rendered ``tensorrt_llm`` config gets ``gpu_device_ids "0"`` and ``num_nodes = tp × pp`` (``bound_parameters``).
Why ``auto`` keeps a node's GPUs visible when ranks of one replica share it (TensorRT-LLM's all-reduce plugin and
NCCL take node-local ranks as CUDA ordinals), and the upstream sources at their commits: docs/decisions.md "One GPU
per rank".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.contracts.gpu import NONE, PER_RANK, POLICIES

if TYPE_CHECKING:
    from hpc.spec import Spec


@dataclass(frozen=True)
class Decision:
    """The resolution of ``slurm.gpu_binding`` for one spec: ``binding`` (launch.json's), why, and the
    ``tensorrt_llm`` config parameters that make TensorRT-LLM's device choice agree (none without binding)."""

    binding: str  # PER_RANK | NONE
    why: str
    parameters: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        """The line `validate` and `render` print."""
        return f"  GPU binding: {self.binding} ({self.why})"


def decide(
    policy: str,
    gpus_per_node: int,
    ranks_per_replica: int,
    tasks_per_node: int,
    orchestrator: bool = False,
    llmapi: bool = False,
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
    if llmapi:  # per-rank is refused by the spec on this workflow (hpc/spec/schema.py)
        return Decision(
            NONE,
            "llmapi workflow: TensorRT-LLM's PyTorch workers pick cuda:<rank % device count> among the node's GPUs "
            "(measured on 2 GPUs: scripts/gpu/results/), so every rank sees every GPU of its node",
        )
    bound = bound_parameters(ranks_per_replica)
    if policy == PER_RANK:
        risk = (
            "; WARNING: ranks of one replica share a node, so TensorRT-LLM's custom all-reduce plugin aborts "
            "(cudaDeviceCanAccessPeer on an invalid ordinal) unless the engine uses NCCL all-reduce, and NCCL "
            "loses P2P between them"
            if peers_share
            else ""
        )
        return Decision(PER_RANK, "slurm.gpu_binding: per-rank: CUDA_VISIBLE_DEVICES=<the rank's GPU>" + risk, bound)
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
        bound,
    )


def bound_parameters(ranks_per_replica: int) -> dict[str, str]:
    """The ``tensorrt_llm`` config.pbtxt parameters that make TensorRT-LLM's device choice agree with a per-rank
    binding: each rank's only device is ordinal 0, and the world is ``tp × pp`` single-GPU "nodes"."""
    return {"gpu_device_ids": "0", "num_nodes": str(ranks_per_replica)}


def gpu_decision(spec: Spec) -> Decision:
    """Per-rank binding or none for `spec`, and why. A `slurm.gres` naming a GPU counts as GPUs requested."""
    s, m = spec.slurm, spec.model
    gpus = s.gpus_per_node or (1 if s.gres and "gpu" in s.gres else 0)
    return decide(
        s.gpu_binding,
        gpus if m.backend_strategy.uses_gpus else 0,
        m.tp_size * m.pp_size,
        spec.tasks_per_node,
        orchestrator=spec.mode == "orchestrator",
        llmapi=not m.workflow_strategy.per_rank_binding,
    )


def describe(spec: Spec) -> str:
    """The line `validate` prints (`render` prints its plan's: `Decision.line`)."""
    return gpu_decision(spec).line()
