"""The CPU engine's worker node: an MPI rank > 0 of a replica on the llmapi workflow, outside tritonserver, what the
stand-in's `python -m tensorrt_llm.llmapi.mgmn_worker_node` runs (backend/standin/tensorrt_llm/llmapi/).

It waits (without a bound: the model may load late) for the leader node's `WorkerLoad`, then does its engine's
part (kind.py: the CPU engine loads its shard of the same checkpoint and mirrors every engine step the leader
broadcasts, follower.py) until the leader says stop or falls silent; then it ends MPI (bounded) and exits 0.
Exit 1 when its part cannot be loaded.
"""

from __future__ import annotations

import logging
import sys

from ..checkpoint import CheckpointError
from ..parallel import LeaderDied, MpiComm, finalize_mpi
from .engine_args import WorkerLoad
from .kind import CPU, EngineKind

log = logging.getLogger("hpc_serve.cpu_engine.llmapi")


def main(argv: list[str] | None = None, kind: EngineKind = CPU) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    comm = MpiComm()
    if comm.rank == 0:
        print("worker node started on MPI rank 0: rank 0 runs the leader node", file=sys.stderr)
        return 2
    log.info("worker node rank %d/%d: waiting for the leader node's load", comm.rank, comm.size)
    try:
        message = comm.bcast_obj(None)
    except LeaderDied as e:
        log.error("worker node rank %d: %s", comm.rank, e)
        return 1
    if not isinstance(message, WorkerLoad):  # STOP: the leader stops before any model was loaded
        log.info("worker node rank %d: the leader stopped before loading (%r)", comm.rank, message)
        log.info("worker node rank %d: %s", comm.rank, finalize_mpi())
        return 0
    log.info("worker node rank %d: serving its part of %s (%s engine)", comm.rank, message.model, kind.name)
    try:
        kind.worker(message, comm)
    except (CheckpointError, OSError, ValueError) as e:
        log.error("worker node rank %d: cannot load %s: %s", comm.rank, message.model, e)
        return 1
    log.info("worker node rank %d: released by the leader (%s)", comm.rank, finalize_mpi())
    return 0
