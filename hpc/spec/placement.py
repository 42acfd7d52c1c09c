"""Where each replica runs inside the job: one `srun --mpi=pmix` step per replica, and the options that place it.

Why one step per replica: TensorRT-LLM's leader mode takes MPI_COMM_WORLD as the model's world, so a replica
must be a world of its own (tp×pp ranks); several replicas in one step would be one world of them all. The CPU
engine runs the same way, so there is one code path (DEVELOPERS.md "Replicas").

Why these options (Slurm 22.05 semantics, checked on the test cluster):
- A replica is packed onto as few nodes as it needs: `--nodes`/`--ntasks` and `--relative` (the first node of
  the step, counted in the allocation), so its tensor-parallel ranks share nodes and replicas do not interleave.
- Ranks are placed in blocks (`--distribution=block`: ranks 0..k-1 on the first node, and so on), as TensorRT-LLM
  assumes: its worker picks `cuda:<global rank % visible GPUs>` and its Mapping puts rank r on node
  r // gpus_per_node (model.yaml's gpus_per_node is the replica's ranks per node: hpc/render/llmapi.py).
- A step that owns whole nodes needs nothing more: it gets every CPU, GPU and the memory of its nodes, and
  no other step uses them.
- Steps that share a node would wait for each other (a step takes every CPU of its nodes by default, srun
  says "Requested nodes are busy"): they get `--exact` (only what they ask for) with the node's CPUs split
  between its ranks (`--cpus-per-task`: the spec's, else the node's CPUs over its tasks, computed by the
  `.sub`), `--mem=0` (the job's memory, without taking it from the other steps) and `--gres=gpu:<ranks>`
  (CUDA_VISIBLE_DEVICES then differs per step).
"""

from __future__ import annotations

from dataclasses import dataclass

#: `--cpus-per-task` of steps sharing a node without `slurm.cpus_per_task`: the `.sub` computes it at run time
CPUS_PER_TASK_SHELL = "$STEP_CPUS"


@dataclass(frozen=True)
class ReplicaStep:
    """One replica's srun step: `nodes` nodes from node `relative` of the allocation, `ntasks` ranks."""

    replica: int
    nodes: int
    ntasks: int
    relative: int
    shares_node: bool
    first_rank: int  # its rank 0's rank in the job: replica × ranks per replica

    def ranks(self) -> range:
        """Its ranks, numbered in the job (what names their files, records and shared memory)."""
        return range(self.first_rank, self.first_rank + self.ntasks)


class PlacementError(ValueError):
    """The ranks of one replica do not fill whole nodes, nor do whole replicas fill a node."""


def replica_steps(replicas: int, ranks_per_replica: int, nodes: int, tasks_per_node: int) -> list[ReplicaStep]:
    """Each replica's step, in replica order. Raises PlacementError (the message says what to change) when a
    replica would straddle nodes partly: its ranks must fill whole nodes, or whole replicas fill a node."""
    wpr, tpn = ranks_per_replica, tasks_per_node
    if wpr >= tpn:
        if wpr % tpn:
            raise PlacementError(
                f"a replica has {wpr} ranks but a node runs {tpn}: a replica must fill whole nodes, so make "
                f"ntasks_per_node divide tp_size × pp_size ({wpr})"
            )
        per = wpr // tpn
        steps = [ReplicaStep(k, per, wpr, k * per, False, k * wpr) for k in range(replicas)]
    else:
        if tpn % wpr:
            raise PlacementError(
                f"a node runs {tpn} ranks but a replica has {wpr}: replicas must fill a node, so make "
                f"tp_size × pp_size ({wpr}) divide ntasks_per_node"
            )
        per_node = tpn // wpr
        steps = [ReplicaStep(k, 1, wpr, k // per_node, replicas > 1, k * wpr) for k in range(replicas)]
    if steps and steps[-1].relative + steps[-1].nodes > nodes:  # the spec's own fit check says it better
        raise PlacementError(f"{replicas} replicas of {wpr} ranks need more than slurm.nodes {nodes}")
    return steps


def step_options(step: ReplicaStep, cpus_per_task: int | None, gpus: bool) -> list[str]:
    """The srun options that place `step` (the module docstring says why each)."""
    options = [
        f"--nodes={step.nodes}",
        f"--ntasks={step.ntasks}",
        f"--relative={step.relative}",
        "--distribution=block",
    ]
    if step.nodes > 1:
        options.append(f"--ntasks-per-node={step.ntasks // step.nodes}")
    if step.shares_node:
        options += ["--exact", f"--cpus-per-task={cpus_per_task or CPUS_PER_TASK_SHELL}", "--mem=0"]
        if gpus:
            options.append(f"--gres=gpu:{step.ntasks}")
    return options
