"""Which token each row of a step takes, where the whole batch can be decided at once, and the stop-word rule.

Why apart from the engine loop: these are pure functions of the requests and the step's logits (no MPI, no
threads), the hot path of every decode step, and worth testing on their own.
"""

from __future__ import annotations

import numpy as np

from .sampling import apply_penalties, ban_bad_words, sample_token
from .scheduler import GenerationRequest


def plain_greedy(req: GenerationRequest) -> bool:
    """Greedy with nothing that edits the logits first (no penalties, bad words or active min_tokens)."""
    p = req.sampling
    return (
        p.greedy
        and not req.bad_words
        and (p.repetition_penalty is None or p.repetition_penalty == 1.0)
        and not p.presence_penalty
        and not p.frequency_penalty
        and (req.end_id is None or len(req.output_ids) >= p.min_tokens)
    )


def greedy_picks(reqs: list[GenerationRequest], logits: np.ndarray) -> list[tuple[int, float] | None]:
    """(token, log-prob) for every plain-greedy row, computed for the whole batch at once (the same arithmetic
    as ``sample_token`` row by row: argmax, then log_softmax at that token); None where the row needs the
    per-request path."""
    plain = [plain_greedy(r) for r in reqs]
    if not any(plain):
        return [None] * len(reqs)
    rows = np.flatnonzero(plain)
    x = logits if len(rows) == len(reqs) else logits[rows]
    tokens = np.argmax(x, axis=-1)
    shifted = x - np.max(x, axis=-1, keepdims=True)
    lse = np.log(np.sum(np.exp(shifted), axis=-1))
    logps = shifted[np.arange(len(rows)), tokens] - lse
    picks: list[tuple[int, float] | None] = [None] * len(reqs)
    for j, t, lp in zip(rows.tolist(), tokens.tolist(), logps.tolist(), strict=True):
        picks[j] = (t, lp)
    return picks


def hit_stop_word(req: GenerationRequest) -> bool:
    """Whether the output now ends with one of the request's stop words (token sequences)."""
    out = req.output_ids
    for word in req.stop_words:
        if word and len(out) >= len(word) and out[-len(word) :] == word:
            return True
    return False


def sampled_token(req: GenerationRequest, logits: np.ndarray) -> tuple[int, float]:
    """One request's token, sampled (its penalties, bad words and min_tokens applied to its own copy of the
    logits): what a row that `greedy_picks` could not decide takes."""
    p = req.sampling
    logits = np.array(logits, dtype=np.float32)  # own copy: penalties write in place
    apply_penalties(logits, p, req.input_ids, req.output_ids)
    if req.bad_words:
        ban_bad_words(logits, req.bad_words, req.input_ids.tolist() + req.output_ids)
    if req.end_id is not None and len(req.output_ids) < p.min_tokens and 0 <= req.end_id < logits.shape[-1]:
        logits[req.end_id] = -np.inf
    assert req.rng is not None  # seeded in Engine.submit()
    return sample_token(logits, p, req.rng)
