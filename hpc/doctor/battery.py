"""`hpc-serve doctor --serve`'s battery: fixed requests to a READY replica's llmapi `tensorrt_llm` model, straight
through Triton's gRPC as NVIDIA's llmapi clients send them (`text_input`, `sampling_param_*`, `streaming`), one
`Check` each with what it measured.

The checks: a unary answer; a streamed one (more than one event, the first before the last); a stop string taken
from a first greedy answer ends a second answer before it; `ignore_eos` makes exactly the tokens asked (counted
with the model's tokenizer where the checkpoint is readable here); a client that leaves mid-stream frees the engine
(its metrics' in-flight count back to 0) and the replica answers on; 16 requests at once; bad values refused with
an error naming the input, the replica serving on; the engine's `nv_trt_llm_*` metric families on the metrics
page. What only hpc-serve's model has (`sampling_param_ignore_eos`, engine metrics) is a skip on the image's model,
and a stop string is expected to fail there (upstream's helpers hand the strings to the tokenizer as bytes).

The verdicts are pure functions of what was measured (`*_verdict`), so they are tested without a replica.
"""

from __future__ import annotations

import math
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backend.models.tokenizer import TextTokenizer
from hpc.doctor.report import Check, fail, ok, skip, warn
from hpc.serving.abandon import infer_inputs
from hpc.serving.auth import grpc_headers
from hpc.serving.metrics import scrape
from launcher.contracts import model_names
from launcher.contracts.llmapi import IMAGE_MODEL
from launcher.contracts.prometheus import ENGINE_KV_CACHE_FAMILY, ENGINE_REQUEST_FAMILY, samples
from launcher.contracts.records import EndpointRecord
from launcher.contracts.renew_plan import active_requests

#: upstream's test prompt (triton_backend's test_llmapi_cancel.py), and the ones of the other checks
PROMPT = "The current time is"
COUNT_PROMPT = "Hello, my name is"
#: how long one request may take: a first request on a GPU compiles kernels, a CPU engine is slower per token
REQUEST_TIMEOUT_S = 120.0
#: tokens asked of the streamed answer, the stop-string answers and the fixed-length one
STREAM_TOKENS, STOP_TOKENS, FIXED_TOKENS = 32, 32, 24
#: the answer a client leaves: long enough to be still generating when it leaves
LEFT_TOKENS = 512
#: a client leaves once the engine's gauges show its request, or after this many responses (an engine faster than
#: the gauges' 0.2 s reading period may have made the whole answer by then), reading them every GAUGE_POLL_S
LEAVE_EVENTS, GAUGE_POLL_S = 64, 0.05
#: requests sent at once
CONCURRENT = 16
#: how long a left request may hold the engine before the check fails
IDLE_WAIT_S = 30.0
#: the engine families the metrics page must have (the ordered stop's drain reads the first)
ENGINE_FAMILIES = (ENGINE_REQUEST_FAMILY, ENGINE_KV_CACHE_FAMILY)
#: what a fix says when the cause is in the replica: its log
SEE_LOG = "read rank 0's log (`hpc-serve logs JOB`, kept in the job folder) for the model's error"
#: how the model's errors begin (backend/models/llmapi.py, as upstream's)
MODEL_ERROR = "Error generating request: "
USE_OURS = "use hpc-serve's model (model.llmapi_model: hpc-serve, the default), which takes stop strings as text"
#: what a failed row of hpc-serve's model adds where the image's model.py can serve (backend tensorrtllm): our
#: model has met TensorRT-LLM only through the CPU stand-in so far (docs/compatibility.md), the image's is NVIDIA's
TRY_IMAGE = (
    "hpc-serve's model has been run over the CPU stand-in of TensorRT-LLM only so far: if the image's model passes "
    "this row (`hpc-serve doctor SPEC --serve --models both`), serve it meanwhile with model.llmapi_model: image, "
    "and report this row"
)

Tensors = dict[str, tuple[np.ndarray, str]]


@dataclass
class Answer:
    """What one request brought back: the last text (cumulative, as the model sends it), why it ended, its error,
    how many responses carried text, when the first and the last came (seconds after sending), and whether the
    client left before the end."""

    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    events: int = 0
    first_s: float | None = None
    total_s: float = 0.0
    left: bool = False


def scalar(value: Any, triton: str) -> tuple[np.ndarray, str]:
    dtype = {"BOOL": bool, "INT32": np.int32, "FP32": np.float32}[triton]
    return np.array([value], dtype=dtype), triton


def request(
    prompt: str,
    max_tokens: int,
    *,
    streaming: bool | None = None,
    greedy: bool = False,
    exclude_input: bool = False,
    reasons: bool = False,
    stop: Sequence[str] = (),
    ignore_eos: bool | None = None,
    temperature: float | None = None,
) -> Tensors:
    """The tensors of one request, named and typed as upstream's llmapi model takes them; only what is asked for
    is sent (the unary check sends `text_input` and `sampling_param_max_tokens` alone, as llmapi_client.py)."""
    arrays: Tensors = {
        "text_input": (np.array([prompt.encode()], dtype=object), "BYTES"),
        "sampling_param_max_tokens": scalar(max_tokens, "INT32"),
    }
    if streaming is not None:
        arrays["streaming"] = scalar(streaming, "BOOL")
    if greedy:
        arrays["sampling_param_top_k"] = scalar(1, "INT32")
    if exclude_input:
        arrays["sampling_param_exclude_input_from_output"] = scalar(True, "BOOL")
    if reasons:
        arrays["return_finish_reason"] = scalar(True, "BOOL")
        arrays["return_stop_reason"] = scalar(True, "BOOL")
    if stop:
        arrays["sampling_param_stop"] = (np.array([s.encode() for s in stop], dtype=object), "BYTES")
    if ignore_eos is not None:
        arrays["sampling_param_ignore_eos"] = scalar(ignore_eos, "BOOL")
    if temperature is not None:
        arrays["sampling_param_temperature"] = scalar(temperature, "FP32")
    return arrays


def _string(result: Any, name: str) -> str | None:
    """The first element of a BYTES output as text; None when absent or "None" (the model sends `str(value)`)."""
    try:
        array = result.as_numpy(name)
    except Exception:  # noqa: BLE001 - an output this response lacks
        return None
    if array is None or array.size == 0:
        return None
    value = array.reshape(-1)[0]
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
    return None if text == "None" else text


class Replica:
    """One READY replica's `tensorrt_llm` model, over tritonclient's gRPC client with the deployment's token."""

    def __init__(self, endpoint: EndpointRecord, token: str | None) -> None:
        self.endpoint = endpoint
        self.headers = grpc_headers(token)
        self.decoupled = endpoint.decoupled
        self._ids = iter(range(1, 1 << 30))
        self._lock = threading.Lock()

    def _request_id(self) -> str:
        with self._lock:
            return f"hpc-serve-doctor-{next(self._ids)}"

    def ask(
        self, tensors: Tensors, leave: Callable[[Answer], bool] | None = None, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> Answer:
        """Send one request and read its answer. A decoupled model is asked over a gRPC stream (as tritonserver
        requires), a unary one with one call. `leave(answer)`, asked after each response: True closes the stream
        there (the gRPC call cancelled: a client gone)."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(self.endpoint.grpc_url)
        answer = Answer()
        start = time.monotonic()
        try:
            if not self.decoupled:
                try:
                    result = client.infer(
                        model_names.TENSORRT_LLM,
                        infer_inputs(tensors),
                        request_id=self._request_id(),
                        headers=self.headers,
                        client_timeout=timeout_s,
                    )
                except InferenceServerException as exc:
                    answer.error = exc.message() or str(exc)
                else:
                    self._read(answer, result, start)
                answer.total_s = time.monotonic() - start
                return answer
            return self._stream(client, tensors, answer, start, leave, timeout_s)
        finally:
            client.close()

    def _stream(
        self,
        client: Any,
        tensors: Tensors,
        answer: Answer,
        start: float,
        leave: Callable[[Answer], bool] | None,
        timeout_s: float,
    ) -> Answer:
        results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)), headers=self.headers)
        cancel = False
        try:
            client.async_stream_infer(
                model_names.TENSORRT_LLM,
                infer_inputs(tensors),
                request_id=self._request_id(),
                enable_empty_final_response=True,
            )
            deadline = start + timeout_s
            while True:
                try:
                    result, error = results.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    answer.error = f"no answer within {timeout_s:g} s"
                    cancel = True
                    break
                if error is not None:
                    answer.error = error.message() if hasattr(error, "message") else str(error)
                    break
                final = result.get_response().parameters["triton_final_response"].bool_param
                self._read(answer, result, start)
                if final:
                    break
                if leave is not None and leave(answer):
                    answer.left = cancel = True
                    break
        finally:
            answer.total_s = time.monotonic() - start
            client.stop_stream(cancel_requests=cancel)
        return answer

    @staticmethod
    def _read(answer: Answer, result: Any, start: float) -> None:
        text = _string(result, "text_output")
        if text is None:
            return  # the empty final response
        answer.events += 1
        answer.total_s = time.monotonic() - start
        if answer.first_s is None:
            answer.first_s = answer.total_s
        answer.text = text
        answer.finish_reason = _string(result, "finish_reason") or answer.finish_reason
        answer.stop_reason = _string(result, "stop_reason") or answer.stop_reason

    def in_flight(self) -> int | None:
        """Requests in the engine and tritonserver's queues, from the metrics page (None: no engine gauges)."""
        return active_requests(scrape(self.endpoint.metrics_url))

    def families(self) -> set[str]:
        return {s.family or s.name for s in samples(scrape(self.endpoint.metrics_url))}


@dataclass
class Battery:
    """What the checks know of the replica: its model (hpc-serve's or the image's) and the tokenizer of its
    checkpoint (None when it cannot be read here), and `label` for the rows (the model, when both are run)."""

    replica: Replica
    model: str
    tokenizer: TextTokenizer | None = None
    tokenizer_note: str = ""
    label: str = ""
    checks: list[Check] = field(default_factory=list)
    #: the spec's backend can serve the image's model.py instead (TensorRT-LLM): a failed row of ours says so
    image_selectable: bool = False

    @property
    def image(self) -> bool:
        return self.model == IMAGE_MODEL

    def name(self, check: str) -> str:
        return f"{self.label}: {check}" if self.label else check

    def run(self, say: Callable[[str], object] = print) -> list[Check]:
        """Every check, in order; an exception in one fails that check only (its row says what it was)."""
        for check, run in (
            ("unary", self.unary),
            ("streamed", self.streamed),
            ("stop string", self.stop_string),
            ("ignore_eos length", self.fixed_length),
            ("client gone", self.client_gone),
            (f"{CONCURRENT} concurrent", self.concurrent),
            ("bad request", self.bad_request),
            ("engine metrics", self.metrics),
        ):
            say(f"  {self.name(check)} ...")
            try:
                result = run()
            except Exception as exc:  # noqa: BLE001 - reported as this check's failure, the others still run
                result = fail(check, f"{type(exc).__name__}: {exc}", SEE_LOG)
            fix = result.fix
            if result.status == "fail" and not self.image and self.image_selectable:
                fix = f"{fix}; {TRY_IMAGE}" if fix else TRY_IMAGE
            self.checks.append(Check(self.name(check), result.status, result.detail, fix))
        return self.checks

    # ------------------------------------------------------------------ the checks
    def unary(self) -> Check:
        answer = self.replica.ask(request(PROMPT, 16))
        return unary_verdict(answer, PROMPT)

    def streamed(self) -> Check:
        if not self.replica.decoupled:
            return skip("streamed", "the model is not decoupled (triton.decoupled: false): it cannot stream")
        answer = self.replica.ask(request(PROMPT, STREAM_TOKENS, streaming=True, exclude_input=True))
        return streamed_verdict(answer, self.image)

    def stop_string(self) -> Check:
        ignore = None if self.image else True  # ours: a full answer to take the stop string from
        first = self.replica.ask(
            request(PROMPT, STOP_TOKENS, greedy=True, exclude_input=True, reasons=True, ignore_eos=ignore)
        )
        if first.error is not None or not first.text:
            return fail("stop string", f"the first (greedy) answer: {first.error or 'no text'}", SEE_LOG)
        stop = pick_stop(first.text, self.tokenizer)
        if stop is None:
            return fail(
                "stop string",
                f"no stop string to take from the first answer {first.text[:60]!r}",
                "run again; the prompt's answer had no piece to stop at",
            )
        second = self.replica.ask(
            request(PROMPT, STOP_TOKENS, greedy=True, exclude_input=True, reasons=True, ignore_eos=ignore, stop=[stop])
        )
        return stop_verdict(first.text, stop, second, self.image)

    def fixed_length(self) -> Check:
        if self.image:
            return skip("ignore_eos length", "the image's model has no sampling_param_ignore_eos input")
        answer = self.replica.ask(
            request(COUNT_PROMPT, FIXED_TOKENS, greedy=True, exclude_input=True, reasons=True, ignore_eos=True)
        )
        count = len(self.tokenizer.encode(answer.text, False)) if self.tokenizer and answer.error is None else None
        return length_verdict(answer, FIXED_TOKENS, count, self.tokenizer_note)

    def client_gone(self) -> Check:
        if not self.replica.decoupled:
            return skip("client gone", "the model is not decoupled (triton.decoupled: false): no stream to leave")
        gauges = self.replica.in_flight() is not None
        seen, done = threading.Event(), threading.Event()

        def watch() -> None:  # the gauges, read beside the stream (not between its responses: that slows it)
            while not done.is_set():
                try:
                    if (self.replica.in_flight() or 0) >= 1:
                        seen.set()
                        return
                except OSError:
                    return
                done.wait(GAUGE_POLL_S)

        def leave(answer: Answer) -> bool:  # once the gauges show the request, or LEAVE_EVENTS responses in
            return answer.events >= 1 and (not gauges or seen.is_set() or answer.events >= LEAVE_EVENTS)

        if gauges:
            threading.Thread(target=watch, name="doctor-gauges", daemon=True).start()
        ignore = None if self.image else True
        try:
            left = self.replica.ask(request(PROMPT, LEFT_TOKENS, streaming=True, ignore_eos=ignore), leave=leave)
        finally:
            done.set()
        idle_s = self._idle_after() if gauges and left.left else None
        after = self.replica.ask(request(PROMPT, 8))
        return gone_verdict(left, gauges, seen.is_set(), idle_s, after)

    def _idle_after(self) -> float | None:
        """Seconds until the engine holds nothing (None: not within IDLE_WAIT_S)."""
        start = time.monotonic()
        while time.monotonic() - start < IDLE_WAIT_S:
            if self.replica.in_flight() == 0:
                return time.monotonic() - start
            time.sleep(0.1)
        return None

    def concurrent(self) -> Check:
        answers: list[Answer | None] = [None] * CONCURRENT

        def one(i: int) -> None:
            try:
                answers[i] = self.replica.ask(request(f"{PROMPT} {i}", 16))
            except Exception as exc:  # noqa: BLE001 - counted as an unanswered request
                answers[i] = Answer(error=f"{type(exc).__name__}: {exc}")

        start = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(CONCURRENT)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(REQUEST_TIMEOUT_S + 10)
        return concurrent_verdict(answers, time.monotonic() - start)

    def bad_request(self) -> Check:
        refusals = [
            ("sampling_param_max_tokens", self.replica.ask(request(PROMPT, 0))),
            ("sampling_param_temperature", self.replica.ask(request(PROMPT, 8, temperature=math.nan))),
        ]
        after = self.replica.ask(request(PROMPT, 8))
        return bad_request_verdict(refusals, after, self.image)

    def metrics(self) -> Check:
        return metrics_verdict(self.replica.families(), self.image)


# ---------------------------------------------------------------------- verdicts
def _secs(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"


def unary_verdict(answer: Answer, prompt: str) -> Check:
    """Answered with text beyond the prompt (the model echoes the prompt unless asked not to)."""
    if answer.error is not None:
        return fail("unary", f"refused: {answer.error}", SEE_LOG)
    made = answer.text[len(prompt) :] if answer.text.startswith(prompt) else answer.text
    if not made:
        return fail("unary", f"an answer without generated text: {answer.text[:80]!r}", SEE_LOG)
    return ok("unary", f"{len(made)} characters in {_secs(answer.total_s)}: {made[:40]!r}")


def streamed_verdict(answer: Answer, image: bool) -> Check:
    """More than one response, the first before the last: the answer streamed."""
    if answer.error is not None:
        return fail("streamed", f"refused: {answer.error}", SEE_LOG)
    found = f"{answer.events} events, first after {_secs(answer.first_s)} of {_secs(answer.total_s)}"
    if answer.events > 1 and answer.first_s is not None and answer.first_s < answer.total_s:
        return ok("streamed", found)
    fix = (
        "known upstream defect: the image's model.py passes `streaming` positionally into generate_async's "
        "lora_request: the whole answer in one event; use hpc-serve's model (model.llmapi_model: hpc-serve)"
        if image
        else SEE_LOG
    )
    return fail("streamed", f"{found}: not streamed", fix)


def pick_stop(text: str, tokenizer: TextTokenizer | None) -> str | None:
    """A stop string from a greedy answer: a piece after its start (so the answer stopped there still has text),
    seen there first. With the tokenizer, one token whose text tokenizes back to it (the engine matches a stop
    string's tokens), from the middle of the answer on; else a word with its leading space, then any word."""
    least = max(1, len(text) // 4)  # text enough before it to tell a stop from an empty answer
    if tokenizer is not None:
        ids = tokenizer.encode(text, False)
        for at in range(1, len(ids)):
            piece = tokenizer.decode([ids[at]], False)
            if (
                piece.strip()
                and "\ufffd" not in piece
                and text.find(piece) >= least
                and ids.index(ids[at]) == at
                and tokenizer.encode(piece, False) == [ids[at]]
            ):
                return piece
    for pattern in (r" [A-Za-z]{2,}", r"[A-Za-z0-9]+"):
        for match in re.finditer(pattern, text):
            if match.start() >= least and text.index(match.group()) == match.start():
                return match.group()
    return None


def stop_verdict(first: str, stop: str, second: Answer, image: bool) -> Check:
    """The second answer ends before the stop string (finish reason stop): a prefix of the first, without it."""
    if second.error is not None:
        if image:
            return warn(
                "stop string",
                f"known upstream failure: the image's model hands sampling_param_stop to the tokenizer as bytes: "
                f"{second.error[:200]}",
                USE_OURS,
            )
        return fail("stop string", f"stop {stop!r} refused: {second.error}", SEE_LOG)
    found = (
        f"stop {stop!r} (at {first.index(stop) if stop in first else '?'} of {len(first)} characters): "
        f"{len(second.text)} characters, finish reason {second.finish_reason}"
    )
    if second.finish_reason == "stop" and stop not in second.text and first.startswith(second.text):
        return ok("stop string", found)
    return fail("stop string", f"{found}: {second.text[:60]!r} did not end before it", SEE_LOG)


def length_verdict(answer: Answer, asked: int, counted: int | None, note: str = "") -> Check:
    """ignore_eos: the engine ended at the length asked (finish reason length), and the text is that many tokens
    by the model's tokenizer. A text with a character cut mid-way (U+FFFD: the engine decoded a token that is part
    of a character) cannot be counted back into the engine's tokens: it is reported, not counted."""
    name = "ignore_eos length"
    if answer.error is not None:
        return fail(name, f"refused: {answer.error}", SEE_LOG)
    found = f"{asked} tokens asked, finish reason {answer.finish_reason}"
    if answer.finish_reason != "length":
        return fail(name, f"{found}: the answer ended before its length", SEE_LOG)
    if counted is None:
        return ok(name, f"{found}; not counted ({note or 'no tokenizer here'})")
    if "\ufffd" in answer.text:
        return ok(name, f"{found}; not counted: the text has characters cut mid-way (U+FFFD)")
    if counted == asked:
        return ok(name, f"{found}, {counted} made (the model's tokenizer)")
    return fail(name, f"{found}, but the text is {counted} tokens (the model's tokenizer)", SEE_LOG)


def gone_verdict(left: Answer, gauges: bool, seen: bool, idle_s: float | None, after: Answer) -> Check:
    """The client left mid-stream; the engine idle again (its gauges at 0), and the replica answers on. `seen`:
    the gauges showed the request before the client left (else it was shorter than their reading period)."""
    name = "client gone"
    if left.error is not None:
        return fail(name, f"the stream failed before the client left: {left.error}", SEE_LOG)
    if not left.left:
        return fail(
            name,
            f"the answer ended ({left.events} events, {_secs(left.total_s)}) before the client could leave",
            "the model answered in one response: a streamed answer is needed to leave it; " + SEE_LOG,
        )
    found = f"left after {left.events} events ({_secs(left.total_s)})"
    if after.error is not None or not after.text:
        return fail(name, f"{found}; the next request: {after.error or 'no text'}", SEE_LOG)
    if not gauges:
        return ok(name, f"{found}; answers after (the model exports no engine gauges: idleness not measured)")
    if idle_s is None:
        return fail(
            name,
            f"{found}; the engine still held a request {IDLE_WAIT_S:g} s later (metrics' active + waiting)",
            "the model does not abort a request whose client left: " + SEE_LOG,
        )
    unseen = "" if seen else " (its gauges never showed the request: shorter than their 0.2 s reading period)"
    return ok(name, f"{found}; engine idle {_secs(idle_s)} later{unseen}; answers after")


def concurrent_verdict(answers: Sequence[Answer | None], wall_s: float) -> Check:
    name = f"{CONCURRENT} concurrent"
    good = [a for a in answers if a is not None and a.error is None and a.text]
    found = f"{len(good)}/{len(answers)} answered in {_secs(wall_s)}"
    if len(good) == len(answers):
        return ok(name, found)
    errors = sorted(
        {(a.error or "no text") if a is not None else "no answer in time" for a in answers if a not in good}
    )
    return fail(name, f"{found}; {'; '.join(e[:120] for e in errors[:3])}", SEE_LOG)


def bad_request_verdict(refusals: Sequence[tuple[str, Answer]], after: Answer, image: bool) -> Check:
    """Each bad value refused with an error naming its input; then the replica still answers."""
    name = "bad request"
    served = [f"{name_}: answered" for name_, a in refusals if a.error is None]
    if served:
        return fail(name, "; ".join(served) + " instead of an error", SEE_LOG)
    if after.error is not None or not after.text:
        return fail(name, f"the request after them: {after.error or 'no text'}", SEE_LOG)
    unnamed = [n for n, a in refusals if n not in (a.error or "")]
    found = "; ".join((a.error or "").removeprefix(MODEL_ERROR)[:100] for _, a in refusals)
    if not unnamed:
        return ok(name, f"{found}; answers after")
    if image:
        return warn(
            name,
            f"refused, but not naming {', '.join(unnamed)}: {found}; answers after",
            "the image's model's words; hpc-serve's model names the input",
        )
    return fail(name, f"the error does not name {', '.join(unnamed)}: {found}", SEE_LOG)


def metrics_verdict(families: set[str], image: bool) -> Check:
    name = "engine metrics"
    engine = sorted(f for f in families if f.startswith("nv_trt_llm_"))
    missing = [f for f in ENGINE_FAMILIES if f not in families]
    if not missing:
        return ok(name, ", ".join(engine))
    if image and not engine:
        return skip(name, "the image's model exports no nv_trt_llm_* metrics (hpc-serve's model does)")
    return fail(
        name,
        f"missing {', '.join(missing)} on the metrics page" + (f" (has {', '.join(engine)})" if engine else ""),
        "llm_api.enable_iter_perf_stats must not be false (hpc-serve writes it true): " + SEE_LOG,
    )
