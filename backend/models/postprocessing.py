"""`postprocessing` model: TOKENS_BATCH [batch, beam, seq] + SEQUENCE_LENGTH [batch, beam] → OUTPUT text.

OUTPUT is BYTES, one flat element per beam of every batch row ([batch * beam]), exactly as upstream returns
it: clients do `result.as_numpy("text_output")[0].decode()`.  Every beam is cut to its sequence length and the
whole dynamic batch is decoded in one `decode_batch` call (the Rust tokenizer parallelises it).

Streaming through the ensemble: each call carries only the new tokens of one stream, and Triton gives this step
nothing else about the stream (an ensemble step may not mix tensors from before the decoupled tensorrt_llm with
its outputs).  Decoded alone, a multi-byte character split across chunks becomes U+FFFD pieces, as upstream.
When the request id starts with ``hpc-serve-stream:`` (hpc-serve's own clients send a unique one), the chunks of
that stream go through an incremental decoder (detokenize.py) that holds back an incomplete character until
the next chunk completes it.  That state lives in this process, so it is kept only with one postprocessing
instance (the default); tensorrt_llm_bls holds characters back for every client.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from backend.models import model_parameter, parse_bool
from backend.models.detokenize import StreamTable
from backend.models.tokenizer import TextTokenizer, tokenizer_from_config
from launcher.contracts import model_names


def split_sequences(tokens: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    """[batch, beam, seq] + [batch, beam] → batch*beam token lists, each cut to its length."""
    tokens = np.asarray(tokens)
    if tokens.ndim == 2:  # tolerate a missing beam axis
        tokens = tokens[:, None, :]
    if tokens.ndim != 3:
        raise ValueError(f"TOKENS_BATCH must be [batch, beam, tokens], got shape {list(tokens.shape)}")
    try:
        lengths = np.asarray(lengths).reshape(tokens.shape[0], tokens.shape[1])
    except ValueError:
        raise ValueError(
            f"SEQUENCE_LENGTH {list(np.shape(lengths))} does not match TOKENS_BATCH "
            f"{list(tokens.shape)}: give one length per beam"
        ) from None
    return [
        tokens[b, k, : max(0, int(lengths[b, k]))].tolist()
        for b in range(tokens.shape[0])
        for k in range(tokens.shape[1])
    ]


def to_bytes_tensor(texts: Sequence[str]) -> np.ndarray:
    """Upstream's OUTPUT layout: a flat BYTES array, one UTF-8 element per beam of every row."""
    return np.array([t.encode("utf-8") for t in texts], dtype=object)


def decode_batches(
    tokenizer: TextTokenizer, batches: Sequence[tuple[np.ndarray, np.ndarray]], skip_special_tokens: bool = True
) -> list[np.ndarray]:
    """Decode several requests' (TOKENS_BATCH, SEQUENCE_LENGTH) at once → one flat BYTES [batch*beam] each."""
    counts, sequences = [], []
    for tokens, lengths in batches:
        seqs = split_sequences(tokens, lengths)
        counts.append(len(seqs))
        sequences.extend(seqs)
    texts = tokenizer.decode_batch(sequences, skip_special_tokens) if sequences else []
    out, pos = [], 0
    for n in counts:
        out.append(to_bytes_tensor(texts[pos : pos + n]))
        pos += n
    return out


class StreamingDecoder:
    """Text deltas for streamed chunks, per (stream key, row, beam), with incomplete characters held back."""

    def __init__(self, tokenizer: TextTokenizer, skip_special_tokens: bool = True, streams: StreamTable | None = None):
        self.streams = streams or StreamTable()
        self._decode = lambda ids: tokenizer.decode(ids, skip_special_tokens)

    def __call__(self, key: str, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        seqs = split_sequences(tokens, lengths)
        return to_bytes_tensor([self.streams.push((key, i), seq, self._decode) for i, seq in enumerate(seqs)])


class TritonPythonModel:
    """Triton-facing wrapper; the only place `triton_python_backend_utils` is imported."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        self.skip_special_tokens = parse_bool(
            model_parameter(config, "skip_special_tokens"), True, "skip_special_tokens"
        )
        self.tokenizer = tokenizer_from_config(config, model_names.POSTPROCESSING)
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
        self.streaming = StreamingDecoder(self.tokenizer, self.skip_special_tokens) if instances == 1 else None

    def _read(self, request: Any) -> tuple[np.ndarray, np.ndarray]:
        pb = self._pb
        tokens = pb.get_input_tensor_by_name(request, "TOKENS_BATCH")
        lengths = pb.get_input_tensor_by_name(request, "SEQUENCE_LENGTH")
        if tokens is None or lengths is None:
            raise ValueError("inputs TOKENS_BATCH and SEQUENCE_LENGTH are required")
        return tokens.as_numpy(), lengths.as_numpy()

    def _stream_key(self, request: Any) -> str | None:
        request_id = request.request_id() or ""
        return (
            request_id
            if self.streaming is not None and request_id.startswith(model_names.STREAM_REQUEST_PREFIX)
            else None
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = self._pb
        results: list[np.ndarray | Exception | None] = []
        whole: list[tuple[int, tuple[np.ndarray, np.ndarray]]] = []
        for i, request in enumerate(requests):
            try:
                tokens, lengths = self._read(request)
                key = self._stream_key(request)
                if key is not None and self.streaming is not None:
                    results.append(self.streaming(key, tokens, lengths))
                else:
                    results.append(None)
                    whole.append((i, (tokens, lengths)))
            except Exception as exc:  # noqa: BLE001 - becomes this request's error
                results.append(exc)
        try:
            for (i, _), text in zip(
                whole, decode_batches(self.tokenizer, [w for _, w in whole], self.skip_special_tokens), strict=True
            ):
                results[i] = text
        except Exception as exc:  # noqa: BLE001 - decode each alone, so one bad request names itself
            for i, item in whole:
                try:
                    results[i] = decode_batches(self.tokenizer, [item], self.skip_special_tokens)[0]
                except Exception as one:  # noqa: BLE001
                    results[i] = one if str(one) else exc
        return [
            pb.InferenceResponse(output_tensors=[], error=pb.TritonError(f"{model_names.POSTPROCESSING}: {r}"))
            if isinstance(r, Exception)
            else pb.InferenceResponse(output_tensors=[pb.Tensor("OUTPUT", r)])
            for r in results
        ]
