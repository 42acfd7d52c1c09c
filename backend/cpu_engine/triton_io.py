"""Convert between the upstream ``tensorrt_llm`` model's Triton tensors and engine requests/outputs.

Why separate from the Triton model file: ``triton_python_backend_utils`` exists only inside the python-backend
stub, while this mapping (names, dtypes, shapes, what is unsupported) is the part worth unit-testing.  Tensor
names/dtypes/dims follow tensorrtllm_backend ``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .sampling import SamplingParams
from .scheduler import GenerationOutput, GenerationRequest


class InputError(ValueError):
    """A request the CPU engine cannot honour; the message names the offending input tensor."""


# Inputs that change the result in ways the CPU engine does not implement: present and "on" => per-request error.
# value: predicate over the (batch-row) array saying whether the input is actually in use.
def _nonempty(a: np.ndarray) -> bool:
    return a.size > 0


def _truthy(a: np.ndarray) -> bool:
    return a.size > 0 and bool(np.any(a))


def _gt1(a: np.ndarray) -> bool:
    return a.size > 0 and bool(np.any(a > 1))


def _not_default_top_p(a: np.ndarray) -> bool:
    return a.size > 0 and bool(np.any(a != 0))


UNSUPPORTED_INPUTS: dict[str, tuple[Callable[[np.ndarray], bool], str]] = {
    "beam_width": (_gt1, "beam search (beam_width > 1) is not implemented by the CPU engine"),
    "num_return_sequences": (_gt1, "num_return_sequences > 1 is not implemented by the CPU engine"),
    "encoder_input_features": (_nonempty, "encoder-decoder models are not supported by the CPU engine"),
    "encoder_output_lengths": (_nonempty, "encoder-decoder models are not supported by the CPU engine"),
    "draft_input_ids": (_nonempty, "speculative decoding (draft tokens) is not supported by the CPU engine"),
    "draft_logits": (_nonempty, "speculative decoding (draft logits) is not supported by the CPU engine"),
    "draft_acceptance_threshold": (_nonempty, "speculative decoding is not supported by the CPU engine"),
    "prompt_embedding_table": (_nonempty, "prompt tuning / multimodal embeddings are not supported by the CPU engine"),
    "prompt_table_extra_ids": (_nonempty, "prompt tuning is not supported by the CPU engine"),
    "prompt_vocab_size": (_nonempty, "prompt tuning is not supported by the CPU engine"),
    "cross_attention_mask": (_nonempty, "cross attention is not supported by the CPU engine"),
    "skip_cross_attn_blocks": (_truthy, "cross attention is not supported by the CPU engine"),
    "mrope_rotary_cos_sin": (_nonempty, "mrope (multimodal RoPE) is not supported by the CPU engine"),
    "mrope_position_deltas": (_nonempty, "mrope (multimodal RoPE) is not supported by the CPU engine"),
    "lora_task_id": (_nonempty, "LoRA is not supported by the CPU engine"),
    "lora_weights": (_nonempty, "LoRA is not supported by the CPU engine"),
    "lora_config": (_nonempty, "LoRA is not supported by the CPU engine"),
    "context_phase_params": (
        _nonempty,
        "disaggregated serving (context_phase_params) is not supported by the CPU engine",
    ),
    "return_context_logits": (_truthy, "context logits are not returned by the CPU engine"),
    "return_generation_logits": (_truthy, "generation logits are not returned by the CPU engine"),
    "runtime_top_p_min": (_not_default_top_p, "top-p decay is not implemented by the CPU engine"),
    "runtime_top_p_decay": (_not_default_top_p, "top-p decay is not implemented by the CPU engine"),
    "runtime_top_p_reset_ids": (_nonempty, "top-p decay is not implemented by the CPU engine"),
    "guided_decoding_guide_type": (_nonempty, "guided decoding is not supported by the CPU engine"),
    "guided_decoding_guide": (_nonempty, "guided decoding is not supported by the CPU engine"),
    "lookahead_window_size": (_nonempty, "lookahead decoding is not supported by the CPU engine"),
    "lookahead_ngram_size": (_nonempty, "lookahead decoding is not supported by the CPU engine"),
    "lookahead_verification_set_size": (_nonempty, "lookahead decoding is not supported by the CPU engine"),
    **{
        n: (_nonempty, "KV cache retention priorities are not supported by the CPU engine")
        for n in (
            "retention_token_range_starts",
            "retention_token_range_ends",
            "retention_token_range_priorities",
            "retention_token_range_durations_ms",
            "retention_decode_priority",
            "retention_decode_duration_ms",
        )
    },
}
# Accepted and ignored on purpose: decoder_input_ids/decoder_input_lengths (preprocessing always sends them;
# TensorRT-LLM ignores them for decoder-only models) and beam-search-only knobs (len_penalty, early_stopping,
# beam_search_diversity_rate), which have no effect at beam_width 1.

# Output tensors that carry a scalar per response ([batch=1, 1] with the batch dim).
PERF_OUTPUTS = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
KV_OUTPUTS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks")


def parse_words_list(arr: np.ndarray | None, name: str = "stop_words_list") -> list[list[int]]:
    """TensorRT-LLM words list ``[2, L]`` (row 0 flat ids, row 1 cumulative end offsets, -1 padded) → token lists.

    Offsets must grow and stay within the ids; anything else is an :class:`InputError` naming ``name``."""
    if arr is None or arr.size == 0:
        return []
    a = np.asarray(arr)
    if a.size % 2 or (a.ndim >= 2 and a.shape[-2] != 2):
        raise InputError(
            f"input '{name}' must be [2, L] (token ids, cumulative end offsets), got shape {list(a.shape)}"
        )
    a = a.reshape(2, -1)
    ids, offsets = a[0], a[1]
    words, start = [], 0
    for off in offsets:
        off = int(off)
        if off < 0:
            break
        if off < start or off > len(ids):
            raise InputError(
                f"input '{name}': offset {off} must be >= the previous one ({start}) and <= "
                f"{len(ids)} (the number of ids)"
            )
        if off > start:
            words.append([int(t) for t in ids[start:off]])
        start = off
    return words


def encode_words_list(words: list[list[int]]) -> np.ndarray:
    """Inverse of :func:`parse_words_list` (handy for clients and tests): ``[2, L]`` int32."""
    flat = [t for w in words for t in w]
    offsets = list(np.cumsum([len(w) for w in words])) if words else []
    n = max(len(flat), len(offsets))
    out = np.full((2, n), -1, np.int32)
    out[0, : len(flat)] = flat
    out[0, len(flat) :] = 0
    out[1, : len(offsets)] = offsets
    return out


@dataclass
class RequestOptions:
    """Per-Triton-request flags that shape the responses, not the generation."""

    streaming: bool
    exclude_input_in_output: bool
    return_log_probs: bool
    return_perf_metrics: bool
    batch_size: int


def _row(inputs: Mapping[str, np.ndarray], name: str, b: int, batch: int) -> np.ndarray | None:
    a = inputs.get(name)
    if a is None:
        return None
    a = np.asarray(a)
    if a.ndim == 0:
        return a.reshape(1)
    if a.shape[0] == batch:
        return a[b]
    return a  # not batched (e.g. max_batch_size 0)


def _scalar(inputs: Mapping[str, np.ndarray], name: str, b: int, batch: int, default=None):
    r = _row(inputs, name, b, batch)
    if r is None or r.size == 0:
        return default
    return r.reshape(-1)[0].item()


_SCALAR_INPUTS = (
    "input_lengths",
    "request_output_len",
    "end_id",
    "pad_id",
    "temperature",
    "runtime_top_k",
    "runtime_top_p",
    "seed",
    "min_tokens",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


def _check_batch_dims(inputs: Mapping[str, np.ndarray], batch: int) -> None:
    """A per-row input must have one row per prompt (or a single value for all): a mismatch is the client's
    mistake, never a silent reuse of the first row."""
    for name in _SCALAR_INPUTS:
        a = inputs.get(name)
        if a is None:
            continue
        a = np.asarray(a)
        if a.ndim and a.shape[0] not in (batch, 1) or (a.ndim and a.size == 0):
            raise InputError(
                f"input '{name}' has shape {list(a.shape)} but input_ids has {batch} row(s): give one value per row"
            )
        if a.ndim and a.size != a.shape[0]:
            raise InputError(f"input '{name}' must hold one value per row, got shape {list(a.shape)}")


def parse_inputs(
    inputs: Mapping[str, np.ndarray], default_exclude_input: bool = False
) -> tuple[list[GenerationRequest], RequestOptions]:
    """Build one :class:`GenerationRequest` per batch row of a Triton request's input tensors (batch dim first)."""
    if "input_ids" not in inputs:
        raise InputError("input 'input_ids' is required")
    ids = np.asarray(inputs["input_ids"])
    if not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"input 'input_ids' must hold integer token ids (INT32), got {ids.dtype}")
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise InputError(f"input 'input_ids' must be [batch, tokens], got shape {list(ids.shape)}")
    batch = ids.shape[0]
    _check_batch_dims(inputs, batch)
    for name, (in_use, why) in UNSUPPORTED_INPUTS.items():
        if name in inputs and in_use(np.asarray(inputs[name])):
            raise InputError(f"input '{name}': {why}")
    if "request_output_len" not in inputs:
        raise InputError("input 'request_output_len' is required")
    streaming = bool(_scalar(inputs, "streaming", 0, batch, False))
    exclude = _scalar(inputs, "exclude_input_in_output", 0, batch, None)
    opts = RequestOptions(
        streaming=streaming,
        exclude_input_in_output=default_exclude_input if exclude is None else bool(exclude),
        return_log_probs=bool(_scalar(inputs, "return_log_probs", 0, batch, False)),
        return_perf_metrics=bool(_scalar(inputs, "return_perf_metrics", 0, batch, False)),
        batch_size=batch,
    )
    reqs = []
    for b in range(batch):
        length = _scalar(inputs, "input_lengths", b, batch, None)
        row = ids[b].reshape(-1)
        if length is not None:
            if int(length) == 0:
                raise InputError("input 'input_lengths' is 0: the prompt is empty; send at least one token")
            if not 0 < int(length) <= row.shape[0]:
                raise InputError(
                    f"input 'input_lengths' = {length} does not fit input_ids of length "
                    f"{row.shape[0]}; it must be in [1, {row.shape[0]}]"
                )
            row = row[: int(length)]
        top_k = _scalar(inputs, "runtime_top_k", b, batch, None)
        top_p = _scalar(inputs, "runtime_top_p", b, batch, None)
        temperature = _scalar(inputs, "temperature", b, batch, None)
        sampling = SamplingParams(
            temperature=None if temperature is None else float(temperature),
            top_k=None if top_k is None else int(top_k),
            top_p=None if top_p is None else float(top_p),
            seed=int(_scalar(inputs, "seed", b, batch, 0)),
            repetition_penalty=_scalar(inputs, "repetition_penalty", b, batch, None),
            presence_penalty=_scalar(inputs, "presence_penalty", b, batch, None),
            frequency_penalty=_scalar(inputs, "frequency_penalty", b, batch, None),
            min_tokens=int(_scalar(inputs, "min_tokens", b, batch, 0) or 0),
        )
        try:
            sampling.validate()
        except ValueError as e:
            raise InputError(str(e)) from None
        vocab_bias = _row(inputs, "embedding_bias", b, batch)
        if vocab_bias is not None and vocab_bias.size:
            raise InputError("input 'embedding_bias': logit bias is not supported by the CPU engine")
        end_id = _scalar(inputs, "end_id", b, batch, None)
        pad_id = _scalar(inputs, "pad_id", b, batch, None)
        reqs.append(
            GenerationRequest(
                input_ids=row.astype(np.int64),
                max_new_tokens=int(_scalar(inputs, "request_output_len", b, batch)),
                end_id=None if end_id is None else int(end_id),
                pad_id=None if pad_id is None else int(pad_id),
                stop_words=parse_words_list(_row(inputs, "stop_words_list", b, batch), "stop_words_list"),
                bad_words=parse_words_list(_row(inputs, "bad_words_list", b, batch), "bad_words_list"),
                sampling=sampling,
                return_log_probs=opts.return_log_probs,
                streaming=streaming,
            )
        )
    return reqs, opts


def output_arrays(out: GenerationOutput, batch_index: int, opts: RequestOptions) -> dict[str, np.ndarray]:
    """Tensors for one response about one batch row (shapes carry a leading batch dim of 1, beam dim 1).

    Streaming responses carry only the new tokens (as TensorRT-LLM does); a non-streaming response carries the
    prompt too unless ``exclude_input_in_output``.
    """
    req = out.request
    new = np.asarray(out.new_tokens, np.int32)
    if opts.streaming or opts.exclude_input_in_output:
        ids = new
    else:
        ids = np.concatenate([req.input_ids.astype(np.int32), new])
    res: dict[str, np.ndarray] = {
        "output_ids": ids.reshape(1, 1, -1),
        "sequence_length": np.array([[ids.shape[0]]], np.int32),
        "batch_index": np.array([[batch_index]], np.int32),
        "sequence_index": np.array([[0]], np.int32),
    }
    if opts.return_log_probs:
        res["cum_log_probs"] = np.array([[req.cum_log_prob]], np.float32)
        res["output_log_probs"] = np.asarray(out.new_log_probs, np.float32).reshape(1, 1, -1)
    if opts.return_perf_metrics:
        for name in PERF_OUTPUTS:
            res[name] = np.array([[getattr(req, name)]], np.int64)
        # as TensorRT-LLM counts them: the prompt's blocks found in the cache (0 without enable_kv_cache_reuse)
        # were not newly allocated
        res["kv_cache_alloc_new_blocks"] = np.array([[req.kv_blocks_allocated - req.kv_blocks_reused]], np.int32)
        res["kv_cache_reused_blocks"] = np.array([[req.kv_blocks_reused]], np.int32)
        res["kv_cache_alloc_total_blocks"] = np.array([[req.kv_blocks_allocated]], np.int32)
    return res


def merge_rows(rows: list[dict[str, np.ndarray]], pad_id: int) -> dict[str, np.ndarray]:
    """Stack per-row outputs into one response for a batched non-decoupled request (output_ids right-padded)."""
    if len(rows) == 1:
        return rows[0]
    merged: dict[str, np.ndarray] = {}
    for name in rows[0]:
        parts = [r[name] for r in rows]
        if name in ("output_ids", "output_log_probs"):
            width = max(p.shape[-1] for p in parts)
            fill = pad_id if name == "output_ids" else 0.0
            parts = [np.pad(p, ((0, 0), (0, 0), (0, width - p.shape[-1])), constant_values=fill) for p in parts]
        merged[name] = np.concatenate(parts, axis=0)
    return merged
