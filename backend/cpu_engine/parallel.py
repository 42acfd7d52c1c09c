"""Tensor-parallel plumbing: a tiny communicator interface with a no-MPI implementation for tp_size == 1.

Why an interface: the engine must run on a laptop or in CI with no MPI at all, so ``mpi4py`` is imported only
when a world of more than one rank is actually requested.  The leader/follower protocol (rank 0 drives, others
mirror each step) mirrors TensorRT-LLM's leader mode.
"""
from __future__ import annotations

import os
import pickle
import time
from typing import Any, Protocol

import numpy as np


class Communicator(Protocol):
    """What the model and engine need from MPI."""

    rank: int
    size: int

    def allreduce_sum(self, buf: np.ndarray) -> np.ndarray: ...

    def bcast_obj(self, obj: Any) -> Any: ...


class SingleComm:
    """A world of one: every collective is the identity.  Used whenever tp_size == 1."""

    rank = 0
    size = 1

    def allreduce_sum(self, buf: np.ndarray) -> np.ndarray:
        return buf

    def bcast_obj(self, obj: Any) -> Any:
        return obj


class LeaderDied(RuntimeError):
    """A follower saw no message from the leader for longer than its timeout."""


class MpiComm:
    """mpi4py-backed communicator.

    ``bcast_obj`` sends a fixed-size header (payload length) then the pickled payload, so followers can poll the
    header with a non-blocking ``Ibcast`` and notice a dead leader (no heartbeat within ``leader_timeout_s``)
    instead of blocking forever.
    """

    def __init__(self, comm: Any = None, leader_timeout_s: float = 120.0) -> None:
        from mpi4py import MPI  # lazy: only when tp_size > 1

        self._MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.leader_timeout_s = leader_timeout_s
        self.heard_from_leader = False

    def allreduce_sum(self, buf: np.ndarray) -> np.ndarray:
        buf = np.ascontiguousarray(buf, dtype=np.float32)
        self.comm.Allreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM)
        return buf

    def bcast_obj(self, obj: Any) -> Any:
        header = np.zeros(1, dtype=np.int64)
        if self.rank == 0:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            header[0] = len(payload)
            # non-blocking on both sides: MPI never matches a blocking with a non-blocking collective
            self.comm.Ibcast(header, root=0).Wait()
            buf = np.frombuffer(payload, dtype=np.uint8).copy()
            self.comm.Bcast(buf, root=0)
            return obj
        req = self.comm.Ibcast(header, root=0)
        start = time.monotonic()
        spins = 0
        while not req.Test():
            spins += 1
            if spins > 20000:  # stop burning the core when idle
                time.sleep(0.001)
                # Only a leader that has spoken can fall silent: before its first message it may still be
                # loading a large checkpoint (minutes), and its death then is srun's --kill-on-bad-exit's job.
                if self.heard_from_leader and time.monotonic() - start > self.leader_timeout_s:
                    raise LeaderDied(f"no message from the leader for {self.leader_timeout_s:.0f}s")
        self.heard_from_leader = True
        buf = np.empty(int(header[0]), dtype=np.uint8)
        self.comm.Bcast(buf, root=0)
        return pickle.loads(buf.tobytes())


def replica_comm(world: int, per_replica: int) -> Communicator:
    """This rank's replica's communicator: COMM_WORLD when the world is one replica, else COMM_WORLD split by
    replica (rank // per_replica), so several data-parallel copies share one srun step without sharing
    collectives."""
    if per_replica == 1:
        return SingleComm()
    if world == per_replica:
        return MpiComm()
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    return MpiComm(MPI.COMM_WORLD.Split(color=rank // per_replica, key=rank))


def world_size_from_env(environ: dict[str, str] | None = None) -> int:
    """MPI world size as announced by the launcher (Open MPI, PMIx, Slurm), without importing mpi4py.

    Why: importing mpi4py initialises MPI, which under a bare ``python`` (no mpirun/srun) can be slow or fail; we
    only want that cost when there really are several ranks.
    """
    env = os.environ if environ is None else environ
    for key in ("OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"):
        value = env.get(key)
        if value and value.strip().isdigit():
            return int(value)
    return 1


def world_comm(tp_size: int, leader_timeout_s: float = 120.0) -> Communicator:
    """The communicator for ``tp_size`` ranks: :class:`SingleComm` for 1, else MPI COMM_WORLD (sizes must match)."""
    if tp_size <= 1:
        return SingleComm()
    comm = MpiComm(leader_timeout_s=leader_timeout_s)
    if comm.size != tp_size:
        raise ValueError(f"MPI world size {comm.size} != tp_size {tp_size}; leader mode needs world size == tp_size")
    return comm
