"""hpc-serve's `tensorrt_llm` Triton python model: TensorRT-LLM's public LLM API behind upstream's llmapi model
contract (`triton_backend/all_models/llmapi/tensorrt_llm/1/model.py`: its tensor names, types and shapes, its stop
and cancellation semantics), the same file on a GPU (the real `tensorrt_llm`) and in CI (the CPU engine's stand-in
of it, backend/standin/). It uses only `LLM(**model.yaml)`, `SamplingParams`,
`generate_async(..., streaming=...)` by keyword, `RequestOutput` (async iteration, `abort`), `get_stats_async`
and `shutdown`.

What it adds to upstream's (docs/compatibility.md): token-by-token streaming (each event carries the cumulative
text, as upstream's would; when its sends fall behind the engine, the tokens that waited go out in one event),
stop strings given to SamplingParams as text, `ignore_eos`, `min_tokens`,
`repetition_penalty`, `length_penalty`, and the engine's iteration stats as Triton metrics under TensorRT-LLM's
`nv_trt_llm_*` names (backend/models/engine_metrics.py), beside its own count of the requests it holds
(`hpc_serve_model_requests_in_flight`): what an ordered stop and a renewal read to know what is in flight.

As upstream: model.yaml (or `$LLM_CONFIG_PATH`) holds the LLM arguments and `triton_config`; a `stop` request
aborts the requests of its request id and answers CANCELLED; every `cancellation_check_period_ms` a request
whose client cancelled is aborted; any error ends its request only ("Error generating request: ...");
finalize awaits the requests in flight, then shuts the LLM down.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backend.models.engine_metrics import EngineMetrics, RequestsInFlight, idle_iteration
from backend.models.llmapi_io import (
    Completion,
    InputError,
    LlmRequest,
    is_stop,
    kv_events_since,
    parse_request,
    response_arrays,
)
from launcher.contracts.llmapi import (
    CANCELLATION_CHECK_PERIOD_MS,
    KV_EVENTS_OFF,
    KV_EVENTS_OUTPUT,
    LLM_CONFIG_PATH_VAR,
    MODEL_YAML,
)

pb_utils: Any = None  # triton_python_backend_utils, set in initialize() (it exists only inside the stub)

CANCELLED = "Request cancelled by client"
NO_REQUEST_ID = "A request id must be provided for request cancellation"
#: how often finalize says how many requests it still awaits (upstream logs it every second)
AWAIT_LOG_S = 1.0
#: how often the engine's iteration stats are set into the metrics (the LLM yields one per iteration while it
#: steps), and how long a read waits for a new one before it starts again
STATS_PERIOD_S = 0.2
STATS_TIMEOUT_S = 1.0


def read_model_yaml(model_dir: str) -> dict[str, Any]:
    """model.yaml as upstream reads it: `$LLM_CONFIG_PATH` or model.yaml, joined to the model's folder."""
    import yaml

    name = os.environ.get(LLM_CONFIG_PATH_VAR, MODEL_YAML)
    path = os.path.join(model_dir, name)
    if not os.path.isfile(path):
        raise AssertionError(f"'{name}' containing TRT-LLM engine args not found in '{model_dir}'")
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise pb_utils.TritonModelException(f"Failed to parse YAML engine config: {e}") from e
    if not isinstance(config, dict):
        raise pb_utils.TritonModelException(f"Failed to parse YAML engine config: {path} is not a mapping")
    return config


def sampling_params(params: LlmRequest) -> Any:
    """The request's SamplingParams (keyword arguments only: upstream's dataclass is keyword-only)."""
    from tensorrt_llm import SamplingParams

    return SamplingParams(**params.sampling_kwargs())


@dataclass
class _Live:
    """A request in the engine: what its responses need, and a flag so that exactly one final is sent."""

    internal_id: int
    request: Any
    sender: Any
    params: LlmRequest
    user_id: str
    output: Any = None  # the RequestOutput, once generate_async returned it
    logprobs_sent: int = 0  # the generated tokens whose log probabilities went out already
    draining: bool = False  # the loop is reading the outputs that were waiting (`_stream`); one was sent
    pending: tuple[str, int] | None = None  # the text and token count the next streamed response carries
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def claim_final(self) -> bool:
        """True for the one caller that may send the final response."""
        with self.lock:
            if self.done:
                return False
            self.done = True
            return True

    def client_cancelled(self) -> bool:
        """`is_cancelled()`, asked only while no final was claimed, under the lock that claims it: once the final
        is sent tritonserver frees the request's response factory, and asking then crashes it (2.51: SIGSEGV in
        TRITONBACKEND_ResponseFactoryIsCancelled). A request whose client is gone counts as cancelled."""
        with self.lock:
            if self.done:
                return False
            try:
                return bool(self.request.is_cancelled())
            except Exception:  # noqa: BLE001
                return True


class TritonPythonModel:
    """Upstream's llmapi model contract over TensorRT-LLM's public LLM API."""

    def initialize(self, args: dict[str, Any]) -> None:
        global pb_utils
        import triton_python_backend_utils as _pb
        from tensorrt_llm import LLM
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict

        pb_utils = _pb
        config = json.loads(args["model_config"])
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        llm_args = read_model_yaml(model_dir)
        triton_config = llm_args.pop("triton_config", None) or {}
        self.decoupled = bool(triton_config.get("decoupled", pb_utils.using_decoupled_model_transaction_policy(config)))
        period_ms = triton_config.get("cancellation_check_period_ms", CANCELLATION_CHECK_PERIOD_MS)
        self.check_period_s = float(period_ms) / 1000
        # the engine's metrics are its iteration stats, which the PyTorch backend keeps only when asked (False
        # by default); model.yaml may still say false
        llm_args.setdefault("enable_iter_perf_stats", True)
        kv = llm_args.get("kv_cache_config") or {}
        kept = int(kv.get("event_buffer_max_size", 0) or 0) if isinstance(kv, dict) else 0
        reuse = not isinstance(kv, dict) or kv.get("enable_block_reuse", True)
        # as upstream's model.py: the configuration sections become their classes (speculative decoding, ...)
        self.llm = LLM(**update_llm_args_with_extra_dict({}, llm_args))
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # a request left `_live` (finalize awaits them)
        self._live: dict[int, _Live] = {}
        self._by_user: dict[str, set[int]] = {}
        self._shutdown = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="llmapi-loop", daemon=True)
        self._loop_thread.start()
        self.metrics: EngineMetrics | None = None
        self.in_flight = RequestsInFlight(pb_utils, args["model_name"], args["model_version"])
        if llm_args["enable_iter_perf_stats"]:
            self.metrics = EngineMetrics(pb_utils, args["model_name"], args["model_version"], None)
        #: the latest KV-cache events (kv_cache_config.event_buffer_max_size of them), for `kv_cache_events_since`
        self.kv_events: collections.deque[dict[str, Any]] | None = (
            collections.deque(maxlen=kept) if kept > 0 and reuse else None
        )
        #: the stats and events readers start with the first request: before it, the LLM has neither to give
        self._readers_started = False
        self._cancel_thread = threading.Thread(target=self._cancellation_loop, name="llmapi-cancel", daemon=True)
        self._cancel_thread.start()
        import tensorrt_llm

        pb_utils.Logger.log_info(
            f"[trtllm] hpc-serve's llmapi model on tensorrt_llm {tensorrt_llm.__version__}: {llm_args.get('model')}"
        )

    # ------------------------------------------------------------------ requests
    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self._execute_one(request)
        return None

    def _execute_one(self, request: Any) -> None:
        sender = request.get_response_sender()
        try:
            inputs = {t.name(): t.as_numpy() for t in request.inputs()}
            if is_stop(inputs):
                self._stop(request, sender)
                return
            since = kv_events_since(inputs)
            if since is not None:
                self._send_kv_events(sender, since)
                return
            params = parse_request(inputs)
            if params.streaming and not self.decoupled:
                raise InputError("Streaming is only supported in decoupled mode.")
            self._submit(request, sender, params)
        except Exception as e:  # noqa: BLE001 - upstream: any error ends this request only, the model serves on
            self._send_error(sender, e)

    def _send_error(self, sender: Any, error: Exception | str) -> None:
        pb_utils.Logger.log_error(f"[trtllm] Error generating request: {error}")
        text = pb_utils.Tensor("text_output", np.array([b"N/A"], dtype=np.object_))
        response = pb_utils.InferenceResponse(
            output_tensors=[text], error=pb_utils.TritonError(f"Error generating request: {error}")
        )
        try:
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # noqa: BLE001 - the client is gone: nobody left to tell
            pass

    def _send_cancelled(self, sender: Any) -> None:
        error = pb_utils.TritonError(CANCELLED, pb_utils.TritonError.CANCELLED)
        try:
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # noqa: BLE001 - the client is gone
            pass

    def _stop(self, request: Any, sender: Any) -> None:
        """Upstream's stop: abort the requests of this request id, then answer CANCELLED whatever matched."""
        user_id = request.request_id()
        if not user_id:
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(NO_REQUEST_ID)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        with self._lock:
            targets = [self._live[i] for i in self._by_user.get(user_id, ()) if i in self._live]
        for live in targets:
            self._abort(live)
        self._send_cancelled(sender)

    def _send_kv_events(self, sender: Any, since: int) -> None:
        """The KV-cache events after event id `since` that the model still keeps, as one JSON list."""
        if self.kv_events is None:
            raise InputError(KV_EVENTS_OFF)
        events = [e for e in list(self.kv_events) if int(e.get("event_id", -1)) > since]
        tensor = pb_utils.Tensor(KV_EVENTS_OUTPUT, np.array([json.dumps(events).encode()], dtype=np.object_))
        sender.send(
            pb_utils.InferenceResponse(output_tensors=[tensor]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        )

    def _start_readers(self) -> None:
        """The stats and KV-cache events readers, once (the first request made the LLM's iteration results)."""
        if self._readers_started:
            return
        self._readers_started = True
        if self.metrics is not None:
            asyncio.run_coroutine_threadsafe(self._read_stats(), self.loop)
        if self.kv_events is not None:
            asyncio.run_coroutine_threadsafe(self._read_kv_events(), self.loop)

    def _submit(self, request: Any, sender: Any, params: LlmRequest) -> None:
        live = _Live(next(self._ids), request, sender, params, request.request_id() or "")
        with self._lock:
            self._live[live.internal_id] = live
            self.in_flight.set(len(self._live))
            if live.user_id:
                self._by_user[live.user_id] = {live.internal_id}
        asyncio.run_coroutine_threadsafe(self._generate(live), self.loop)

    async def _generate(self, live: _Live) -> None:
        """One request on the LLM: its responses until the final one (or an error), then out of `_live`."""
        try:
            live.output = self.llm.generate_async(
                live.params.prompt, sampling_params(live.params), streaming=live.params.streaming
            )
            self._start_readers()
            if live.done:  # aborted while it was being submitted
                live.output.abort()
            async for output in live.output:
                if live.done:
                    continue  # aborted: its CANCELLED was sent; the engine's end is awaited and dropped
                if not output.finished:
                    if live.params.streaming:
                        self._stream(live, output)
                    continue
                self._send_pending(live)
                if live.claim_final():
                    if output.outputs[0].finish_reason == "cancelled":
                        self._send_cancelled(live.sender)
                    else:
                        self._send(live, self._completion(output, live), final=True)
        except Exception as e:  # noqa: BLE001 - RequestError, or generate_async refusing the request
            if live.claim_final():
                self._send_error(live.sender, e)
        finally:
            self._unregister(live.internal_id)

    def _new_logprobs(self, live: _Live, out: Any, upto: int | None = None) -> tuple[float, ...] | None:
        """The log probabilities of the tokens generated since the last response, up to the `upto`-th (all by
        default), each the chosen token's: TensorRT-LLM gives a {token id: Logprob} per token, with alternatives
        when asked for more."""
        if not live.params.sampling.get("logprobs"):
            return None
        generated = list(out.token_ids)[-len(out.logprobs) :] if out.logprobs else []
        values = []
        for token, entry in zip(generated, out.logprobs, strict=False):
            chosen = entry.get(token) or max(entry.values(), key=lambda lp: lp.logprob)
            values.append(float(chosen.logprob))
        values = values[:upto]
        new, live.logprobs_sent = tuple(values[live.logprobs_sent :]), len(values)
        return new

    def _completion(self, output: Any, live: _Live) -> Completion:
        out = output.outputs[0]
        perf = None
        metrics = getattr(out, "request_perf_metrics", None)
        if metrics is not None:
            t, kv = metrics.timing_metrics, metrics.kv_cache_metrics
            perf = {
                "kv_cache_reused_block": kv.num_reused_blocks,
                "kv_cache_hit_rate": kv.kv_cache_hit_rate,
                "kv_cache_alloc_new_blocks": kv.num_new_allocated_blocks,
                "kv_cache_alloc_total_blocks": kv.num_total_allocated_blocks,
                "kv_cache_missed_block": kv.num_missed_blocks,
                "arrival_time_ns": int(t.arrival_time.total_seconds() * 1e9),
                "first_scheduled_time_ns": int(t.first_scheduled_time.total_seconds() * 1e9),
                "first_token_time_ns": int(t.first_token_time.total_seconds() * 1e9),
                "last_token_time_ns": int(t.last_token_time.total_seconds() * 1e9),
            }
        return Completion(
            text=out.text,
            finish_reason=out.finish_reason,
            stop_reason=out.stop_reason,
            cumulative_logprob=out.cumulative_logprob,
            perf=perf,
            logprobs=self._new_logprobs(live, out),
        )

    def _unregister(self, internal_id: int) -> None:
        with self._lock:
            live = self._live.pop(internal_id, None)
            self.in_flight.set(len(self._live))
            self._ended.notify_all()
            if live is not None and live.user_id:
                ids = self._by_user.get(live.user_id)
                if ids is not None:
                    ids.discard(internal_id)
                    if not ids:
                        del self._by_user[live.user_id]

    def _abort(self, live: _Live) -> None:
        """End the request CANCELLED now and tell the engine to stop it (its own end is then dropped)."""
        if not live.claim_final():
            return
        self._send_cancelled(live.sender)
        if live.output is not None:
            self.loop.call_soon_threadsafe(live.output.abort)

    def _stream(self, live: _Live, output: Any) -> None:
        """A streamed output that is not the last. The first of those the loop finds waiting is sent at once (a
        sender that keeps up sends every token alone); the others waiting behind it, which pile up while the
        loop's sends block it, go out together in one response once the loop has read them all (`_drain_end`):
        under load a response carries several tokens, and costs tritonserver and this process one send for all.
        The text is cumulative, and the log probabilities are those not yet sent, so clients read the same."""
        out = output.outputs[0]
        snapshot = (out.text, len(out.logprobs or ()))  # the output changes in place as more tokens come
        if live.draining:
            live.pending = snapshot
            return
        live.draining = True
        self.loop.call_soon(self._drain_end, live)
        live.pending = snapshot
        self._send_pending(live)

    def _drain_end(self, live: _Live) -> None:
        live.draining = False
        self._send_pending(live)

    def _send_pending(self, live: _Live) -> None:
        """The streamed response of the text not yet sent, if any: sent only while no final is claimed, under the
        lock that claims it. A final sent first (the client cancelled) has freed the request's response factory,
        and sending on it then crashes tritonserver (2.51: SIGSEGV in TRITONBACKEND_ResponseSend)."""
        if live.pending is None:
            return
        (text, tokens), live.pending = live.pending, None
        with live.lock:
            if not live.done:
                out = live.output.outputs[0]
                self._send(live, Completion(text, logprobs=self._new_logprobs(live, out, tokens)), final=False)

    def _send(self, live: _Live, completion: Completion, final: bool) -> None:
        arrays = response_arrays(completion, live.params)
        response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in arrays.items()])
        try:
            live.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception:  # noqa: BLE001 - the client is gone: the cancellation loop aborts the request
            pass

    # ------------------------------------------------------------------ stats, cancellation
    async def _read_stats(self) -> None:
        """The engine's iteration stats into the metrics: the LLM yields one per iteration for as long as it steps,
        so the gauges are set from within the read, at most every STATS_PERIOD_S. A read ends after STATS_TIMEOUT_S
        without an iteration, and then, as upstream's IterationResult is one object made done by that timeout
        (NVIDIA/TensorRT-LLM/tensorrt_llm/executor/result.py@a678b91a, executor.py@ed53795b), every later read ends
        at once until the next request is submitted: a pause of the engine while requests run (a long prefill)
        leaves the gauges at the last iteration until then. So the request gauges read 0 only once the model holds
        no request (the last iteration may have counted a request aborted in it, and no later one comes to say it
        is gone), and a drain also reads the model's own count (`in_flight`)."""
        assert self.metrics is not None
        loop = asyncio.get_running_loop()
        last: dict[str, Any] | None = None
        while not self._shutdown.is_set():
            set_at = 0.0
            try:
                async for stats in self.llm.get_stats_async(STATS_TIMEOUT_S):
                    last = stats
                    if loop.time() - set_at >= STATS_PERIOD_S:
                        self.metrics.update_from_iteration(stats)
                        set_at = loop.time()
            except Exception as e:  # noqa: BLE001 - the metrics go stale; requests are not affected
                pb_utils.Logger.log_warn(f"[trtllm] could not read the engine's stats: {type(e).__name__}: {e}")
                await asyncio.sleep(STATS_TIMEOUT_S)
                continue
            if last is not None:
                with self._lock:
                    holding = bool(self._live)
                self.metrics.update_from_iteration(last if holding else idle_iteration(last))
            await asyncio.sleep(STATS_PERIOD_S)

    async def _read_kv_events(self) -> None:
        """The engine's KV-cache events into `kv_events`, as they come."""
        assert self.kv_events is not None
        while not self._shutdown.is_set():
            try:
                async for event in self.llm.get_kv_cache_events_async(STATS_TIMEOUT_S):
                    self.kv_events.append(event)
            except Exception as e:  # noqa: BLE001 - routers see no new events; requests are not affected
                pb_utils.Logger.log_warn(f"[trtllm] could not read the KV-cache events: {type(e).__name__}: {e}")
                await asyncio.sleep(STATS_TIMEOUT_S)
            await asyncio.sleep(STATS_PERIOD_S)

    def _cancellation_loop(self) -> None:
        """Upstream's: every cancellation_check_period_ms, abort the requests whose client cancelled."""
        while not self._shutdown.wait(self.check_period_s):
            with self._lock:
                live = list(self._live.values())
            for entry in live:
                if entry.client_cancelled():
                    self._abort(entry)

    def finalize(self) -> None:
        """Tritonserver unloads the model: as upstream's does, it first awaits the requests in flight, then shuts
        the LLM down. Why wait here: tritonserver counts a decoupled python model's request done once `execute`
        returned, so at its stop it unloads the model while generations still stream; the model's own wait is
        what lets them end. The cancellation loop runs on meanwhile (a client gone still frees its slot)."""
        with self._lock:
            while self._live:
                pb_utils.Logger.log_info(f"[trtllm] Awaiting remaining {len(self._live)} requests")
                self._ended.wait(AWAIT_LOG_S)
        self._shutdown.set()
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=5)
        self._cancel_thread.join(timeout=5)
        if self.metrics is not None:
            self.metrics.release()
        self.in_flight.release()
