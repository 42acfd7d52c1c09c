"""The spec's `slurm.gpu_binding` resolved for one spec (the policy itself: launcher/gpu.py `decide`).

Login side, light to import (`validate` prints the decision): launch.json's `gpu_binding`, the tensorrt_llm
parameters that agree with it (hpc/render.py) and the line `validate` / `render` print all come from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.gpu import Decision, decide

if TYPE_CHECKING:
    from hpc.spec import Spec


def gpu_decision(spec: Spec) -> Decision:
    """Per-rank binding or none for `spec`, and why. A `slurm.gres` naming a GPU counts as GPUs requested."""
    s, m = spec.slurm, spec.model
    gpus = s.gpus_per_node or (1 if s.gres and "gpu" in s.gres else 0)
    return decide(
        s.gpu_binding,
        gpus if m.backend == "tensorrtllm" else 0,
        m.tp_size * m.pp_size,
        spec.tasks_per_node,
        orchestrator=spec.mode == "orchestrator",
    )


def describe(spec: Spec) -> str:
    """The line `validate` and `render` print."""
    decision = gpu_decision(spec)
    return f"  GPU binding: {decision.binding} ({decision.why})"
