"""The CPU engine's leader node: MPI rank 0 of a replica on the llmapi workflow, what the stand-in's
`python -m tensorrt_llm.llmapi.mgmn_leader_node` runs (backend/standin/tensorrt_llm/llmapi/).

It listens on `TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR` (HMAC key `TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY`) for the
stand-in's `LLM` inside tritonserver (protocol.py). On the model's `Load` it tells the worker nodes (MPI ranks
> 0, worker_node.py) what to load and runs its engine: the CPU engine on its own shard (backend/cpu_engine/engine.py:
the same scheduler, lockstep and follower loop as the engine workflow's tensor parallelism), or the simulated one
(backend/sim_engine/), as its `EngineKind` says (kind.py; backend/engines.py picks); requests come as `Submit`,
their tokens go back as `Output` per engine step.

It stops (engine shut down, workers released, MPI finalized) on a `Shutdown` from any connection (the LLM's
shutdown on older releases, `--action stop` on newer ones), when the connection that loaded the model breaks
if the release's leader node ends with its client (`stop_on_disconnect`), or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import logging
import os
import signal
import sys
import threading
from multiprocessing import AuthenticationError
from typing import Any

import numpy as np

from launcher.contracts.llmapi import CPU_MIN_STEP_VAR

from ..follower import STOP
from ..parallel import Communicator, MpiComm, SingleComm, finalize_mpi
from ..sampling import SamplingParams
from ..scheduler import GenerationOutput, GenerationRequest
from . import protocol as p
from .engine_args import EngineArgsError, checkpoint_folder, engine_args
from .kind import CPU, EngineKind, LeaderLoad

log = logging.getLogger("hpc_serve.cpu_engine.llmapi")


def world_comm() -> Communicator:
    """COMM_WORLD of the step (mpi4py; a plain `python -m` is an MPI singleton): the replica's ranks."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() == 1:
        return SingleComm()
    comm = MpiComm()
    if comm.rank != 0:
        raise SystemExit(f"leader node started on MPI rank {comm.rank}: ranks > 0 run the worker node")
    return comm


def _perf(req: GenerationRequest, tokens_per_block: int) -> p.Perf:
    """TensorRT-LLM's per-request KV figures: the prompt's blocks found in the cache (reused) or not (missed),
    and the blocks the request took, of which the reused ones were not newly allocated."""
    reused = req.kv_blocks_reused
    prompt_blocks = -(-req.prompt_len // tokens_per_block)
    return p.Perf(
        arrival_time_ns=req.arrival_time_ns,
        first_scheduled_time_ns=req.first_scheduled_time_ns,
        first_token_time_ns=req.first_token_time_ns,
        last_token_time_ns=req.last_token_time_ns,
        kv_cache_alloc_new_blocks=req.kv_blocks_allocated - reused,
        kv_cache_alloc_total_blocks=req.kv_blocks_allocated,
        kv_cache_missed_block=prompt_blocks - reused,
        kv_cache_reused_block=reused,
        kv_cache_hit_rate=reused / prompt_blocks if prompt_blocks else 0.0,
    )


class LeaderNode:
    """The engine behind the IPC endpoint; one instance per process."""

    def __init__(
        self, comm: Communicator, min_step_s: float = 0.0, stop_on_disconnect: bool = True, kind: EngineKind = CPU
    ) -> None:
        self.comm = comm
        #: the engine it runs (kind.py): the CPU engine, or the simulated one (backend/engines.py picks)
        self.kind = kind
        self.stop_on_disconnect = stop_on_disconnect
        self.min_step_s = min_step_s
        self.engine: Any = None  # the kind's engine, once loaded
        self.loaded: p.Loaded | None = None
        self.load_error: str | None = None
        self._load_lock = threading.Lock()
        self._told_workers = False
        self._connections = itertools.count(1)
        self.stop = threading.Event()
        #: the latest KV-cache events (kv_cache_config.event_buffer_max_size of them at most, oldest dropped); each
        #: connection reads those after the last it read (`_kv_read`), so every LLM connected sees every event
        self.kv_events: collections.deque[dict[str, Any]] | None = None
        self._kv_read: dict[str, int] = {}
        self._kv_event_ids = itertools.count()
        self._kv_lock = threading.Lock()
        self._window = 0  # the attention window the events name: the model's context

    # ------------------------------------------------------------------ connections
    def serve(self, channel: p.Channel) -> None:
        """Answer one connection until it closes; the model's (the one that loaded) closing stops the node."""
        loaded_here = False
        scope = f"{next(self._connections)}:"  # engine ids per connection: two models' ids never meet
        try:
            while not self.stop.is_set():
                message = channel.recv()
                if isinstance(message, p.Load):
                    reply = self.load(message)
                    loaded_here = loaded_here or isinstance(reply, p.Loaded)
                    channel.send(reply)
                elif isinstance(message, p.Submit):
                    self.submit(message, channel, scope)
                elif isinstance(message, p.Abort):
                    if self.engine is not None:
                        self.engine.cancel(scope + message.request_id)
                elif isinstance(message, p.StatsQuery):
                    channel.send(self.stats())
                elif isinstance(message, p.KvEventsQuery):
                    channel.send(self.take_kv_events(scope))
                elif isinstance(message, p.Shutdown):
                    log.info("leader node: the model unloads; stopping")
                    self.stop.set()
                else:
                    raise p.ProtocolError(f"unexpected {type(message).__name__} from the model")
        except (EOFError, OSError):
            if loaded_here and self.stop_on_disconnect:
                log.warning("leader node: the model's connection is gone (tritonserver exited?); stopping")
                self.stop.set()
        except p.ProtocolError as e:
            log.error("leader node: %s; closing that connection", e)
        finally:
            channel.close()

    def load(self, message: p.Load) -> p.Loaded | p.LoadFailed:
        """Load once: a later load of the same checkpoint (the model reloaded, or another model of the repository)
        gets the same answer and the engine keeps its first settings; another checkpoint is refused."""
        with self._load_lock:
            if self.loaded is not None:
                if message.llm_args.get("model") and self.loaded.model != checkpoint_folder(message.llm_args):
                    return p.LoadFailed(
                        f"this leader node serves {self.loaded.model}; restart the job to serve another model"
                    )
                return self.loaded
            if self.load_error is not None:
                return p.LoadFailed(f"an earlier load failed: {self.load_error}; restart the job")
            try:
                self.loaded = self._load(message.llm_args)
                return self.loaded
            except (EngineArgsError, ValueError, OSError) as e:
                self.load_error = str(e)
                log.error("leader node: load failed: %s", e)
                return p.LoadFailed(str(e))

    def _load(self, llm_args: dict[str, Any]) -> p.Loaded:
        args = engine_args(llm_args, self.comm.size)
        if self.comm.size > 1:
            self._told_workers = True
            self.comm.bcast_obj(args.load)  # the workers load their shards meanwhile (worker_node.py)
        events = args.kv_event_buffer > 0 and args.block_reuse
        if events:
            self.kv_events = collections.deque(maxlen=args.kv_event_buffer)
        started = self.kind.leader(
            LeaderLoad(args, llm_args, self.comm, self.min_step_s, self._kv_event if events else None)
        )
        engine = started.engine
        self._window = started.max_seq_len
        if events:
            self._kv_event({"type": "created", "num_blocks_per_cache_level": [engine.budget.max_blocks, 0]})
        engine.start()
        self.engine = engine
        log.info(
            "leader node: serving %s (%s, tp %d, batch %d, %d KV tokens); ignored LLM API arguments: %s",
            args.load.model,
            f"{engine.config.family} on the {self.kind.name} engine",
            args.tp_size,
            engine.max_batch_size,
            engine.budget.max_tokens,
            ", ".join(started.ignored) or "none",
        )
        return p.Loaded(
            model=args.load.model,
            family=engine.config.family,
            vocab_size=engine.config.vocab_size,
            max_seq_len=started.max_seq_len,
            max_batch_size=engine.max_batch_size,
            kv_cache_tokens=engine.budget.max_tokens,
            tp_size=args.tp_size,
            ignored=started.ignored,
        )

    def submit(self, message: p.Submit, channel: p.Channel, scope: str = "") -> None:
        s = message.sampling
        req = GenerationRequest(
            input_ids=np.asarray(message.prompt_ids, np.int64),
            max_new_tokens=s.max_tokens,
            end_id=s.end_id,
            stop_words=s.stop_words,
            streaming=message.streaming,
            request_id=scope + message.request_id,
            return_log_probs=s.return_log_probs,
            sampling=SamplingParams(
                temperature=s.temperature,
                top_k=s.top_k,
                top_p=s.top_p,
                seed=s.seed,
                repetition_penalty=s.repetition_penalty,
                presence_penalty=s.presence_penalty,
                frequency_penalty=s.frequency_penalty,
                min_tokens=s.min_tokens,
            ),
        )
        req.on_output = self._sender(channel, message.request_id)
        if self.engine is None:
            req.on_output(GenerationOutput(req, [], [], True, "error", "the leader node has no model loaded"))
            return
        try:
            self.engine.submit(req)
        except ValueError as e:  # SamplingParams.validate: the model checks first, this is the last line
            req.on_output(GenerationOutput(req, [], [], True, "error", str(e)))

    def _sender(self, channel: p.Channel, request_id: str):
        # the engine's block size for the perf figures (none loaded: the request fails before it has any)
        tokens_per_block = self.engine.budget.block_size if self.engine is not None else 1

        def on_output(out: GenerationOutput) -> None:
            req = out.request
            message = p.Output(
                request_id=request_id,
                new_tokens=list(out.new_tokens),
                finished=out.finished,
                cum_log_prob=float(req.cum_log_prob),
                log_probs=[float(x) for x in out.new_log_probs] if req.return_log_probs else [],
                finish_reason=out.finish_reason if out.finished else None,
                error=out.error,
                perf=_perf(req, tokens_per_block) if out.finished else None,
            )
            try:
                channel.send(message)
            except OSError:  # the model is gone: its requests end with the engine
                pass

        return on_output

    def _kv_event(self, data: dict[str, Any]) -> None:
        """One KV-cache event in TensorRT-LLM's envelope, kept until read (engine thread)."""
        with self._kv_lock:
            if self.kv_events is not None:
                self.kv_events.append({"event_id": next(self._kv_event_ids), "data": data, "window_size": self._window})

    def take_kv_events(self, reader: str = "") -> p.KvEvents:
        """The events `reader` (a connection) has not read yet, oldest first."""
        with self._kv_lock:
            if self.kv_events is None:
                return p.KvEvents([])
            after = self._kv_read.get(reader, -1)
            events = [e for e in self.kv_events if e["event_id"] > after]
            if events:
                self._kv_read[reader] = events[-1]["event_id"]
        return p.KvEvents(events)

    def stats(self) -> p.Stats:
        if self.engine is None:
            return p.Stats(0, 0, 0, 0)
        return p.Stats(**vars(self.engine.stats()))

    # ------------------------------------------------------------------ stop
    def shutdown(self) -> str:
        """Stop the engine (fails what is queued), release the workers, end MPI; returns how MPI ended."""
        if self.engine is not None:
            stopping = getattr(self.engine.comm, "stopping", None)
            if stopping is not None:
                stopping()
            self.engine.shutdown()  # broadcasts STOP to the workers
        elif self.comm.size > 1 and not self._told_workers:
            stopping = getattr(self.comm, "stopping", None)
            if stopping is not None:
                stopping()
            self.comm.bcast_obj(STOP)  # workers still wait for their load
        return finalize_mpi()


def _accept_loop(listener: Any, node: LeaderNode) -> None:
    while not node.stop.is_set():
        try:
            conn = listener.accept()
        except (OSError, EOFError, AuthenticationError) as e:  # e.g. a peer without the key: refused, go on
            log.warning("leader node: refused a connection: %s", e)
            continue
        threading.Thread(target=node.serve, args=(p.Channel(conn),), name="llmapi-conn", daemon=True).start()


def main(argv: list[str] | None = None, stop_on_disconnect: bool = True, kind: EngineKind = CPU) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorrt_llm.llmapi.mgmn_leader_node", description=__doc__)
    parser.add_argument(
        "--min-step-ms",
        type=float,
        default=float(os.environ.get(CPU_MIN_STEP_VAR) or 0.0),
        help=f"the least time an engine step takes (tests: a GPU's pace); default ${CPU_MIN_STEP_VAR}, else 0",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        ep = p.endpoint()
    except p.ProtocolError as e:
        print(f"leader node: {e}", file=sys.stderr)
        return 2
    node = LeaderNode(world_comm(), args.min_step_ms / 1000, stop_on_disconnect, kind)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: node.stop.set())
    listener = p.listen(ep)
    log.info("leader node: rank 0 of %d, listening on %s:%d", node.comm.size, ep.host, ep.port)
    threading.Thread(target=_accept_loop, args=(listener, node), name="llmapi-accept", daemon=True).start()
    while not node.stop.wait(1.0):  # a timed wait: the main thread must stay able to run the signal handlers
        pass
    outcome = node.shutdown()
    listener.close()
    log.info("leader node: stopped (%s)", outcome)
    return 0
