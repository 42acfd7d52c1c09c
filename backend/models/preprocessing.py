"""`preprocessing` model: text → token ids and the TensorRT-LLM request tensors.

Same tensors as upstream (backend/templates/engine_tables.py PREPROCESSING). Differences on purpose:
`tokenizers` instead of transformers (backend/models/tokenizer.py), bad/stop/bias words are tokenized
*without* special tokens (upstream adds a BOS to every stop word on Llama-style tokenizers, which then
never matches), and multimodal inputs are rejected with a clear error instead of needing torch/PIL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from backend.models import model_parameter, parse_bool
from backend.models.tokenizer import TextTokenizer, tokenizer_from_config
from launcher.contracts import model_names

INPUT_NAMES: tuple[str, ...] = (
    "QUERY",
    "DECODER_QUERY",
    "IMAGE_BYTES",
    "IMAGE_URL",
    "VIDEO_BYTES",
    "REQUEST_OUTPUT_LEN",
    "BAD_WORDS_DICT",
    "STOP_WORDS_DICT",
    "EMBEDDING_BIAS_WORDS",
    "EMBEDDING_BIAS_WEIGHTS",
    "END_ID",
    "PAD_ID",
    "PROMPT_TABLE_EXTRA_ID",
)
MULTIMODAL_INPUTS: tuple[str, ...] = ("IMAGE_BYTES", "IMAGE_URL", "VIDEO_BYTES")


def as_text(value: object, name: str = "QUERY") -> str:
    """Triton BYTES elements arrive as bytes (or str from some clients); anything but UTF-8 is refused by name."""
    if not isinstance(value, (bytes, bytearray)):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"input {name} is not valid UTF-8 (byte {e.start}: "
            f"{bytes(value[e.start : e.start + 1])!r}); send UTF-8 text"
        ) from None


def pad_right(rows: Sequence[Sequence[int]], pad_id: int, dtype: Any = np.int32) -> np.ndarray:
    """[batch, max_len] right-padded with pad_id (at least one column so shapes stay 2-D)."""
    width = max([len(r) for r in rows] + [1])
    out = np.full((len(rows), width), pad_id, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def words_to_list_format(
    tokenizer: TextTokenizer, words: np.ndarray | None, batch_size: int, name: str = "STOP_WORDS_DICT"
) -> np.ndarray:
    """TRT-LLM bad/stop words format: int32 [batch, 2, L]; row 0 = concatenated token ids of every word,
    row 1 = cumulative end offsets, padded with 0 / -1. No words → [batch, 2, 0].

    `words` is the [batch, N] BYTES tensor, one word (or phrase) per element; empty strings are skipped
    (Triton pads ragged client lists with them)."""
    if words is None:
        return np.empty((batch_size, 2, 0), dtype=np.int32)
    words = np.asarray(words, dtype=object).reshape(batch_size, -1)
    flat_ids: list[list[int]] = []
    offsets: list[list[int]] = []
    for row in words:
        ids: list[int] = []
        ends: list[int] = []
        for word in row:
            tokens = tokenizer.encode(as_text(word, name), add_special_tokens=False)
            if not tokens:
                continue
            ids.extend(tokens)
            ends.append(len(ids))
        flat_ids.append(ids)
        offsets.append(ends)
    width = max([len(x) for x in flat_ids] + [1])
    out = np.zeros((batch_size, 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, (ids, ends) in enumerate(zip(flat_ids, offsets, strict=True)):
        out[i, 0, : len(ids)] = ids
        out[i, 1, : len(ends)] = ends
    return out


def embedding_bias(
    tokenizer: TextTokenizer, words: np.ndarray | None, weights: np.ndarray | None, batch_size: int
) -> np.ndarray:
    """fp32 [batch, vocab]: each word's tokens get its weight added; unset → [batch, 0]."""
    if words is None and weights is None:
        return np.empty((batch_size, 0), dtype=np.float32)
    if words is None or weights is None:
        raise ValueError("EMBEDDING_BIAS_WORDS and EMBEDDING_BIAS_WEIGHTS must be given together")
    words = np.asarray(words, dtype=object).reshape(batch_size, -1)
    weights = np.asarray(weights, dtype=np.float32).reshape(batch_size, -1)
    if words.shape != weights.shape:
        raise ValueError(f"embedding bias words {words.shape} and weights {weights.shape} differ in shape")
    out = np.zeros((batch_size, tokenizer.vocab_size), dtype=np.float32)
    for i in range(batch_size):
        for word, weight in zip(words[i], weights[i], strict=True):
            for tid in tokenizer.encode(as_text(word, "EMBEDDING_BIAS_WORDS"), add_special_tokens=False):
                out[i, tid] += weight
    return out


def _ids_column(value: np.ndarray | None, default: int, batch_size: int, name: str) -> np.ndarray:
    if value is None:
        return np.full((batch_size, 1), default, dtype=np.int32)
    return np.asarray(value, dtype=np.int32).reshape(batch_size, 1)


class Preprocessor:
    """The pure logic: dict of input tensors → dict of output tensors (upstream names)."""

    def __init__(self, tokenizer: TextTokenizer, add_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens

    def _encode_column(self, texts: np.ndarray, name: str = "QUERY") -> list[list[int]]:
        texts = np.asarray(texts, dtype=object)
        rows = texts.reshape(texts.shape[0], -1) if texts.ndim else texts.reshape(1, 1)
        return [self.tokenizer.encode(as_text(r[0], name), add_special_tokens=self.add_special_tokens) for r in rows]

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        given = [n for n in MULTIMODAL_INPUTS if inputs.get(n) is not None]
        if given:
            raise ValueError(f"multimodal inputs {given} are not supported by hpc-serve's {model_names.PREPROCESSING}")
        if inputs.get("QUERY") is None:
            raise ValueError("input QUERY is required")
        if inputs.get("REQUEST_OUTPUT_LEN") is None:
            raise ValueError("input REQUEST_OUTPUT_LEN is required")
        query_ids = self._encode_column(inputs["QUERY"])
        batch = len(query_ids)
        if any(not ids for ids in query_ids):
            raise ValueError("input QUERY (text_input) is empty: it encodes to no tokens; send a non-empty prompt")
        out_len = np.asarray(inputs["REQUEST_OUTPUT_LEN"])
        if out_len.size and int(out_len.min()) < 1:
            raise ValueError(f"input REQUEST_OUTPUT_LEN (max_tokens) must be at least 1, got {int(out_len.min())}")
        end_ids = _ids_column(inputs.get("END_ID"), self.tokenizer.end_id, batch, "END_ID")
        pad_ids = _ids_column(inputs.get("PAD_ID"), self.tokenizer.pad_id, batch, "PAD_ID")
        pad = int(pad_ids[0, 0])
        input_id = pad_right(query_ids, pad)
        out: dict[str, np.ndarray] = {
            "INPUT_ID": input_id,
            "REQUEST_INPUT_LEN": np.array([[len(r)] for r in query_ids], dtype=np.int32),
        }
        if inputs.get("DECODER_QUERY") is not None:
            decoder_ids = self._encode_column(inputs["DECODER_QUERY"], "DECODER_QUERY")
            out["DECODER_INPUT_ID"] = pad_right(decoder_ids, pad)
            out["REQUEST_DECODER_INPUT_LEN"] = np.array([[len(r)] for r in decoder_ids], dtype=np.int32)
        else:  # upstream: a single pad token, length 1
            out["DECODER_INPUT_ID"] = pad_ids.copy()
            out["REQUEST_DECODER_INPUT_LEN"] = np.ones((batch, 1), dtype=np.int32)
        out["BAD_WORDS_IDS"] = words_to_list_format(
            self.tokenizer, inputs.get("BAD_WORDS_DICT"), batch, "BAD_WORDS_DICT"
        )
        out["STOP_WORDS_IDS"] = words_to_list_format(self.tokenizer, inputs.get("STOP_WORDS_DICT"), batch)
        out["EMBEDDING_BIAS"] = embedding_bias(
            self.tokenizer, inputs.get("EMBEDDING_BIAS_WORDS"), inputs.get("EMBEDDING_BIAS_WEIGHTS"), batch
        )
        out["REQUEST_OUTPUT_LEN"] = np.asarray(inputs["REQUEST_OUTPUT_LEN"], dtype=np.int32).reshape(batch, -1)
        out["OUT_END_ID"] = end_ids
        out["OUT_PAD_ID"] = pad_ids
        extra = inputs.get("PROMPT_TABLE_EXTRA_ID")
        if extra is not None:  # one extra id per prompt token, like upstream; absent otherwise
            extra = np.asarray(extra, dtype=np.uint64).reshape(batch, -1)[:, :1]
            out["OUT_PROMPT_TABLE_EXTRA_IDS"] = np.repeat(extra, input_id.shape[1], axis=1)
        return out


class TritonPythonModel:
    """Triton-facing wrapper; the only place `triton_python_backend_utils` is imported."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        add_special = parse_bool(model_parameter(config, "add_special_tokens"), True, "add_special_tokens")
        self.preprocessor = Preprocessor(
            tokenizer_from_config(config, model_names.PREPROCESSING), add_special_tokens=add_special
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = self._pb
        responses = []
        for request in requests:
            try:
                inputs = {}
                for name in INPUT_NAMES:
                    tensor = pb.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        inputs[name] = tensor.as_numpy()
                outputs = self.preprocessor(inputs)
                responses.append(pb.InferenceResponse(output_tensors=[pb.Tensor(k, v) for k, v in outputs.items()]))
            except Exception as exc:  # noqa: BLE001 - every failure becomes this request's error
                responses.append(
                    pb.InferenceResponse(output_tensors=[], error=pb.TritonError(f"{model_names.PREPROCESSING}: {exc}"))
                )
        return responses

    def finalize(self) -> None:
        self.preprocessor = None  # type: ignore[assignment]
