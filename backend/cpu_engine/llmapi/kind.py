"""What the leader and worker nodes ask of the engine they run: one object per engine (this module's `CPU`, the
CPU engine; backend/sim_engine/node.py's, the simulated one), picked by backend/engines.py. The node's wire, its
load-once rule, its KV-event buffer and its stop are the same for every engine; what differs is here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..engine import Engine
from ..follower import follower_loop, load_shard
from ..parallel import Communicator
from .engine_args import EngineArgs, WorkerLoad


@dataclass(frozen=True)
class LeaderLoad:
    """What the leader node gives an engine kind to build its engine from."""

    args: EngineArgs
    #: model.yaml's LLM arguments as sent (an engine may act on more of them than `args` reads)
    llm_args: Mapping[str, Any]
    comm: Communicator
    #: the least time a step takes (the CPU engine's `min_step_ms`)
    min_step_s: float = 0.0
    #: where the KV-cache events go (engine thread); None: not asked for
    on_kv_event: Callable[[dict], None] | None = None


@dataclass(frozen=True)
class Started:
    """A leader-side engine, built (not started), and what the node reports of it."""

    engine: Any  # Engine or backend.sim_engine's SimEngine: what LeaderNode uses of either
    max_seq_len: int
    #: model.yaml's arguments this engine does not act on (logged)
    ignored: list[str] = field(default_factory=list)


class EngineKind(Protocol):
    """An engine behind the stand-in's leader and worker nodes."""

    name: str

    def leader(self, load: LeaderLoad) -> Started:
        """Rank 0's engine, built (the caller starts it); raises EngineArgsError/OSError/ValueError when it cannot."""
        ...

    def worker(self, load: WorkerLoad, comm: Communicator) -> None:
        """A rank > 0's part until the leader releases it (or dies); raises OSError/ValueError when it cannot load."""


class CpuKind:
    """The CPU engine: rank 0 runs the engine on its shard, every other rank mirrors each step (follower.py)."""

    name = "cpu"

    def leader(self, load: LeaderLoad) -> Started:
        args = load.args
        shard = load_shard(args.load.model, load.comm, args.load.max_batch_size, args.load.max_seq_len)
        engine = Engine(
            shard=shard,
            max_batch_size=args.load.max_batch_size,
            max_tokens_in_kv_cache=args.kv_cache_tokens,
            block_size=args.tokens_per_block,
            block_reuse=args.block_reuse,
            min_step_s=load.min_step_s,
            on_kv_event=load.on_kv_event,
        )
        return Started(engine, shard.max_seq_len, args.ignored)

    def worker(self, load: WorkerLoad, comm: Communicator) -> None:
        follower_loop(load_shard(load.model, comm, load.max_batch_size, load.max_seq_len))


CPU = CpuKind()
