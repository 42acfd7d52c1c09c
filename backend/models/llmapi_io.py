"""The llmapi `tensorrt_llm` model's request and response tensors, as TensorRT-LLM's
`triton_backend/all_models/llmapi/tensorrt_llm/1/{model.py,helpers.py}` read and write them, over plain numpy (the
model, backend/models/llmapi.py, does the Triton part and the LLM API call).

Requests: `text_input` (element 0, UTF-8), scalar inputs checked with upstream's words ("Expected a scalar tensor
for tensor {name}"), `sampling_param_*` → SamplingParams' keyword arguments with upstream's defaults added
(exclude_input_from_output False, return_perf_metrics False; max_tokens 32, SamplingParams' own default), `stop`
strings decoded to text (upstream hands the BYTES array to SamplingParams as it is, which its tokenizer refuses),
`streaming`, `return_*`; and hpc-serve's additions (OWN_INPUTS: ignore_eos, min_tokens, repetition_penalty,
length_penalty, logprobs).
TensorRT-LLM checks values inside SamplingParams and its executor; here each bad value gets an error naming its
input first.

Responses: `text_output` is cumulative (LLM API `CompletionOutput.text`); without `exclude_input_from_output`
the final text of a non-streamed request starts with the prompt, while streamed events carry the generated text
only (TensorRT-LLM's executor never returns the input while streaming; NVIDIA's streaming sample shows the
same). `finish_reason`, `stop_reason`, `cumulative_logprob` and every perf metric are sent as strings
(`str(value)`), as upstream builds them with the text output's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from launcher.contracts.llmapi import KV_EVENTS_SINCE, PERF_OUTPUTS

#: SamplingParams.max_tokens' default in the LLM API
DEFAULT_MAX_TOKENS = 32
TEXT_INPUT = "text_input"
#: hpc-serve's model's inputs beyond upstream's (its config.pbtxt declares them; the image's model has none):
#: input name → (Triton type, SamplingParams field)
OWN_INPUTS = {
    "sampling_param_ignore_eos": ("TYPE_BOOL", "ignore_eos"),
    "sampling_param_min_tokens": ("TYPE_INT32", "min_tokens"),
    "sampling_param_repetition_penalty": ("TYPE_FP32", "repetition_penalty"),
    "sampling_param_length_penalty": ("TYPE_FP32", "length_penalty"),
    "sampling_param_logprobs": ("TYPE_INT32", "logprobs"),
}
#: hpc-serve's model's output of the generated tokens' log probabilities (asked with sampling_param_logprobs): a
#: streamed response carries the new tokens' only, the ensemble's `output_log_probs` likewise
LOGPROBS_OUTPUT = "output_log_probs"
#: speculative decoding's (none on the CPU engine: upstream's values for a request without drafts)
DRAFT_OUTPUTS = {"acceptance_rate": 0.0, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0}


class InputError(ValueError):
    """A request input is missing or invalid; the message names it."""


@dataclass(frozen=True)
class OutputConfig:
    return_finish_reason: bool = False
    return_stop_reason: bool = False
    return_cumulative_logprob: bool = False


@dataclass(frozen=True)
class LlmRequest:
    """A request as the model reads it: SamplingParams' keyword arguments (`sampling`, each checked), and what
    only the model handles (the prompt, what to return, streaming)."""

    prompt: str
    sampling: Mapping[str, Any] = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)
    exclude_input_from_output: bool = False
    return_perf_metrics: bool = False
    streaming: bool = False
    output: OutputConfig = OutputConfig()

    @property
    def max_tokens(self) -> int:
        return int(self.sampling.get("max_tokens", DEFAULT_MAX_TOKENS))

    def sampling_kwargs(self) -> dict[str, Any]:
        """SamplingParams(**this): the sampling, the stop strings, and the outputs asked for."""
        kwargs = {k: v for k, v in self.sampling.items() if v is not None}
        if self.stop:
            kwargs["stop"] = list(self.stop)
        kwargs["exclude_input_from_output"] = self.exclude_input_from_output
        kwargs["return_perf_metrics"] = self.return_perf_metrics
        return kwargs


def scalar(inputs: Mapping[str, np.ndarray], name: str) -> object:
    """A scalar input's Python value, None when absent (upstream's get_input_scalar_by_name)."""
    arr = inputs.get(name)
    if arr is None:
        return None
    if arr.size != 1:
        raise InputError(f"Expected a scalar tensor for tensor {name}")
    return arr.item(0)


def _text(value: object, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"input '{name}' is not valid UTF-8 text ({e}); send the text UTF-8 encoded") from None
    return str(value)


def kv_events_since(inputs: Mapping[str, np.ndarray]) -> int | None:
    """The event id after which a KV-cache events request wants the events (-1: all kept), None for any other
    request."""
    value = scalar(inputs, KV_EVENTS_SINCE)
    return None if value is None else int(value)  # type: ignore[call-overload]


def is_stop(inputs: Mapping[str, np.ndarray]) -> bool:
    """The `stop` input is true: this request cancels the request of its id (checked before anything else)."""
    return bool(scalar(inputs, "stop"))


def prompt_text(inputs: Mapping[str, np.ndarray]) -> str:
    arr = inputs.get(TEXT_INPUT)
    if arr is None:
        raise InputError("text_input is missing from the request")
    if arr.ndim > 1:
        raise InputError("The current implementation only supports text_input being a 1D tensor.")
    if arr.size == 0:
        raise InputError("input 'text_input' is empty: send one prompt string")
    return _text(arr.reshape(-1)[0], TEXT_INPUT)


def _number(inputs: Mapping[str, np.ndarray], name: str, low: float, high: float = math.inf) -> float | None:
    value = scalar(inputs, name)
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number) or not low <= number <= high:
        upper = "" if high == math.inf else f" and <= {high:g}"
        raise InputError(f"input '{name}' must be a finite number >= {low:g}{upper}, got {value}")
    return number


def _count(inputs: Mapping[str, np.ndarray], name: str, low: int) -> int | None:
    value = scalar(inputs, name)
    if value is None:
        return None
    if int(value) < low:  # type: ignore[call-overload]
        raise InputError(f"input '{name}' must be at least {low}, got {value}")
    return int(value)  # type: ignore[call-overload]


def _stop_strings(inputs: Mapping[str, np.ndarray]) -> list[str]:
    arr = inputs.get("sampling_param_stop")
    if arr is None:
        return []
    return [s for s in (_text(v, "sampling_param_stop") for v in arr.reshape(-1)) if s]


def parse_request(inputs: Mapping[str, np.ndarray]) -> LlmRequest:
    """The request a (non-stop) set of inputs asks for; InputError naming the input otherwise."""
    prompt = prompt_text(inputs)
    best_of = _count(inputs, "sampling_param_best_of", 1)
    if best_of not in (None, 1):
        raise InputError(f"input 'sampling_param_best_of' is {best_of}: the model returns one sequence (use 1)")
    max_tokens = _count(inputs, "sampling_param_max_tokens", 1)
    seed = scalar(inputs, "sampling_param_seed")
    ignore_eos = scalar(inputs, "sampling_param_ignore_eos")
    sampling: dict[str, Any] = {
        "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        "temperature": _number(inputs, "sampling_param_temperature", 0.0),
        "top_k": _count(inputs, "sampling_param_top_k", 0),
        "top_p": _number(inputs, "sampling_param_top_p", 0.0, 1.0),
        "frequency_penalty": _number(inputs, "sampling_param_frequency_penalty", -math.inf),
        "presence_penalty": _number(inputs, "sampling_param_presence_penalty", -math.inf),
        "repetition_penalty": _positive(inputs, "sampling_param_repetition_penalty"),
        "length_penalty": _number(inputs, "sampling_param_length_penalty", -math.inf),
        "min_tokens": _count(inputs, "sampling_param_min_tokens", 0),
        "logprobs": _logprobs(inputs),
        "seed": None if seed is None else int(seed),  # type: ignore[call-overload]
        "ignore_eos": None if ignore_eos is None else bool(ignore_eos),
    }
    return LlmRequest(
        prompt=prompt,
        sampling=sampling,
        stop=_stop_strings(inputs),
        exclude_input_from_output=bool(scalar(inputs, "sampling_param_exclude_input_from_output") or False),
        return_perf_metrics=bool(scalar(inputs, "sampling_param_return_perf_metrics") or False),
        streaming=bool(scalar(inputs, "streaming") or False),
        output=OutputConfig(
            return_finish_reason=bool(scalar(inputs, "return_finish_reason") or False),
            return_stop_reason=bool(scalar(inputs, "return_stop_reason") or False),
            return_cumulative_logprob=bool(scalar(inputs, "return_cumulative_logprob") or False),
        ),
    )


def _logprobs(inputs: Mapping[str, np.ndarray]) -> int | None:
    """`sampling_param_logprobs`: 1 asks for the chosen tokens' log probabilities (0 or absent: none); more
    alternatives are not returned (`output_log_probs` holds one value a token)."""
    count = _count(inputs, "sampling_param_logprobs", 0)
    if count not in (None, 0, 1):
        raise InputError(
            f"input 'sampling_param_logprobs' is {count}: the model returns the chosen tokens' log probabilities "
            "(use 1), not alternatives"
        )
    return count or None


def _positive(inputs: Mapping[str, np.ndarray], name: str) -> float | None:
    value = _number(inputs, name, 0.0)
    if value == 0.0:
        raise InputError(f"input '{name}' must be a finite number > 0, got {value:g}")
    return value


def _strings(*values: object) -> np.ndarray:
    return np.array([str(v) for v in values], dtype=np.object_)


@dataclass(frozen=True)
class Completion:
    """What one response says: the cumulative text and, once finished, why."""

    text: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    cumulative_logprob: float | None = None
    perf: Mapping[str, int | float] | None = None
    #: the log probabilities of the tokens this response adds (asked with sampling_param_logprobs)
    logprobs: tuple[float, ...] | None = None


def response_arrays(completion: Completion, request: LlmRequest) -> dict[str, np.ndarray]:
    """Output name → array for one response (BYTES/object everywhere, as upstream sends them)."""
    out = {"text_output": np.array([completion.text.encode("utf-8")], dtype=np.object_)}
    cfg = request.output
    if cfg.return_finish_reason:
        out["finish_reason"] = _strings(completion.finish_reason)
    if cfg.return_stop_reason:
        out["stop_reason"] = _strings(completion.stop_reason)
    if cfg.return_cumulative_logprob:
        out["cumulative_logprob"] = _strings(completion.cumulative_logprob)
    if completion.logprobs is not None:
        out[LOGPROBS_OUTPUT] = np.asarray(completion.logprobs, dtype=np.float32)
    if request.return_perf_metrics and completion.perf is not None:
        for name in PERF_OUTPUTS:
            out[name] = _strings(completion.perf[name])
        for name, value in DRAFT_OUTPUTS.items():
            out[name] = _strings(value)
    return out
