"""What a rank hands its tritonserver: the environment it starts with (placement, BLAS threads, GPUs, the source
root for the python backend stubs) and the side files its model and launcher share. In a module of its own
because benchmarks/bench_startup.py starts a bare tritonserver with the very same environment, and tests read it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from launcher.contracts import config
from launcher.contracts.gpu import node_gpu_count, rank_gpus
from launcher.contracts.layout import Deployment, JobPaths, with_source_root
from launcher.contracts.llmapi import STANDIN_ROOT
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.rank import RankInfo, Role, placement_env
from launcher.node.server import ServerBinary, merge_env


def job_paths(plan: LaunchPlan, info: RankInfo) -> JobPaths:
    """This job's folder under the deployment folder actually given (it may be mounted elsewhere)."""
    return JobPaths(plan.deployment_dir, info.job_id)


def release_path(plan: LaunchPlan, info: RankInfo) -> Path:
    """File a follower's model touches when its leader told it to stop: its exit is then a clean one."""
    return job_paths(plan, info).released(info.job_rank)


def stop_path(plan: LaunchPlan, info: RankInfo) -> Path:
    """File a leader's launcher writes on its first stop signal, for the model (``HPC_SERVE_STOP_FILE``): when
    the stop began and until when in-flight requests may drain (``drain_until``, epoch seconds; tritonserver
    gives up then), so the engine can finish or fail its work in time for its finalize to release the
    followers."""
    return job_paths(plan, info).stopping(info.job_rank)


def threads_per_rank(env: dict[str, str]) -> str:
    """CPU threads for BLAS in one rank: Slurm's cpus-per-task, else the job's cores on this node (Slurm's
    SLURM_CPUS_ON_NODE, else the node's) shared by this node's ranks, so TP ranks on one node do not
    oversubscribe the CPU; never more than the cores this rank may run on (a cgroup, `taskset` or Slurm's
    binding: the node's core count would start a thread per core of the node)."""
    if env.get("SLURM_CPUS_PER_TASK", "").isdigit():
        wanted = int(env["SLURM_CPUS_PER_TASK"])
    else:
        on_node = env.get("SLURM_CPUS_ON_NODE", "")
        cores = int(on_node) if on_node.isdigit() else (os.cpu_count() or 1)
        wanted = cores // ranks_on_this_node(env)
    return str(max(1, min(wanted, usable_cores())))


def ranks_on_this_node(env: dict[str, str]) -> int:
    """This node's ranks: Slurm's tasks per node of the step (else of the job) at this node's index in it
    (SLURM_NODEID), its "2(x3),1" form expanded; else Open MPI's local size; else 1."""
    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    counts: list[int] = []
    for group in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", group)
        if match is None:
            counts = []
            break
        counts += [int(match[1])] * int(match[2] or 1)
    if counts:
        node = env.get("SLURM_NODEID", "")
        return max(1, counts[int(node)] if node.isdigit() and int(node) < len(counts) else counts[0])
    local = env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "")
    return max(1, int(local)) if local.isdigit() else 1


def usable_cores() -> int:
    """The cores this process may run on (its affinity), where the platform tells; else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS: no affinity API
        return os.cpu_count() or 1


def child_env(
    plan: LaunchPlan,
    server: ServerBinary,
    base: dict[str, str] | None = None,
    info: RankInfo | None = None,
    me: Role | None = None,
) -> dict[str, str]:
    """Environment of tritonserver: ours, + launch.json ``env`` (its defaults, e.g. PMIX_MCA_gds=hash
    (tensorrtllm_backend#553), for a plan that lacks them: config.default_env), + the server's library path, + the
    hpc-serve source root first on PYTHONPATH (for the python backend stubs; with the llmapi workflow on backend cpu,
    the stand-in of TensorRT-LLM before it), + what the CPU engine needs to know of its place
    (launcher/contracts/rank.py placement_env): the world size and its replica (one MPI communicator per replica), and
    the leader's stop file or the follower's release file."""
    env = merge_env(dict(os.environ if base is None else base), plan.env)
    for key, value in config.default_env(plan.mode).items():
        env.setdefault(key, value)
    env = merge_env(env, server.env)
    root = Deployment(Path(plan.deployment_dir)).runtime_root
    env["PYTHONPATH"] = with_source_root(env.get("PYTHONPATH"), root)
    if plan.imports_standin:
        env["PYTHONPATH"] = with_source_root(env["PYTHONPATH"], root / STANDIN_ROOT)
    if info is not None and me is not None:
        per_replica = plan.world_size_per_replica
        env.update(placement_env(info, me, per_replica, str(stop_path(plan, info)), str(release_path(plan, info))))
        threads = threads_per_rank(env)
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, threads)
        env = rank_gpus(env, plan.gpu_binding, info.local_rank, node_gpu_count()).apply(env)  # checked in main()
    return env
