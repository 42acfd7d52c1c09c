"""Per-request checks against the model, made before a request may join a batch.

Why before: a request joins a batch step shared with every other request in flight and, under tensor
parallelism, with the follower ranks.  A token id outside the vocabulary would raise inside that step (and a
negative one would wrap around silently); checked here, a bad request gets its own error naming the input and the
allowed range, and nobody else notices.  Messages use the upstream ``tensorrt_llm`` input names.
"""

from __future__ import annotations

import numpy as np

from .scheduler import GenerationRequest


def _out_of_vocab(name: str, ids: np.ndarray, vocab: int) -> str | None:
    ids = np.asarray(ids).reshape(-1)
    if ids.size == 0:
        return None
    bad = np.flatnonzero((ids < 0) | (ids >= vocab))
    if bad.size == 0:
        return None
    i = int(bad[0])
    return (
        f"input '{name}': token id {int(ids[i])} at position {i} is outside this model's vocabulary "
        f"[0, {vocab}) ({bad.size} such id{'s' if bad.size > 1 else ''})"
    )


def _special_id(name: str, value: int | None, vocab: int) -> str | None:
    """end_id / pad_id: a vocabulary id, or -1 (TensorRT-LLM's "none")."""
    if value is None or value == -1 or 0 <= value < vocab:
        return None
    return f"input '{name}': {value} is not a token id of this model; use -1 (none) or a value in [0, {vocab})"


def request_problem(req: GenerationRequest, vocab_size: int) -> str | None:
    """Why ``req`` cannot be served by a model with ``vocab_size`` tokens, or None."""
    if req.prompt_len == 0:
        return "input 'input_ids' is empty: the prompt must have at least one token"
    return (
        _out_of_vocab("input_ids", req.input_ids, vocab_size)
        or _special_id("end_id", req.end_id, vocab_size)
        or _special_id("pad_id", req.pad_id, vocab_size)
    )  # stop/bad word ids outside the vocabulary are harmless (they never match), as in TensorRT-LLM
