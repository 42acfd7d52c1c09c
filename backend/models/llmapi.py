"""The CPU engine's `tensorrt_llm` model on the llmapi workflow: TensorRT-LLM's LLM API model
(`triton_backend/all_models/llmapi/tensorrt_llm/1/model.py`) with its inputs, outputs and semantics
(backend/models/llmapi_io.py), in front of the CPU engine's leader node instead of `tensorrt_llm.LLM`.

As upstream: `model.yaml` (or `$LLM_CONFIG_PATH`, relative to the model version folder) holds the LLM API
arguments and `triton_config` (decoupled, cancellation_check_period_ms); every response goes through the
request's response sender; a `stop` request cancels the requests of its request id ("A request id must be
provided for request cancellation" without one; CANCELLED "Request cancelled by client" always, for ids not
running too); a thread polls `is_cancelled()` every cancellation_check_period_ms and aborts what the client gave
up; any error of a request ends it with "Error generating request: ..." and `text_output` "N/A".

The engine is reached as TensorRT-LLM reaches its MPI session under `trtllm-llmapi-launch`: through the leader
node at `TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR` (backend/cpu_engine/llmapi/protocol.py); `TLLM_SPAWN_PROXY_PROCESS=1`
is required. Request ids: each request gets an internal id (the engine's); the client's id maps to the latest.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from backend.cpu_engine.llmapi import protocol as p
from backend.models.llmapi_io import (
    FINISH_REASONS,
    Completion,
    InputError,
    LlmRequest,
    cut_stop_string,
    is_stop,
    parse_request,
    response_arrays,
)
from backend.models.tokenizer import TextTokenizer, load_tokenizer
from backend.refusals import CPU_CONTEXT
from launcher.contracts.llmapi import CANCELLATION_CHECK_PERIOD_MS, LLM_CONFIG_PATH_VAR, MODEL_YAML

pb_utils: Any = None  # triton_python_backend_utils, set in initialize() (it exists only inside the stub)

CANCELLED = "Request cancelled by client"
NO_REQUEST_ID = "A request id must be provided for request cancellation"
LEADER_GONE = "the CPU engine's leader node is gone (its process exited or the connection broke)"
#: how often finalize says how many requests it still awaits (upstream logs it every second)
AWAIT_LOG_S = 1.0


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


@dataclass
class _Live:
    """A request in the engine: what its responses need, and a flag so that exactly one final is sent."""

    internal_id: str
    request: Any
    sender: Any
    params: LlmRequest
    prompt_ids: list[int]
    stop_words: list[list[int]]
    user_id: str
    output_ids: list[int] = field(default_factory=list)
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
        TRITONBACKEND_ResponseFactoryIsCancelled, measured with 200 requests at once on a unary model). A
        request whose client is gone counts as cancelled."""
        with self.lock:
            if self.done:
                return False
            try:
                return bool(self.request.is_cancelled())
            except Exception:  # noqa: BLE001
                return True


class TritonPythonModel:
    """Upstream's llmapi model contract over the CPU engine's leader node."""

    def initialize(self, args: dict[str, Any]) -> None:
        global pb_utils
        import triton_python_backend_utils as _pb

        pb_utils = _pb
        config = json.loads(args["model_config"])
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        llm_args = read_model_yaml(model_dir)
        triton_config = llm_args.pop("triton_config", None) or {}
        self.decoupled = bool(triton_config.get("decoupled", pb_utils.using_decoupled_model_transaction_policy(config)))
        period_ms = triton_config.get("cancellation_check_period_ms", CANCELLATION_CHECK_PERIOD_MS)
        self.check_period_s = float(period_ms) / 1000
        self.channel = p.connect(p.endpoint())
        self.channel.send(p.Load(llm_args))
        reply = self.channel.recv()
        if not isinstance(reply, p.Loaded):
            raise pb_utils.TritonModelException(f"the CPU engine could not load the model: {reply.error}")
        self.info: p.Loaded = reply
        self.tokenizer: TextTokenizer = load_tokenizer(llm_args.get("tokenizer") or reply.model)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # a request left `_live` (finalize awaits them)
        self._live: dict[str, _Live] = {}
        self._by_user: dict[str, set[str]] = {}
        self._broken: str | None = None
        self._shutdown = threading.Event()
        self._threads = [
            threading.Thread(target=self._read_outputs, name="llmapi-outputs", daemon=True),
            threading.Thread(target=self._cancellation_loop, name="llmapi-cancel", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        pb_utils.Logger.log_info(
            f"[trtllm] CPU engine: {reply.model} ({reply.family}, tp {reply.tp_size}, batch {reply.max_batch_size}, "
            f"max_seq_len {reply.max_seq_len}); LLM API arguments without effect here: {', '.join(reply.ignored) or 'none'}"
        )

    # ------------------------------------------------------------------ requests
    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self._execute_one(request)
        return None

    @staticmethod
    def _inputs(request: Any) -> dict[str, np.ndarray]:
        return {t.name(): t.as_numpy() for t in request.inputs()}

    def _execute_one(self, request: Any) -> None:
        sender = request.get_response_sender()
        try:
            inputs = self._inputs(request)
            if is_stop(inputs):
                self._stop(request, sender)
                return
            params = parse_request(inputs)
            if params.streaming and not self.decoupled:
                raise InputError("Streaming is only supported in decoupled mode.")
            if self._broken:
                raise RuntimeError(self._broken)
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

    def _submit(self, request: Any, sender: Any, params: LlmRequest) -> None:
        prompt_ids = self.tokenizer.encode(params.prompt)
        if not prompt_ids:
            raise InputError("input 'text_input' has no tokens: send some text")
        if len(prompt_ids) >= self.info.max_seq_len:
            raise InputError(
                f"input 'text_input': the prompt has {len(prompt_ids)} tokens but {CPU_CONTEXT} is "
                f"{self.info.max_seq_len} tokens (prompt + new tokens); shorten the prompt"
            )
        stop_words = [self.tokenizer.encode(s, add_special_tokens=False) for s in params.stop]
        internal_id = str(next(self._ids))
        live = _Live(internal_id, request, sender, params, prompt_ids, stop_words, request.request_id() or "")
        with self._lock:
            self._live[internal_id] = live
            if live.user_id:
                self._by_user[live.user_id] = {internal_id}
        sampling = replace(params.sampling, end_id=self.tokenizer.end_id, stop_words=stop_words)
        try:
            self.channel.send(p.Submit(internal_id, prompt_ids, sampling, params.streaming))
        except OSError as e:
            self._unregister(internal_id)
            raise RuntimeError(f"{LEADER_GONE}: {e}") from None

    def _unregister(self, internal_id: str) -> _Live | None:
        with self._lock:
            live = self._live.pop(internal_id, None)
            self._ended.notify_all()
            if live is not None and live.user_id:
                ids = self._by_user.get(live.user_id)
                if ids is not None:
                    ids.discard(internal_id)
                    if not ids:
                        del self._by_user[live.user_id]
            return live

    def _abort(self, live: _Live) -> None:
        """Tell the engine to stop the request and end it CANCELLED here (the engine's own final is dropped)."""
        if not live.claim_final():
            return
        self._unregister(live.internal_id)
        try:
            self.channel.send(p.Abort(live.internal_id))
        except OSError:
            pass
        self._send_cancelled(live.sender)

    # ------------------------------------------------------------------ engine outputs
    def _read_outputs(self) -> None:
        """Turn the leader's outputs into responses until the connection closes."""
        while True:
            try:
                message = self.channel.recv()
            except (EOFError, OSError, p.ProtocolError) as e:
                if not self._shutdown.is_set():
                    self._fail_all(f"{LEADER_GONE}: {type(e).__name__}: {e}")
                return
            if isinstance(message, p.Output):
                self._on_output(message)

    def _on_output(self, out: p.Output) -> None:
        with self._lock:
            live = self._live.get(out.request_id)
        if live is None:  # aborted or cancelled: its final was sent already
            return
        live.output_ids.extend(out.new_tokens)
        if not out.finished:
            if live.params.streaming and not live.done:
                self._send_partial(live, Completion(self.tokenizer.decode(live.output_ids)))
            return
        if not live.claim_final():
            return
        self._unregister(out.request_id)
        if out.error or out.finish_reason == "error":
            self._send_error(live.sender, out.error or "the engine failed the request")
        elif out.finish_reason == "cancelled":
            self._send_cancelled(live.sender)
        else:
            self._send(live, self._completion(live, out), final=True)

    def _completion(self, live: _Live, out: p.Output) -> Completion:
        ids, stop_string = live.output_ids, None
        if out.finish_reason == "stop_words":
            ids, stop_string = cut_stop_string(ids, live.stop_words, live.params.stop)
        if not live.params.streaming and not live.params.exclude_input_from_output:
            ids = live.prompt_ids + ids
        perf = None
        if out.perf is not None:
            perf = dict(vars(out.perf))
        return Completion(
            text=self.tokenizer.decode(ids),
            finish_reason=FINISH_REASONS.get(out.finish_reason or "", out.finish_reason),
            stop_reason=stop_string,
            cumulative_logprob=out.cum_log_prob,
            perf=perf,
        )

    def _send_partial(self, live: _Live, completion: Completion) -> None:
        """A streamed response that is not the last: sent only while no final is claimed, under the lock that
        claims it. A final sent first (the client cancelled, the cancellation loop answered CANCELLED) has freed
        the request's response factory, and sending on it then crashes tritonserver (2.51: SIGSEGV in
        TRITONBACKEND_ResponseSend, measured by benchmarks/soak.py with streams closed by their client)."""
        with live.lock:
            if not live.done:
                self._send(live, completion, final=False)

    def _send(self, live: _Live, completion: Completion, final: bool) -> None:
        arrays = response_arrays(completion, live.params)
        response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in arrays.items()])
        try:
            live.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception:  # noqa: BLE001 - the client is gone: the cancellation loop aborts the request
            pass

    def _fail_all(self, reason: str) -> None:
        self._broken = reason
        with self._lock:
            ids = list(self._live)
        for internal_id in ids:
            live = self._unregister(internal_id)
            if live is not None and live.claim_final():
                self._send_error(live.sender, reason)

    # ------------------------------------------------------------------ cancellation
    def _cancellation_loop(self) -> None:
        """Upstream's: every cancellation_check_period_ms, abort the requests whose client cancelled."""
        while not self._shutdown.wait(self.check_period_s):
            with self._lock:
                live = list(self._live.values())
            for entry in live:
                if entry.client_cancelled():
                    self._abort(entry)

    def finalize(self) -> None:
        """Tritonserver unloads the model: as upstream's does, it first awaits the requests in flight, then stops
        the leader node. Why wait here: tritonserver counts a decoupled python model's request done once
        `execute` returned, so at its stop it unloads the model while generations still stream (tritonserver
        2.51: `nv_inference_request_success` is 1 a second into a 200-token stream); the model's own wait is
        what lets them end. The cancellation loop runs on meanwhile (a client gone still frees its slot)."""
        with self._lock:
            while self._live and self._broken is None:
                pb_utils.Logger.log_info(f"[trtllm] Awaiting remaining {len(self._live)} requests")
                self._ended.wait(AWAIT_LOG_S)
        self._shutdown.set()
        try:
            self.channel.send(p.Shutdown())
        except OSError:
            pass
        self._fail_all("the model is being unloaded")
        for thread in self._threads:
            thread.join(timeout=5)
        self.channel.close()
