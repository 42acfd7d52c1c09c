"""How a generation is asked of a replica's model and how its responses are read, per TensorRT-LLM workflow
(launcher/contracts/llmapi.py `WORKFLOWS`): the one place the gateway's and the client's requests take their
tensors from (hpc/serving/triton.py sends them).

- engine: the `ensemble` (tensorrtllm_backend's inflight_batcher_llm: `text_input`, `max_tokens`, `stream`,
  `stop_words`, ...). Each streamed response carries the new tokens' text as bytes, cut anywhere, even inside a
  character, so they are decoded incrementally; one response per token, so the responses count the tokens.
- llmapi: TensorRT-LLM's LLM API model `tensorrt_llm` (all_models/llmapi: `text_input`, `streaming`,
  `sampling_param_*`, `return_*`, with the request's perf metrics asked for). Each response carries the
  *cumulative* text of the generation (the LLM API's `CompletionOutput.text`), decoded by the engine, so a
  character still incomplete ends it as U+FFFD: the delta is what the text grew by, and a trailing U+FFFD is held
  back until a later response (or the final one) settles it. The engine leaves a stop string out of its final
  text (`include_stop_str_in_output` is False), after it may have streamed part of it: the final response's
  `stop_reason` names it, and it is put back, so the caller's stop rule (hpc/serving/text.py) cuts the same text
  on both workflows. The model returns no token counts and, with TensorRT-LLM 1.2.x's model.py, one response for
  a whole streamed request: its chunks' `tokens` is None, and callers count the text's.

Both ask for the prompt left out of the output, and always stream (hpc/serving/triton.py says why).
"""

from __future__ import annotations

import codecs
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import tritonclient.grpc as grpcclient

from hpc.serving.abandon import infer_inputs
from launcher.contracts import model_names
from launcher.contracts.llmapi import ENGINE, IMAGE_MODEL, LLMAPI, PERF_OUTPUTS

#: what an engine whose text is not settled yet ends its cumulative text with (a character cut mid-way)
REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class Chunk:
    """What one response of the stream brought: its text (maybe empty: a character held back until its last
    byte comes), how many tokens it carried (one per response of a streaming engine step; None from a model
    that does not count them: the caller counts the text's), their log probabilities when asked for
    (`output_log_probs`: a streaming response carries the new tokens' only), and on the last response of a
    model that says so, why the generation ended (OpenAI's "stop" or "length")."""

    text: str
    tokens: int | None
    logprobs: tuple[float, ...] = ()
    finish_reason: str | None = None
    #: the llmapi model's perf metrics of the request, on its last response (backend/models/llmapi_io.py
    #: PERF_OUTPUTS: KV-cache blocks reused and missed, the engine's timestamps)
    perf: Mapping[str, float] | None = None


@dataclass(frozen=True)
class GenerateParams:
    """What the model is asked for; `None` leaves the model's default."""

    prompt: str
    max_tokens: int
    stop: Sequence[str] = field(default_factory=tuple)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    #: beam search's length penalty (TensorRT-LLM's SamplingParams.length_penalty): no effect on one beam
    length_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False  # generate max_tokens whatever the model's end token says (benchmarks' fixed lengths)
    logprobs: bool = False  # ask for the chosen tokens' log probabilities (the ensemble's `return_log_probs`)


class NotTaken(ValueError):
    """The replica's model takes no input for a parameter the request set; `param` names it."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"{param}: {why}")
        self.param = param


class Decoder(Protocol):
    """Reads one request's responses in order: `feed` gives each response's Chunk, or None for a response
    without text; `final` is set on the last one. `feed_many`: several responses that were all waiting when the
    reader came (it fell behind the replica), as one Chunk: their texts joined, their tokens summed."""

    def feed(self, infer_response: Any, final: bool) -> Chunk | None: ...

    def feed_many(self, infer_responses: Sequence[Any], final: bool) -> Chunk | None: ...


def merged(chunks: Sequence[Chunk | None]) -> Chunk | None:
    """Consecutive Chunks of one stream as one (None for none with text or tokens): texts and log probabilities
    joined, tokens summed (None if one is uncounted), the last finish reason and perf metrics."""
    found = [c for c in chunks if c is not None]
    if len(found) <= 1:
        return found[0] if found else None
    counts = [c.tokens for c in found]
    return Chunk(
        "".join(c.text for c in found),
        None if None in counts else sum(c for c in counts if c is not None),
        tuple(v for c in found for v in c.logprobs),
        next((c.finish_reason for c in reversed(found) if c.finish_reason), None),
        next((c.perf for c in reversed(found) if c.perf), None),
    )


class ModelIO(Protocol):
    """A workflow's generation model: its name, its request tensors, its response decoder and its stop request."""

    model: str

    def tensors(self, params: GenerateParams) -> list[grpcclient.InferInput]: ...

    def decoder(self, params: GenerateParams) -> Decoder: ...

    def stop_tensors(self) -> list[grpcclient.InferInput]: ...


def _scalar(value: Any, dtype: Any, triton: str, batched: bool) -> tuple[np.ndarray, str]:
    return np.array([[value]] if batched else [value], dtype=dtype), triton


class EnsembleIO:
    """The engine workflow's `ensemble` (module docstring)."""

    model = model_names.ENSEMBLE

    def tensors(self, params: GenerateParams) -> list[grpcclient.InferInput]:
        arrays: dict[str, tuple[np.ndarray, str]] = {
            "text_input": (np.array([[params.prompt.encode()]], dtype=object), "BYTES"),
            "max_tokens": _scalar(params.max_tokens, np.int32, "INT32", True),
            "stream": _scalar(True, bool, "BOOL", True),
            "exclude_input_in_output": _scalar(True, bool, "BOOL", True),
        }
        if params.stop:
            arrays["stop_words"] = (np.array([[s.encode() for s in params.stop]], dtype=object), "BYTES")
        for name, dtype, triton in _SAMPLING:
            if (value := getattr(params, name)) is not None:
                arrays[name] = _scalar(value, dtype, triton, True)
        if params.ignore_eos:  # no token is the end: TensorRT-LLM's executor takes end_id -1 so (the LLM API's too)
            arrays["end_id"] = _scalar(-1, np.int32, "INT32", True)
        if params.logprobs:
            arrays["return_log_probs"] = _scalar(True, bool, "BOOL", True)
        return infer_inputs(arrays)

    def decoder(self, params: GenerateParams) -> Decoder:
        return _BytesDecoder(params.logprobs)

    def stop_tensors(self) -> list[grpcclient.InferInput]:
        """The engine model's required inputs (a one-token placeholder) and `stop` (hpc/serving/abandon.py)."""
        return infer_inputs(
            {
                "input_ids": (np.array([[0]], dtype=np.int32), "INT32"),
                "input_lengths": _scalar(1, np.int32, "INT32", True),
                "request_output_len": _scalar(1, np.int32, "INT32", True),
                "stop": _scalar(True, bool, "BOOL", True),
            }
        )


#: GenerateParams' sampling fields: (name, numpy dtype, Triton dtype), the ensemble's inputs of these names, the
#: llmapi model's `sampling_param_<name>`
_SAMPLING = (
    ("temperature", np.float32, "FP32"),
    ("top_p", np.float32, "FP32"),
    ("top_k", np.int32, "INT32"),
    ("seed", np.uint64, "UINT64"),
    ("presence_penalty", np.float32, "FP32"),
    ("frequency_penalty", np.float32, "FP32"),
    ("repetition_penalty", np.float32, "FP32"),
    ("length_penalty", np.float32, "FP32"),
    ("min_tokens", np.int32, "INT32"),
)
#: what the image's llmapi model (NVIDIA's model.py and helpers.py) cannot take that hpc-serve's can, and why
#: (hpc-serve's model's own inputs: backend/models/llmapi_io.py OWN_INPUTS)
IMAGE_MODEL_LACKS = {
    "stop": "the image's llmapi model passes stop strings to the tokenizer as bytes, which it refuses (TensorRT-LLM "
    "helpers.py); serve hpc-serve's model (spec model.llmapi_model: hpc-serve) for stop strings",
    **{
        name: f"the image's llmapi model has no {name} input; serve hpc-serve's model (spec model.llmapi_model: "
        "hpc-serve) for it"
        for name in ("ignore_eos", "min_tokens", "repetition_penalty", "length_penalty", "logprobs")
    },
}


#: the values of those that ask for nothing (no effect, or none on one beam), which benchmark clients send as they
#: are (vLLM's completions: `repetition_penalty: 1.0`): not refused, and not sent to the image's model, which has
#: no input for them; so are no stop strings, `ignore_eos` and `logprobs` false
NEUTRAL = {"min_tokens": 0, "repetition_penalty": 1.0, "length_penalty": 1.0}


def _asks(name: str, value: Any) -> bool:
    """`value` of parameter `name` asks the model for something."""
    if name == "stop" or isinstance(value, bool):
        return bool(value)
    return value is not None and value != NEUTRAL.get(name)


class _BytesDecoder:
    """The ensemble's responses: text bytes of the new tokens, decoded across responses."""

    def __init__(self, logprobs: bool) -> None:
        self.logprobs = logprobs
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, infer_response: Any, final: bool) -> Chunk | None:
        piece = text_and_logprobs(infer_response, self.logprobs)
        text = self.utf8.decode(piece[0], final=final) if piece is not None else ""
        if piece is None and not (final and (text := self.utf8.decode(b"", final=True))):
            return None
        return Chunk(text, 1 if piece is not None else 0, piece[1] if piece is not None else ())

    def feed_many(self, infer_responses: Sequence[Any], final: bool) -> Chunk | None:
        last = len(infer_responses) - 1
        return merged([self.feed(r, final and i == last) for i, r in enumerate(infer_responses)])


class LlmapiIO:
    """The llmapi workflow's `tensorrt_llm` model (module docstring)."""

    model = model_names.TENSORRT_LLM

    def __init__(self, streaming: bool = True, own_inputs: bool = True) -> None:
        #: False for a model that is not decoupled: it refuses `streaming` ("Streaming is only supported in
        #: decoupled mode.") and answers each request with one response, the whole text
        self.streaming = streaming
        #: hpc-serve's model (True) takes stop strings and its own inputs; the image's takes neither
        self.own_inputs = own_inputs

    def tensors(self, params: GenerateParams) -> list[grpcclient.InferInput]:
        if not self.own_inputs:
            for name, why in IMAGE_MODEL_LACKS.items():
                if _asks(name, getattr(params, name)):
                    raise NotTaken(name, why)
        arrays: dict[str, tuple[np.ndarray, str]] = {
            "text_input": (np.array([params.prompt.encode()], dtype=object), "BYTES"),
            "streaming": _scalar(self.streaming, bool, "BOOL", False),
            "sampling_param_max_tokens": _scalar(params.max_tokens, np.int32, "INT32", False),
            "sampling_param_exclude_input_from_output": _scalar(True, bool, "BOOL", False),
            "return_finish_reason": _scalar(True, bool, "BOOL", False),
            "return_stop_reason": _scalar(True, bool, "BOOL", False),
            "sampling_param_return_perf_metrics": _scalar(True, bool, "BOOL", False),
        }
        if params.stop:
            arrays["sampling_param_stop"] = (np.array([s.encode() for s in params.stop], dtype=object), "BYTES")
        for name, dtype, triton in _SAMPLING:
            if (value := getattr(params, name)) is not None and (self.own_inputs or name not in IMAGE_MODEL_LACKS):
                arrays[f"sampling_param_{name}"] = _scalar(value, dtype, triton, False)
        if params.ignore_eos:
            arrays["sampling_param_ignore_eos"] = _scalar(True, bool, "BOOL", False)
        if params.logprobs:  # the chosen tokens' (hpc-serve's model: `output_log_probs`, new tokens per response)
            arrays["sampling_param_logprobs"] = _scalar(1, np.int32, "INT32", False)
        return infer_inputs(arrays)

    def decoder(self, params: GenerateParams) -> Decoder:
        return CumulativeText(params.stop, params.logprobs)

    def stop_tensors(self) -> list[grpcclient.InferInput]:
        """`stop`, and the one required input (`text_input`, never read: the model checks `stop` first)."""
        return infer_inputs(
            {
                "text_input": (np.array([b""], dtype=object), "BYTES"),
                "stop": _scalar(True, bool, "BOOL", False),
            }
        )


class CumulativeText:
    """The llmapi model's cumulative texts → deltas (module docstring)."""

    def __init__(self, stop: Sequence[str], logprobs: bool = False) -> None:
        self.stop = [s for s in stop if s]
        self.sent = ""
        self.logprobs = logprobs
        #: log probabilities of tokens whose text is held back (a character's first bytes): sent with it
        self._pending: tuple[float, ...] = ()

    def feed(self, infer_response: Any, final: bool) -> Chunk | None:
        named = outputs(infer_response)
        if "text_output" not in named:
            return None
        text = _first_string(named["text_output"]) or ""  # one sequence: the first (and only) output
        finish = _reason(named.get("finish_reason"))  # in each response when asked: "None" until the end
        reason = _reason(named.get("stop_reason")) if finish == "stop" else None
        if reason is not None and reason in self.stop:
            text += reason  # the stop string the engine left out (module docstring)
        if not final and finish is None:
            text = text.rstrip(REPLACEMENT)
        if self.logprobs:
            self._pending += fp32_values(named.get("output_log_probs", b""))
        delta = self._delta(text)
        if not delta and not final:
            return None
        perf = _perf(named) if final else None
        logprobs, self._pending = self._pending, ()
        reason = finish if finish in ("stop", "length") else None
        return Chunk(delta, None, logprobs=logprobs, finish_reason=reason, perf=perf)

    def feed_many(self, infer_responses: Sequence[Any], final: bool) -> Chunk | None:
        """As `feed` of each in turn, but only the last text is decoded (each is the whole text so far); the
        responses before it give their log probabilities."""
        texts = [i for i, r in enumerate(infer_responses) if any(o.name == "text_output" for o in r.outputs)]
        if not texts:
            return None
        last = texts[-1]
        if self.logprobs:
            for response in infer_responses[:last]:
                self._pending += fp32_values(outputs(response).get("output_log_probs", b""))
        end = len(infer_responses) - 1
        return merged([self.feed(r, final and i == end) for i, r in enumerate(infer_responses) if i >= last])

    def _delta(self, text: str) -> str:
        """What `text` adds to the text given so far. An engine that revised earlier text (a character settled
        otherwise than the U+FFFD it held back) gives what follows it: nothing given is taken back."""
        delta = text[len(self.sent) :]
        if delta:
            self.sent = text
        return delta


def _perf(named: Mapping[str, bytes]) -> dict[str, float] | None:
    """The perf outputs of a final response (sent as strings, as upstream builds them), None without them."""
    values = {}
    for name in PERF_OUTPUTS:
        text = _reason(named.get(name))
        try:
            values[name] = float(text) if text is not None else None
        except ValueError:
            values[name] = None
    found = {k: v for k, v in values.items() if v is not None}
    return found or None


def _first_string(raw: bytes | None) -> str | None:
    """The first element of a BYTES output as text, None when it has none. Read in place, not by
    `bytes_elements`: a streamed response's outputs hold one element each, and this runs for each of them."""
    if not raw or len(raw) < 4:
        return None
    (size,) = _LENGTH.unpack_from(raw, 0)
    return raw[4 : 4 + size].decode("utf-8", errors="replace")


#: a BYTES output of the one element "None", as the llmapi model sends an unset reason in every response
_NONE = b"\x04\x00\x00\x00None"


def _reason(raw: bytes | None) -> str | None:
    """A finish or stop reason: the llmapi model sends `str(value)`, "None" when unset."""
    if raw == _NONE:  # the common case: every response before the last
        return None
    value = _first_string(raw)
    return None if value == "None" else value


def outputs(infer_response: Any) -> dict[str, bytes]:
    """A response's raw outputs by name: one `raw_output_contents` entry per output, in order (what tritonclient
    reads too)."""
    return dict(zip((out.name for out in infer_response.outputs), infer_response.raw_output_contents, strict=True))


def text_and_logprobs(infer_response: Any, logprobs: bool) -> tuple[bytes, tuple[float, ...]] | None:
    """A response's `text_output` bytes and (when asked) `output_log_probs`, or None without text (the empty
    final response). Read from the raw bytes Triton sent. Why not tritonclient's InferResult and `as_numpy`:
    per streamed token they build numpy object arrays to join them again, a cost in the gateway's CPU per token
    (docs/decisions.md "The gateway's own time")."""
    named = outputs(infer_response)
    if "text_output" not in named:
        return None
    values = fp32_values(named.get("output_log_probs", b"")) if logprobs else ()
    return b"".join(bytes_elements(named["text_output"])), values


def bytes_elements(raw: bytes) -> list[bytes]:
    """The elements of a serialized BYTES tensor: each a 4-byte little-endian length, then that many bytes
    (what tritonclient's `deserialize_bytes_tensor` reads)."""
    out, at = [], 0
    while at + 4 <= len(raw):
        (size,) = _LENGTH.unpack_from(raw, at)
        out.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def fp32_values(raw: bytes) -> tuple[float, ...]:
    """The values of a serialized FP32 tensor (little-endian, as Triton sends them)."""
    return tuple(float(v) for v in np.frombuffer(raw, dtype="<f4"))


_LENGTH = struct.Struct("<I")

#: the llmapi models by (decoupled, hpc-serve's model): a model that is not decoupled (triton.decoupled false,
#: upstream's default) is asked for one whole response; the image's takes fewer inputs
LLMAPI_IO = {(d, own): LlmapiIO(streaming=d, own_inputs=own) for d in (True, False) for own in (True, False)}
#: each workflow's generation model (the spec's model.workflow, a record's `workflow`), by (decoupled,
#: llmapi_model): the gateway side of the workflow strategy (hpc/spec/workflows.py); a new workflow adds its own
WORKFLOW_IO: dict[str, Callable[[bool, str], ModelIO]] = {
    ENGINE: lambda decoupled, llmapi_model: MODEL_IO[ENGINE],
    LLMAPI: lambda decoupled, llmapi_model: LLMAPI_IO[(decoupled, llmapi_model != IMAGE_MODEL)],
}
#: each workflow's generation model as its defaults ask it
MODEL_IO: dict[str, ModelIO] = {ENGINE: EnsembleIO(), LLMAPI: LLMAPI_IO[(True, True)]}


def model_io(workflow: str, decoupled: bool = True, llmapi_model: str = "") -> ModelIO:
    """The generation model of `workflow` (a replica's endpoint record says which; an older one: engine), asked
    the way its transaction policy takes (`decoupled`) and its model's inputs allow (`llmapi_model`, also from the
    record; "" is hpc-serve's)."""
    return WORKFLOW_IO.get(workflow, WORKFLOW_IO[ENGINE])(decoupled, llmapi_model)
