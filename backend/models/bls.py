"""`tensorrt_llm_bls` model: the ensemble's pipeline as python BLS calls.

preprocessing → tensorrt_llm (decoupled when this model is decoupled, so tokens can be streamed) →
postprocessing. Streaming: with upstream's `accumulate_tokens` every response carries the text of all
tokens so far; without it, each response carries only the new text. Unlike upstream (which decodes each
chunk's tokens on their own, splitting multi-byte characters into U+FFFD and dropping SentencePiece
leading spaces), the new text is the difference between decoding all tokens so far and what was
already sent, holding back a trailing incomplete character until the next chunk completes it.

The pipeline (`BlsPipeline`) only sees a `ModelCaller` — name, input arrays, requested outputs,
decoupled → iterator of output dicts — so it is unit-tested with plain functions; `TritonPythonModel`
plugs in `pb_utils.InferenceRequest`. Errors of inner models are raised as `InnerModelError` and sent
as this request's error. Draft models (speculative decoding) and multimodal encoders are not supported:
their inputs/parameters give a clear error instead of being ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from backend.models import model_parameter, parse_bool
from backend.templates.engine_tables import PASSTHROUGH_OUTPUTS, PREPROCESSING
from backend.templates.tables import BLS_INPUTS, LLM_FROM_CLIENT, LLM_FROM_PREPROCESSING, PREPROCESSING_INPUT_MAP
from launcher.contracts import model_names

#: (model name, inputs, requested output names, decoupled, request id) → responses as {output name: array}
ModelCaller = Callable[[str, Mapping[str, np.ndarray], Sequence[str], bool, str], Iterator[dict[str, np.ndarray]]]

INPUT_NAMES: tuple[str, ...] = tuple(t.name for t in BLS_INPUTS)
UNSUPPORTED_INPUTS: tuple[str, ...] = ("image_input", "image_bytes_input", "image_url_input", "video_bytes_input")
PREPROCESSING_OUTPUTS: tuple[str, ...] = tuple(
    t.name for t in PREPROCESSING.outputs if t.name in {src for _, src in LLM_FROM_PREPROCESSING}
)
LLM_REQUESTED_OUTPUTS: tuple[str, ...] = ("output_ids", "sequence_length", *(t.name for t in PASSTHROUGH_OUTPUTS))


class InnerModelError(RuntimeError):
    """An inner model (preprocessing, tensorrt_llm, postprocessing) answered with an error."""


def _flag(inputs: Mapping[str, np.ndarray], name: str) -> bool:
    value = inputs.get(name)
    return bool(np.asarray(value).reshape(-1)[0]) if value is not None and np.asarray(value).size else False


class _Accumulator:
    """Concatenates streamed token chunks per (batch, beam), each chunk cut to its sequence length."""

    def __init__(self) -> None:
        self.seqs: list[list[list[int]]] | None = None

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.asarray(tokens)
        tokens = tokens[:, None, :] if tokens.ndim == 2 else tokens
        lengths = np.asarray(lengths).reshape(tokens.shape[0], tokens.shape[1])
        if self.seqs is None:
            self.seqs = [[[] for _ in range(tokens.shape[1])] for _ in range(tokens.shape[0])]
        for b in range(tokens.shape[0]):
            for k in range(tokens.shape[1]):
                self.seqs[b][k].extend(tokens[b, k, : int(lengths[b, k])].tolist())
        return self.current()

    def current(self) -> tuple[np.ndarray, np.ndarray]:
        """All tokens so far as (TOKENS_BATCH [batch, beam, max_len], SEQUENCE_LENGTH [batch, beam])."""
        assert self.seqs is not None
        width = max([len(s) for row in self.seqs for s in row] + [1])
        out = np.zeros((len(self.seqs), len(self.seqs[0]), width), dtype=np.int32)
        lens = np.zeros((len(self.seqs), len(self.seqs[0])), dtype=np.int32)
        for b, row in enumerate(self.seqs):
            for k, seq in enumerate(row):
                out[b, k, : len(seq)] = seq
                lens[b, k] = len(seq)
        return out, lens


class BlsPipeline:
    """One client request → an iterator of output dicts (text_output + the pass-through outputs)."""

    def __init__(
        self,
        call: ModelCaller,
        *,
        decoupled: bool,
        accumulate_tokens: bool = False,
        llm_model_name: str = model_names.TENSORRT_LLM,
    ) -> None:
        self.call = call
        self.decoupled = decoupled
        self.accumulate_tokens = accumulate_tokens
        self.llm_model_name = llm_model_name

    def _single(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        responses = list(self.call(model, inputs, outputs, False, ""))
        if len(responses) != 1:
            raise InnerModelError(f"{model} returned {len(responses)} responses, expected 1")
        return responses[0]

    def _check(self, inputs: Mapping[str, np.ndarray], stream: bool) -> None:
        given = [n for n in UNSUPPORTED_INPUTS if inputs.get(n) is not None]
        if given:
            raise ValueError(
                f"multimodal inputs {given} are not supported by hpc-serve's {model_names.TENSORRT_LLM_BLS}"
            )
        draft = inputs.get("num_draft_tokens")
        if (draft is not None and np.asarray(draft).size and int(np.asarray(draft).reshape(-1)[0]) > 0) or _flag(
            inputs, "use_draft_logits"
        ):
            raise ValueError(
                "speculative decoding with a draft model (num_draft_tokens, use_draft_logits) "
                f"is not supported by hpc-serve's {model_names.TENSORRT_LLM_BLS}"
            )
        if stream and not self.decoupled:
            raise ValueError(
                f"stream=true needs decoupled_mode=true (this {model_names.TENSORRT_LLM_BLS} is not decoupled)"
            )
        if inputs.get("text_input") is None or inputs.get("max_tokens") is None:
            raise ValueError("inputs text_input and max_tokens are required")

    def run(self, inputs: Mapping[str, np.ndarray], request_id: str = "") -> Iterator[dict[str, np.ndarray]]:
        """The request's outputs. `request_id`, the client's request's id, goes to its `tensorrt_llm` request as
        the ensemble gives its id to its steps: a stop by that id (hpc/serving/abandon.py, a client's own `stop`
        request) then reaches the generation; without it a stop would match nothing and the engine make every token."""
        stream = _flag(inputs, "stream")
        self._check(inputs, stream)
        pre_inputs = {dst: inputs[src] for dst, src in PREPROCESSING_INPUT_MAP if inputs.get(src) is not None}
        pre = self._single(model_names.PREPROCESSING, pre_inputs, PREPROCESSING_OUTPUTS)
        llm_inputs = {dst: pre[src] for dst, src in LLM_FROM_PREPROCESSING if pre.get(src) is not None}
        llm_inputs.update({dst: inputs[src] for dst, src in LLM_FROM_CLIENT if inputs.get(src) is not None})
        accumulator = _Accumulator() if stream else None
        sent: np.ndarray | None = None  # text already streamed per (batch, beam), delta mode only
        produced = 0
        for response in self.call(self.llm_model_name, llm_inputs, LLM_REQUESTED_OUTPUTS, self.decoupled, request_id):
            if response.get("output_ids") is None:  # the empty final response of a decoupled stream
                continue
            tokens, lengths = response["output_ids"], response["sequence_length"]
            if accumulator is not None:
                tokens, lengths = accumulator.add(tokens, lengths)
            text = self._postprocess(tokens, lengths)
            if stream and not self.accumulate_tokens:
                full = text
                sent = np.full(full.shape, b"", dtype=object) if sent is None else sent
                text, sent = _delta(full, sent)
            out = {"text_output": text}
            out.update({t.name: response[t.name] for t in PASSTHROUGH_OUTPUTS if response.get(t.name) is not None})
            produced += 1
            yield out
        if produced == 0:
            raise InnerModelError(f"{self.llm_model_name} returned no output_ids")
        if sent is not None and accumulator is not None and accumulator.seqs is not None:
            # flush text held back at the very end (the sequence really ends in a partial character)
            final = self._postprocess(*accumulator.current())
            rest, _ = _delta(final, sent, hold_back=False)
            if any(rest.reshape(-1)):
                yield {"text_output": rest}

    def _postprocess(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        post = self._single(
            model_names.POSTPROCESSING,
            {
                "TOKENS_BATCH": np.asarray(tokens, dtype=np.int32),
                "SEQUENCE_LENGTH": np.asarray(lengths, dtype=np.int32),
            },
            ("OUTPUT",),
        )
        return np.asarray(post["OUTPUT"], dtype=object)


_REPLACEMENT = "\ufffd".encode()


def _delta(full: np.ndarray, sent: np.ndarray, hold_back: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """New UTF-8 text per element of `full` beyond what was `sent`; a trailing U+FFFD (an incomplete
    multi-byte character) is held back until a later chunk completes it."""
    full = full.reshape(sent.shape)
    delta = np.empty(sent.shape, dtype=object)
    new_sent = sent.copy()
    for idx in np.ndindex(sent.shape):
        text, done = bytes(full[idx]), bytes(sent[idx])
        if hold_back:
            while text.endswith(_REPLACEMENT):
                text = text[: -len(_REPLACEMENT)]
        if text.startswith(done):
            delta[idx], new_sent[idx] = text[len(done) :], text
        else:  # decoding changed earlier text (rare, e.g. cleanup rules); send nothing until consistent
            delta[idx] = b""
    return delta, new_sent


class TritonPythonModel:
    """Triton-facing wrapper; the only place `triton_python_backend_utils` is imported."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        for key in ("tensorrt_llm_draft_model_name", "multimodal_encoders_name"):
            if model_parameter(config, key):
                raise ValueError(
                    f"{model_names.TENSORRT_LLM_BLS}: parameter {key} is set, but hpc-serve's BLS supports "
                    "neither draft models nor multimodal encoders"
                )
        self.decoupled = bool(pb_utils.using_decoupled_model_transaction_policy(config))
        self.pipeline = BlsPipeline(
            self._call,
            decoupled=self.decoupled,
            accumulate_tokens=parse_bool(model_parameter(config, "accumulate_tokens"), False, "accumulate_tokens"),
            llm_model_name=model_parameter(config, "tensorrt_llm_model_name") or model_names.TENSORRT_LLM,
        )

    def _call(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], decoupled: bool, request_id: str
    ) -> Iterator[dict[str, np.ndarray]]:
        pb = self._pb
        request = pb.InferenceRequest(
            model_name=model,
            inputs=[pb.Tensor(k, np.asarray(v)) for k, v in inputs.items()],
            requested_output_names=list(outputs),
            request_id=request_id,
        )
        responses = request.exec(decoupled=True) if decoupled else [request.exec()]
        for response in responses:
            if response.has_error():
                raise InnerModelError(f"{model}: {response.error().message()}")
            yield {t.name(): t.as_numpy() for t in response.output_tensors()}

    def _inputs(self, request: Any) -> dict[str, np.ndarray]:
        inputs = {}
        for name in INPUT_NAMES:
            tensor = self._pb.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs[name] = tensor.as_numpy()
        return inputs

    def _response(self, out: Mapping[str, np.ndarray]) -> Any:
        return self._pb.InferenceResponse(output_tensors=[self._pb.Tensor(k, np.asarray(v)) for k, v in out.items()])

    def _error(self, exc: BaseException) -> Any:
        return self._pb.InferenceResponse(
            output_tensors=[], error=self._pb.TritonError(f"{model_names.TENSORRT_LLM_BLS}: {exc}")
        )

    def execute(self, requests: list[Any]) -> list[Any] | None:
        pb = self._pb
        if self.decoupled:
            for request in requests:
                sender = request.get_response_sender()
                try:
                    for out in self.pipeline.run(self._inputs(request), request.request_id()):
                        sender.send(self._response(out))
                    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                except Exception as exc:  # noqa: BLE001 - becomes the request's error
                    sender.send(self._error(exc), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        responses = []
        for request in requests:
            try:
                outs = list(self.pipeline.run(self._inputs(request), request.request_id()))
                if len(outs) != 1:
                    raise InnerModelError(f"expected one response in non-decoupled mode, got {len(outs)}")
                responses.append(self._response(outs[0]))
            except Exception as exc:  # noqa: BLE001
                responses.append(self._error(exc))
        return responses
