"""Who am I? Rank, world size, node and job id of this launcher process.

The launcher runs once per task of ``srun --mpi=pmix`` (or ``mpirun``, or by hand), so everything it needs to know
about its place in the job comes from the environment the starter exported.  Kept free of I/O so that the parsing
is unit-testable with a plain dict.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

#: The launcher hands the job id to every process of a local job (the local executor's mpirun sets it).
JOB_ID_ENV = "HPC_SERVE_JOB_ID"
#: Set by the `.sub` on each replica's own `srun` step (one MPI world per replica, hpc/spec/placement.py): the replica
#: the step serves. Without it, the starter's world holds every replica (`mpirun -n`, an interactive `srun`).
STEP_REPLICA_ENV = "HPC_SERVE_STEP_REPLICA"
#: replica_policy restart: how many times the `.sub` restarted the step's replica before this run (its endpoint
#: record says so: records.EndpointRecord.restarts)
REPLICA_RESTARTS_ENV = "HPC_SERVE_REPLICA_RESTARTS"
#: What the launcher decided about a rank's place, handed to tritonserver (and so to the models) through the
#: environment: the models never parse the process starter's variables themselves (DEVELOPERS.md "Shared contracts").
WORLD_SIZE_ENV = "HPC_SERVE_WORLD_SIZE"
REPLICA_ENV = "HPC_SERVE_REPLICA"
RANKS_PER_REPLICA_ENV = "HPC_SERVE_RANKS_PER_REPLICA"
#: a leader's: written by its launcher on the first stop signal; a follower's: touched by its model when released
STOP_FILE_ENV = "HPC_SERVE_STOP_FILE"
RELEASE_FILE_ENV = "HPC_SERVE_RELEASE_FILE"


class WorldSizeError(ValueError):
    """The number of started processes does not match tp_size × pp_size × replicas."""


@dataclass(frozen=True)
class RankInfo:
    """Identity of this process inside the job (as reported by the process starter)."""

    rank: int
    local_rank: int
    world_size: int
    node: str
    job_id: str
    source: str  # "slurm" | "openmpi" | "pmi" | "single": which starter's variables were used
    #: the replica of a one-replica step (``STEP_REPLICA_ENV``); None: the world holds every replica
    step_replica: int | None = None

    @property
    def job_rank(self) -> int:
        """The rank in the whole job, which names the rank's files, records and shared memory: in a one-replica
        step, replica × the step's size + the step's rank; else the world's rank."""
        return self.rank if self.step_replica is None else self.step_replica * self.world_size + self.rank


@dataclass(frozen=True)
class Role:
    """What this rank does: which replica it belongs to and whether it is that replica's serving leader."""

    replica: int
    rank_in_replica: int
    leader: bool


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def template_values() -> dict[str, str]:
    """The variables the `.sub` templates set or read (hpc/render/jobfiles.py and hpc/jobs/build_script.py pass them
    beside layout.template_values), so no template re-types one: a replica step's, and the job id the local
    executor hands a script that runs without Slurm."""
    return {
        "step_replica_env": STEP_REPLICA_ENV,
        "job_id_env": JOB_ID_ENV,
        "replica_restarts_env": REPLICA_RESTARTS_ENV,
    }


def replica_restarts(env: Mapping[str, str] | None = None) -> int:
    """``REPLICA_RESTARTS_ENV``: 0 outside a restarted replica's step (or when it is not a count)."""
    value = (os.environ if env is None else env).get(REPLICA_RESTARTS_ENV, "0")
    return int(value) if value.isdigit() else 0


def given_job_id(env: Mapping[str, str] | None = None) -> str | None:
    """The job id this process was started under: ``$SLURM_JOB_ID`` under Slurm, ``$HPC_SERVE_JOB_ID`` under the
    local executor; None under neither."""
    env = os.environ if env is None else env
    return env.get("SLURM_JOB_ID") or env.get(JOB_ID_ENV) or None


def job_id_from_env(env: Mapping[str, str] | None = None) -> str:
    """``given_job_id``; under a bare ``mpirun`` ``local-`` and the MPI job's namespace (the same on every rank,
    so all ranks agree on one folder); else ``local-<pid>`` (a single process)."""
    env = os.environ if env is None else env
    explicit = given_job_id(env)
    if explicit:
        return explicit
    namespace = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid")
    if namespace:
        return "local-" + re.sub(r"[^A-Za-z0-9]+", "-", namespace).strip("-")
    return f"local-{os.getpid()}"


def step_name(env: Mapping[str, str] | None = None) -> str:
    """``<job>.<step>`` under srun (every step of an allocation gets its own), else the job id."""
    env = os.environ if env is None else env
    job = job_id_from_env(env)
    return f"{job}.{env.get('SLURM_STEP_ID', '0')}" if env.get("SLURM_JOB_ID") else job


def detect(env: Mapping[str, str] | None = None) -> RankInfo:
    """Read rank/local rank/world size from whichever process starter launched us.

    Order matters:
    * ``OMPI_COMM_WORLD_*`` first: they exist only when Open MPI's ``mpirun`` started this very process, and then
      they are authoritative; an ``mpirun`` inside an sbatch allocation leaves stale ``SLURM_PROCID`` values
      (those of the batch step or of the orted daemon) in the environment.
    * ``SLURM_PROCID`` + ``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS`` (``srun``; ``srun --mpi=pmix`` does not export
      ``OMPI_COMM_WORLD_*``).  ``SLURM_STEP_NUM_TASKS`` is preferred because it is only set inside a step: a
      launcher started directly from the batch script sees ``SLURM_NTASKS`` of the whole allocation.
    * ``PMI_RANK``/``PMI_SIZE`` (MPICH/Hydra).  ``PMIX_RANK`` alone is not used: PMIx exports no size variable.
    * otherwise a single process (rank 0 of 1).
    """
    env = os.environ if env is None else env
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    job_id = job_id_from_env(env)
    step = _int(env, STEP_REPLICA_ENV)

    rank = _int(env, "OMPI_COMM_WORLD_RANK")
    size = _int(env, "OMPI_COMM_WORLD_SIZE")
    if rank is not None and size is not None:
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK")
        return RankInfo(rank, local if local is not None else 0, size, node, job_id, "openmpi", step)

    rank = _int(env, "SLURM_PROCID")
    size = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    if rank is not None and size is not None:
        local = _int(env, "SLURM_LOCALID")
        return RankInfo(rank, local if local is not None else 0, size, node, job_id, "slurm", step)

    rank = _int(env, "PMI_RANK")
    size = _int(env, "PMI_SIZE")
    if rank is not None and size is not None:
        local = _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK")
        return RankInfo(rank, local if local is not None else 0, size, node, job_id, "pmi", step)

    return RankInfo(0, 0, 1, node, job_id, "single", step)


_STARTER = {
    "slurm": "srun started {n} tasks",
    "openmpi": "mpirun started {n} processes",
    "pmi": "the MPI launcher started {n} processes",
    "single": "{n} process was started (no srun/mpirun environment found)",
}


def role(info: RankInfo, tp_size: int, pp_size: int, replicas: int, world_size_per_replica: int | None = None) -> Role:
    """Map the global rank onto (replica, leader) and refuse a world that does not fit the plan.

    In TRT-LLM leader mode a replica is ``tp×pp`` consecutive ranks and only its first rank serves; a wrong world size
    is the root cause of upstream's "port already in use" reports (tensorrtllm_backend#243), so it is rejected up front
    with the numbers and the fix.  ``world_size_per_replica`` overrides ``tp×pp`` (orchestrator mode uses 1).
    """
    wpr = world_size_per_replica if world_size_per_replica is not None else tp_size * pp_size
    if wpr < 1 or replicas < 1:
        raise WorldSizeError(f"invalid plan: world_size_per_replica {wpr}, replicas {replicas}")
    if info.step_replica is not None:  # one replica per step (the .sub): the world is that replica
        return _step_role(info, wpr, replicas)
    expected = wpr * replicas
    if info.world_size != expected:
        if world_size_per_replica is not None and world_size_per_replica != tp_size * pp_size:
            need = f"world_size_per_replica {wpr} × replicas {replicas} = {expected}"
        else:
            need = f"tp_size {tp_size} × pp_size {pp_size} × replicas {replicas} = {expected}"
        started = _STARTER.get(info.source, "{n} processes were started").format(n=info.world_size)
        raise WorldSizeError(f"{started} but the spec needs {need}; ask sbatch/srun for --ntasks={expected}")
    if not 0 <= info.rank < info.world_size:
        raise WorldSizeError(f"rank {info.rank} is outside the world of size {info.world_size}")
    return Role(replica=info.rank // wpr, rank_in_replica=info.rank % wpr, leader=info.rank % wpr == 0)


def _step_role(info: RankInfo, wpr: int, replicas: int) -> Role:
    """The role in a one-replica step: the step is the replica's MPI world, its rank 0 the leader."""
    replica = info.step_replica
    assert replica is not None
    if not 0 <= replica < replicas:
        raise WorldSizeError(
            f"{STEP_REPLICA_ENV}={replica}, but the plan has {replicas} replicas (0 to {replicas - 1})"
        )
    if info.world_size != wpr:
        started = _STARTER.get(info.source, "{n} processes were started").format(n=info.world_size)
        raise WorldSizeError(
            f"{started} for replica {replica} but a replica has {wpr} ranks; ask srun for --ntasks={wpr} per replica"
        )
    if not 0 <= info.rank < wpr:
        raise WorldSizeError(f"rank {info.rank} is outside the world of size {info.world_size}")
    return Role(replica=replica, rank_in_replica=info.rank, leader=info.rank == 0)


@dataclass(frozen=True)
class Placement:
    """A rank's place as the model sees it: the launcher's decision (``placement_env``), read by ``placement``."""

    world_size: int
    replica: int = 0
    ranks_per_replica: int = 1
    stop_file: str | None = None
    release_file: str | None = None


def placement_env(
    info: RankInfo, me: Role, ranks_per_replica: int, stop_file: str, release_file: str
) -> dict[str, str]:
    """The variables the launcher sets for its tritonserver: world size, replica, ranks per replica, and the
    side file of the rank's role: a leader's stop file, or a follower's release file."""
    side = {STOP_FILE_ENV: stop_file} if me.leader else {RELEASE_FILE_ENV: release_file}
    return {
        WORLD_SIZE_ENV: str(info.world_size),
        REPLICA_ENV: str(me.replica),
        RANKS_PER_REPLICA_ENV: str(ranks_per_replica),
        **side,
    }


def placement(env: Mapping[str, str] | None = None) -> Placement:
    """The model's one reader of its place: what the launcher exported; without a launcher (a model run under a
    bare ``mpirun`` in unit tests) the process starter's variables, read the launcher's way (``detect``)."""
    env = os.environ if env is None else env
    world = _int(env, WORLD_SIZE_ENV)
    if world is None:
        world = detect(env).world_size
    per_replica = _int(env, RANKS_PER_REPLICA_ENV)
    return Placement(
        world_size=world,
        replica=_int(env, REPLICA_ENV) or 0,
        ranks_per_replica=per_replica if per_replica is not None else world,
        stop_file=env.get(STOP_FILE_ENV) or None,
        release_file=env.get(RELEASE_FILE_ENV) or None,
    )
