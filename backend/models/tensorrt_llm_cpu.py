"""Triton python-backend model that stands in for ``tensorrt_llm`` when there is no GPU / TensorRT-LLM.

Same input/output tensors as the upstream ``tensorrt_llm`` model (tensorrtllm_backend inflight_batcher_llm), so
the ensemble, BLS and clients do not know the difference.  Parameters come from the model config written by
``backend/repository.py``: ``gpt_model_path`` (HF checkpoint dir), ``tp_size``, ``max_tokens_in_paged_kv_cache``,
``exclude_input_in_output``, ``max_batch_size`` (or ``triton_max_batch_size``) and the transaction policy.

Leader mode like TensorRT-LLM: with an MPI world of N > 1 ranks (N must equal tp_size) rank 0 serves and ranks
> 0 stay inside ``initialize()`` running the follower loop; they ``os._exit(0)`` when the leader's ``finalize()``
tells them to stop (or when the leader disappears), so their tritonserver never becomes ready or binds ports.

``triton_python_backend_utils`` exists only inside the python-backend stub, hence imported in ``initialize``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import numpy as np

from backend.cpu_engine.engine import Engine
from backend.cpu_engine.follower import follower_loop, load_shard
from backend.cpu_engine.parallel import SingleComm, replica_comm
from backend.cpu_engine.scheduler import GenerationOutput
from backend.cpu_engine.triton_io import InputError, RequestOptions, merge_rows, output_arrays, parse_inputs
from backend.models.engine_metrics import EngineMetrics
from launcher.contracts import model_names
from launcher.contracts.rank import placement

pb_utils: Any = None  # set in initialize()

_TRUE = {"true", "1", "t", "y", "yes", "on"}


def _param(params: dict[str, Any], key: str) -> str | None:
    """A config parameter's string value; unfilled ``${...}`` templates and empty strings count as unset."""
    value = params.get(key)
    if isinstance(value, dict):
        value = value.get("string_value")
    if value is None:
        return None
    value = str(value).strip()
    if not value or value.startswith("${"):
        return None
    return value


def _int_param(params: dict[str, Any], key: str, default: int | None) -> int | None:
    value = _param(params, key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"model parameter {key!r} must be an integer, got {value!r}") from None


def _end_follower_process() -> None:
    """Leave like a TensorRT-LLM worker rank: the whole rank goes away once the leader stopped.

    Order matters. MPI first: meeting the leader in a bounded MPI_Finalize (see ``_finalize_mpi``) is what
    shows the leader really released us, not merely fell silent. Then the release file, which makes the
    launcher report this rank's end as a clean one (launcher/node/server_env.py release_path); it is not written when the
    leader is gone. Last the parent tritonserver: it is still loading this model (never ready, no ports) and
    the launcher started it ignoring the stop signals (so that Slurm's SIGTERM, sent to every process of the
    step at once, cannot end a follower before its leader released it), hence SIGKILL; exiting the stub alone
    would make it abort (SIGABRT inside the python backend). Only done when the parent really is tritonserver
    (never to a test runner).
    """
    import signal

    released = _finalize_mpi() in ("MPI finalized", "no MPI")
    release = placement().release_file
    if release and released:
        try:
            with open(release, "w", encoding="utf-8") as f:
                f.write("released by the leader\n")
        except OSError:
            pass
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/comm", encoding="utf-8") as f:
            parent = f.read().strip()
    except OSError:
        parent = ""
    if parent == "tritonserver":
        os.kill(ppid, signal.SIGKILL)
    os._exit(0)


def _finalize_mpi() -> str:
    """End MPI properly but never wait on a peer that is gone (parallel.finalize_mpi, bounded): under
    `srun --mpi=pmix` a rank that leaves without MPI_Finalize counts as aborted and Slurm kills the whole step,
    so the other ranks could not finish cleanly. Returns (and logs) what happened."""
    from backend.cpu_engine.parallel import finalize_mpi

    outcome = finalize_mpi()
    if pb_utils is not None and outcome != "no MPI":
        pb_utils.Logger.log_info(f"cpu engine: {outcome}")
    return outcome


class _TritonLog(logging.Handler):
    """Hands the engine's log records (logger ``hpc_serve.cpu_engine``) to Triton's log. Why: inside the stub
    nothing configures Python logging, so its info lines would be lost and its warnings reach stderr unmarked."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = f"cpu engine: {self.format(record)}"
            if record.levelno >= logging.ERROR:
                pb_utils.Logger.log_error(message)
            elif record.levelno >= logging.WARNING:
                pb_utils.Logger.log_warn(message)
            else:
                pb_utils.Logger.log_info(message)
        except Exception:  # noqa: BLE001 - logging must never fail the engine
            self.handleError(record)


def _log_to_triton() -> None:
    engine_log = logging.getLogger("hpc_serve.cpu_engine")
    if not any(isinstance(h, _TritonLog) for h in engine_log.handlers):
        engine_log.addHandler(_TritonLog())
    engine_log.setLevel(logging.INFO)
    engine_log.propagate = False


class _Pending:
    """Bookkeeping for one Triton request whose batch rows are in the engine."""

    def __init__(self, rows: int) -> None:
        self.remaining = rows
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.outputs: list[dict[str, np.ndarray] | None] = [None] * rows
        self.error: str | None = None


class TritonPythonModel:
    """The CPU engine behind the ``tensorrt_llm`` model's tensors."""

    def initialize(self, args: dict[str, Any]) -> None:
        global pb_utils
        import triton_python_backend_utils as _pb  # only inside the stub

        pb_utils = _pb
        _log_to_triton()
        cfg = json.loads(args["model_config"])
        params = cfg.get("parameters", {}) or {}
        self.model_name = args.get("model_name", cfg.get("name", model_names.TENSORRT_LLM))
        self.model_version = str(args.get("model_version", "1"))
        self.decoupled = bool(pb_utils.using_decoupled_model_transaction_policy(cfg))
        self.input_names = [i["name"] for i in cfg.get("input", [])]
        self.output_names = {o["name"] for o in cfg.get("output", [])}
        model_dir = _param(params, "gpt_model_path") or _param(params, "engine_dir")
        if not model_dir:
            raise ValueError("model parameter 'gpt_model_path' (engine_dir) must name a Hugging Face checkpoint folder")
        max_batch = int(cfg.get("max_batch_size") or 0) or _int_param(params, "triton_max_batch_size", 8) or 8
        tp_size = _int_param(params, "tp_size", 1) or 1
        pp_size = _int_param(params, "pp_size", 1) or 1
        if pp_size != 1:
            raise ValueError(f"pp_size {pp_size}: the CPU engine supports tensor parallelism only (pp_size 1)")
        beam = _int_param(params, "max_beam_width", 1) or 1
        if beam != 1:
            raise ValueError(f"max_beam_width {beam}: the CPU engine does not implement beam search (use 1)")
        kv_tokens = _int_param(params, "max_tokens_in_paged_kv_cache", None)
        min_step_s = (_int_param(params, "min_step_ms", 0) or 0) / 1000
        self.default_exclude = (_param(params, "exclude_input_in_output") or "false").lower() in _TRUE
        # upstream's parameter (triton.enable_kv_cache_reuse): blocks of a prompt prefix kept for later prompts
        block_reuse = (_param(params, "enable_kv_cache_reuse") or "false").lower() in _TRUE
        logger = pb_utils.Logger

        place = placement()  # what the launcher decided (launcher/contracts/rank.py), not the starter's variables
        world, per_replica = place.world_size, place.ranks_per_replica
        if per_replica != tp_size or world % per_replica:
            raise ValueError(
                f"{per_replica} ranks per replica (MPI world {world}) != tp_size {tp_size}: leader mode needs "
                f"exactly tp_size ranks per replica (launch {tp_size} × replicas ranks, or set tp_size)"
            )
        comm = replica_comm(world, per_replica) if world > 1 else SingleComm()
        if comm.size != tp_size:
            raise ValueError(f"MPI world size {comm.size} != tp_size {tp_size}")
        if comm.rank > 0:
            logger.log_info(f"cpu engine rank {comm.rank}/{comm.size}: follower, waiting for the leader")
            shard = load_shard(model_dir, comm, max_slots=max_batch)
            follower_loop(shard)
            logger.log_info(f"cpu engine rank {comm.rank}: terminating worker process, leader said stop")
            _end_follower_process()

        self.engine = Engine(
            model_dir,
            comm=comm,
            tp_size=tp_size,
            max_batch_size=max_batch,
            max_tokens_in_kv_cache=kv_tokens,
            min_step_s=min_step_s,
            block_reuse=block_reuse,
        )
        self._metrics = EngineMetrics(pb_utils, self.model_name, self.model_version, self.engine.stats())
        self.engine.on_step = self._metrics.update
        self.engine.start()
        logger.log_info(
            f"cpu engine ready: {model_dir} family={self.engine.config.family} tp={tp_size} "
            f"max_batch={max_batch} kv_tokens={self.engine.budget.max_tokens} decoupled={self.decoupled} "
            f"kv_cache_reuse={block_reuse}"
        )

    # ------------------------------------------------------------------ requests
    def _inputs(self, request: Any) -> dict[str, np.ndarray]:
        out = {}
        for name in self.input_names:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None:
                out[name] = t.as_numpy()
        return out

    def _response(self, arrays: dict[str, np.ndarray]) -> Any:
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(n, a) for n, a in arrays.items() if n in self.output_names]
        )

    @staticmethod
    def _error(message: str) -> Any:
        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))

    def _is_stop(self, inputs: dict[str, np.ndarray]) -> bool:
        stop = inputs.get("stop")
        return stop is not None and stop.size > 0 and bool(np.any(stop))

    def _stop(self, request: Any) -> None:
        """A `stop: true` request: stop the request of its id, as TensorRT-LLM's backend does (an id that
        matches nothing is no error: its request may have ended already; DEVELOPERS.md, "Abandoned streams")."""
        request_id = request.request_id() or ""
        if not request_id:
            raise InputError("input 'stop': a stop request must carry the request id of the request to stop")
        self.engine.cancel(request_id)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.decoupled:
            for request in requests:
                self._execute_decoupled(request)
            return None
        return self._execute_blocking(requests)

    def _execute_decoupled(self, request: Any) -> None:
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            inputs = self._inputs(request)
            if self._is_stop(inputs):
                self._stop(request)
                sender.send(flags=final)
                return
            reqs, opts = parse_inputs(inputs, self.default_exclude)
        except (InputError, ValueError) as e:
            sender.send(self._error(str(e)), flags=final)
            return
        pending = _Pending(len(reqs))
        is_cancelled = getattr(sender, "is_cancelled", None) or getattr(request, "is_cancelled", None)
        for b, req in enumerate(reqs):
            req.request_id = request.request_id() or ""
            req.is_cancelled = is_cancelled
            req.on_output = self._streamer(sender, pending, b, opts)
            self.engine.submit(req)

    def _streamer(self, sender: Any, pending: _Pending, b: int, opts: RequestOptions):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        def on_output(out: GenerationOutput) -> None:
            with pending.lock:
                if out.finished:
                    pending.remaining -= 1
                last = pending.remaining == 0
            flags = final if last else 0
            try:
                if out.error:
                    sender.send(self._error(out.error), flags=flags)
                elif out.new_tokens or not opts.streaming:
                    sender.send(self._response(output_arrays(out, b, opts)), flags=flags)
                elif last:
                    sender.send(flags=final)
            except Exception:  # client gone / cancelled: nothing left to tell it
                pass

        return on_output

    def _execute_blocking(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        waits: list[tuple[int, _Pending, RequestOptions, int]] = []
        for i, request in enumerate(requests):
            try:
                inputs = self._inputs(request)
                if self._is_stop(inputs):
                    self._stop(request)
                    responses[i] = self._response(
                        {"output_ids": np.zeros((1, 1, 0), np.int32), "sequence_length": np.zeros((1, 1), np.int32)}
                    )
                    continue
                reqs, opts = parse_inputs(inputs, self.default_exclude)
                if opts.streaming:
                    raise InputError("input 'streaming': streaming needs a decoupled model (decoupled_mode: true)")
            except (InputError, ValueError) as e:
                responses[i] = self._error(str(e))
                continue
            pending = _Pending(len(reqs))
            pad = next((r.pad_id for r in reqs if r.pad_id is not None), 0)
            for b, req in enumerate(reqs):
                req.request_id = request.request_id() or ""
                req.is_cancelled = getattr(request, "is_cancelled", None)
                req.on_output = self._collector(pending, b, opts)
                self.engine.submit(req)
            waits.append((i, pending, opts, pad))
        for i, pending, _opts, pad in waits:
            pending.done.wait()
            if pending.error:
                responses[i] = self._error(pending.error)
            else:
                responses[i] = self._response(merge_rows([o for o in pending.outputs if o is not None], pad))
        return responses

    @staticmethod
    def _collector(pending: _Pending, b: int, opts: RequestOptions):
        def on_output(out: GenerationOutput) -> None:
            if not out.finished:
                return
            with pending.lock:
                if out.error:
                    pending.error = pending.error or out.error
                else:
                    pending.outputs[b] = output_arrays(out, b, opts)
                pending.remaining -= 1
                if pending.remaining == 0:
                    pending.done.set()

        return on_output

    def finalize(self) -> None:
        """Triton unloads the model: on SIGTERM tritonserver first stops taking requests and lets those in
        flight finish (up to its --exit-timeout-secs, which the launcher sets from launch.json drain_s), then
        unloads. Here the engine stops (what is still queued fails with a clear error), the followers are
        released (Engine.shutdown broadcasts stop) and MPI ends; every step is bounded, so a follower that is
        already gone delays the leader by seconds, never forever."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            stopping = getattr(engine.comm, "stopping", None)  # MpiComm: shorter bounds from now on
            if stopping is not None:
                stopping()
            try:
                engine.shutdown()  # tells followers to stop; they finalize MPI and leave
            except Exception as e:  # noqa: BLE001 - e.g. parallel.PeerGone: still end MPI and let Triton go on
                if pb_utils is not None:
                    pb_utils.Logger.log_warn(f"cpu engine: stopping the followers failed: {e}")
        del engine  # no reference of this frame keeps the engine (and what it holds) past the release
        _finalize_mpi()
        self._release_stub_objects()

    def _release_stub_objects(self) -> None:
        """Drop the metric families/metrics and the engine (whose finished requests hold response senders) now,
        while the stub is still whole: left to the interpreter's final garbage collection, their destructors
        run after the stub tore down its shared memory and segfault (seen at every tp 2 leader exit)."""
        import gc

        if hasattr(self, "engine"):
            self.engine.on_step = None  # it held the gauges' update, and so the gauges
            del self.engine
        if hasattr(self, "_metrics"):
            self._metrics.release()  # the gauges go now, whoever still holds the EngineMetrics
            del self._metrics
        gc.collect()
