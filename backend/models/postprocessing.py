"""`postprocessing` model: TOKENS_BATCH [batch, beam, seq] + SEQUENCE_LENGTH [batch, beam] → OUTPUT text.

Every beam is cut to its sequence length and the whole dynamic batch is decoded in one
`decode_batch` call (the Rust tokenizer parallelises it). OUTPUT is BYTES [batch, beam] of UTF-8 —
upstream returns a flat [batch*beam] list, which only has the right shape for beam 1.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from backend.models import model_parameter, parse_bool
from backend.models.tokenizer import TextTokenizer, tokenizer_from_config


def split_sequences(tokens: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    """[batch, beam, seq] + [batch, beam] → batch*beam token lists, each cut to its length."""
    tokens = np.asarray(tokens)
    if tokens.ndim == 2:  # tolerate a missing beam axis
        tokens = tokens[:, None, :]
    lengths = np.asarray(lengths).reshape(tokens.shape[0], tokens.shape[1])
    return [tokens[b, k, : max(0, int(lengths[b, k]))].tolist()
            for b in range(tokens.shape[0]) for k in range(tokens.shape[1])]


def decode_batches(tokenizer: TextTokenizer, batches: Sequence[tuple[np.ndarray, np.ndarray]],
                   skip_special_tokens: bool = True) -> list[np.ndarray]:
    """Decode several requests' (TOKENS_BATCH, SEQUENCE_LENGTH) at once → one BYTES [batch, beam] each."""
    shapes, sequences = [], []
    for tokens, lengths in batches:
        seqs = split_sequences(tokens, lengths)
        tokens = np.asarray(tokens)
        shapes.append((tokens.shape[0], tokens.shape[1] if tokens.ndim == 3 else 1))
        sequences.extend(seqs)
    texts = tokenizer.decode_batch(sequences, skip_special_tokens) if sequences else []
    out, pos = [], 0
    for batch, beam in shapes:
        chunk = texts[pos: pos + batch * beam]
        pos += batch * beam
        out.append(np.array([t.encode("utf-8") for t in chunk], dtype=object).reshape(batch, beam))
    return out


class TritonPythonModel:
    """Triton-facing wrapper; the only place `triton_python_backend_utils` is imported."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        self.skip_special_tokens = parse_bool(model_parameter(config, "skip_special_tokens"), True,
                                              "skip_special_tokens")
        self.tokenizer = tokenizer_from_config(config, "postprocessing")

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = self._pb
        inputs: list[tuple[np.ndarray, np.ndarray] | Exception] = []
        for request in requests:
            try:
                tokens = pb.get_input_tensor_by_name(request, "TOKENS_BATCH")
                lengths = pb.get_input_tensor_by_name(request, "SEQUENCE_LENGTH")
                if tokens is None or lengths is None:
                    raise ValueError("TOKENS_BATCH and SEQUENCE_LENGTH are required")
                inputs.append((tokens.as_numpy(), lengths.as_numpy()))
            except Exception as exc:  # noqa: BLE001
                inputs.append(exc)
        good = [x for x in inputs if not isinstance(x, Exception)]
        try:
            decoded = iter(decode_batches(self.tokenizer, good, self.skip_special_tokens))  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - one bad request must not hide behind a batch error
            decoded = None
            batch_error = exc
        responses = []
        for item in inputs:
            if isinstance(item, Exception) or decoded is None:
                err = item if isinstance(item, Exception) else batch_error
                responses.append(pb.InferenceResponse(output_tensors=[],
                                                      error=pb.TritonError(f"postprocessing: {err}")))
            else:
                responses.append(pb.InferenceResponse(output_tensors=[pb.Tensor("OUTPUT", next(decoded))]))
        return responses
