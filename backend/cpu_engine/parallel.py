"""Tensor-parallel plumbing: a tiny communicator interface with a no-MPI implementation for tp_size == 1.

Why an interface: the engine must run on a laptop or in CI with no MPI at all, so ``mpi4py`` is imported only
when a world of more than one rank is actually requested.  The leader/follower protocol (rank 0 drives, others
mirror each step) mirrors TensorRT-LLM's leader mode.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from launcher.contracts.stop_records import StopNotice

SPIN_S = 0.005  # poll back to back this long (a step's message arrives within microseconds)...
NAP_S = 0.001  # ...then sleep this long between polls (an idle follower heartbeats once a second)
#: during a stop, how long the leader's last broadcast and each rank's MPI_Finalize rendezvous may take before
#: the peer counts as gone (both are immediate when it is there)
STOP_TIMEOUT_S = 5.0


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


class PeerGone(RuntimeError):
    """The leader's broadcast was not taken by its followers within ``send_timeout_s``: a follower is gone."""


def wait_request(
    req: Any,
    timeout_s: float | None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    spin_s: float = SPIN_S,
    nap_s: float = NAP_S,
) -> bool:
    """Wait for a non-blocking MPI request; True once it completed, False after ``timeout_s`` (None: never).

    Why not ``req.Wait()``: Open MPI's Wait polls its progress engine at full speed and never returns when the
    peer is gone (a leader broadcasting to a dead follower spun one core for the whole stop grace). Here the
    first ``spin_s`` polls back to back (a step's broadcast arrives within microseconds, keep that latency),
    then every ``nap_s`` with a sleep in between (an idle rank costs nothing), and the wait is bounded.
    """
    start = clock()
    while not req.Test():
        elapsed = clock() - start
        if timeout_s is not None and elapsed >= timeout_s:
            return False
        if elapsed >= spin_s:
            sleep(nap_s)
    return True


class MpiComm:
    """mpi4py-backed communicator.

    ``bcast_obj`` sends a fixed-size header (payload length) then the pickled payload, both as non-blocking
    ``Ibcast`` waited with :func:`wait_request`, so no rank blocks or spins forever on a peer that is gone:
    followers notice a dead leader (no heartbeat within ``leader_timeout_s``), the leader a dead follower (a
    broadcast not taken within ``send_timeout_s``).  After a peer was given up, ``peer_lost`` says why and
    :func:`finalize_mpi` no longer waits for it.
    """

    #: process-wide: set once any communicator gave up on a peer (MPI_Finalize would wait for it forever)
    peer_lost: str | None = None

    def __init__(self, comm: Any = None, leader_timeout_s: float = 120.0, send_timeout_s: float = 30.0) -> None:
        from mpi4py import MPI  # lazy: only when tp_size > 1

        self._MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.leader_timeout_s = leader_timeout_s
        self.send_timeout_s = send_timeout_s
        self.heard_from_leader = False

    def allreduce_sum(self, buf: np.ndarray) -> np.ndarray:
        buf = np.ascontiguousarray(buf, dtype=np.float32)
        self.comm.Allreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM)
        return buf

    def stopping(self) -> None:
        """The leader is stopping: a follower that does not take the stop message at once is gone."""
        self.send_timeout_s = min(self.send_timeout_s, STOP_TIMEOUT_S)

    def _give_up(self, error: type[RuntimeError], message: str) -> RuntimeError:
        MpiComm.peer_lost = message
        return error(message)

    def bcast_obj(self, obj: Any) -> Any:
        # non-blocking on both sides, header and payload: MPI never matches a blocking with a non-blocking
        # collective, and only a non-blocking one can be waited for with a bound
        header = np.zeros(1, dtype=np.int64)
        if self.rank == 0:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            header[0] = len(payload)
            buf = np.frombuffer(payload, dtype=np.uint8).copy()
            for part in (header, buf):
                if not wait_request(self.comm.Ibcast(part, root=0), self.send_timeout_s):
                    raise self._give_up(
                        PeerGone, f"a follower did not take the leader's message within {self.send_timeout_s:g}s"
                    )
            return obj
        # Only a leader that has spoken can fall silent: before its first message it may still be loading a
        # large checkpoint (minutes), and its death then is srun's --kill-on-bad-exit's job.
        timeout = self.leader_timeout_s if self.heard_from_leader else None
        if not wait_request(self.comm.Ibcast(header, root=0), timeout):
            raise self._give_up(LeaderDied, f"no message from the leader for {self.leader_timeout_s:.0f}s")
        self.heard_from_leader = True
        buf = np.empty(int(header[0]), dtype=np.uint8)
        if not wait_request(self.comm.Ibcast(buf, root=0), self.leader_timeout_s):
            raise self._give_up(LeaderDied, f"the leader's message stopped half-way ({self.leader_timeout_s:.0f}s)")
        return pickle.loads(buf.tobytes())


def finalize_mpi(timeout_s: float = STOP_TIMEOUT_S) -> str:
    """End MPI without ever waiting on a peer that is gone; returns what happened (for the log).

    Why: under `srun --mpi=pmix` a rank that exits without MPI_Finalize counts as aborted and Slurm kills the
    whole step, so a clean stop must finalize; but Open MPI's MPI_Finalize is a fence with every rank of
    COMM_WORLD and blocks for good when one of them is gone. So: skip it when a communicator already gave a
    peer up, else first meet every rank in a bounded ``Ibarrier`` (all of them are stopping too) and only then
    call MPI_Finalize, whose fence is then immediate. The caller ends the process either way.
    """
    import sys

    if "mpi4py" not in sys.modules:
        return "no MPI"
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return "no MPI"
    if MpiComm.peer_lost:
        return f"MPI_Finalize skipped: {MpiComm.peer_lost}"
    if MPI.COMM_WORLD.Get_size() > 1 and not wait_request(MPI.COMM_WORLD.Ibarrier(), timeout_s):
        MpiComm.peer_lost = f"not every rank reached MPI_Finalize within {timeout_s:g}s"
        return f"MPI_Finalize skipped: {MpiComm.peer_lost}"
    MPI.Finalize()
    return "MPI finalized"


def drain_deadline(environ: dict[str, str] | None = None) -> float | None:
    """Epoch seconds by which the leader must have finished or failed its in-flight requests, once its launcher
    received a stop signal (it writes ``$HPC_SERVE_STOP_FILE``); None while serving normally.

    Why the engine needs it: tritonserver calls the model's finalize (which releases the followers) only after
    every request has had its final response, and gives up at its exit timeout; requests still running then
    would leave the followers waiting and the job ending by SIGKILL instead of an ordered stop.
    """
    notice = _stop_notice(environ)
    return None if notice is None else notice.drain_until


def report_drain(state: str, environ: dict[str, str] | None = None) -> None:
    """Tell the stopping leader's launcher how the drain goes (``"draining"``: seen the stop, refusing new
    requests; ``"drained"``: nothing in flight any more), in the ``drain_file`` its stop file names: the launcher
    sends tritonserver SIGTERM only once drained (launcher/node/stop.py LeaderDrain says why). A no-op when not
    stopping or without a launcher."""
    from launcher.contracts.stop_records import DrainReport

    notice = _stop_notice(environ)
    if notice is None or not notice.drain_file:
        return
    try:
        DrainReport(state=state, at=time.time()).write(Path(notice.drain_file))
    except OSError:
        return


def _stop_notice(environ: dict[str, str] | None) -> StopNotice | None:
    """The stop file the leader's launcher wrote (``$HPC_SERVE_STOP_FILE``: launcher/contracts/stop_records.py), or None."""
    from launcher.contracts.rank import STOP_FILE_ENV
    from launcher.contracts.stop_records import StopNotice

    path = (os.environ if environ is None else environ).get(STOP_FILE_ENV)
    return StopNotice.read(Path(path)) if path else None


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


def world_comm(tp_size: int, leader_timeout_s: float = 120.0) -> Communicator:
    """The communicator for ``tp_size`` ranks: :class:`SingleComm` for 1, else MPI COMM_WORLD (sizes must match)."""
    if tp_size <= 1:
        return SingleComm()
    comm = MpiComm(leader_timeout_s=leader_timeout_s)
    if comm.size != tp_size:
        raise ValueError(f"MPI world size {comm.size} != tp_size {tp_size}; leader mode needs world size == tp_size")
    return comm
