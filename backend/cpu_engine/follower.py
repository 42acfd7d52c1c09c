"""What ranks > 0 of a tensor-parallel replica run: load their shard, then mirror every step the leader
broadcasts until it says stop (or disappears). Kept apart from the leader's engine (engine.py): a follower has no
scheduler, sampling or requests, only the forward pass the leader plans.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from .checkpoint import load_config
from .lockstep import StepFailed
from .model import TransformerShard
from .parallel import Communicator, LeaderDied
from .tensors import load_weights

log = logging.getLogger("hpc_serve.cpu_engine")

#: the leader's broadcasts besides a step's plan: "still here" while idle, and "leave your loop"
PING = "ping"
STOP = "stop"


def load_shard(model_dir: str, comm: Communicator, max_slots: int, max_seq_len: int | None = None) -> TransformerShard:
    """Load the checkpoint and keep only this rank's shard."""
    config = load_config(model_dir)
    return TransformerShard(config, load_weights(model_dir), comm=comm, max_slots=max_slots, max_seq_len=max_seq_len)


def leader_messages(comm: Communicator) -> Iterator[Any]:
    """What the leader broadcasts to a rank > 0 (step plans, pings), until it says stop or disappears (said in the
    log): every engine's worker ranks listen so."""
    while True:
        try:
            msg = comm.bcast_obj(None)
        except LeaderDied as e:
            log.error("rank %d: %s; exiting", comm.rank, e)
            return
        if msg == STOP or msg is None:
            return
        yield msg


def follower_loop(shard: TransformerShard) -> None:
    """Ranks > 0: mirror every step the leader broadcasts until it says stop (or disappears)."""
    comm = shard.comm
    for msg in leader_messages(comm):
        if msg == PING:
            continue
        try:
            shard.run_step(msg)
        except StepFailed as e:  # the leader fails the step's requests; this rank just goes on
            log.warning("rank %d: %s", comm.rank, e)
        except Exception:  # noqa: BLE001 - a follower must never leave because of one request
            log.exception("rank %d: step failed outside the forward pass; going on", comm.rank)
