"""Per-request token selection: penalties, bad words, min_tokens, greedy / temperature / top-k / top-p, log-probs.

Why per request: every sequence in an in-flight batch carries its own sampling settings and its own seeded
``numpy.random.Generator`` so a request's output does not depend on what else is in the batch.

Greedy is used when temperature == 0, top_k == 1, or when no sampling knob (temperature, top_k, top_p) is set —
TensorRT-LLM's defaults are greedy too.  Log-probs are ``log_softmax`` of the processed logits (after penalties
and temperature, before top-k/top-p truncation), reported for the chosen token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .layers import log_softmax


@dataclass
class SamplingParams:
    """Upstream tensor names in comments (``tensorrt_llm`` model inputs)."""

    temperature: float | None = None  # temperature
    top_k: int | None = None  # runtime_top_k (0 = no limit)
    top_p: float | None = None  # runtime_top_p (0 or 1 = no limit)
    seed: int = 0  # seed (TensorRT-LLM's default is 0 as well)
    repetition_penalty: float | None = None  # repetition_penalty (prompt + output tokens, HF style)
    presence_penalty: float | None = None  # presence_penalty (output tokens)
    frequency_penalty: float | None = None  # frequency_penalty (output tokens)
    min_tokens: int = 0  # min_tokens: end_id is masked until this many tokens exist

    @property
    def greedy(self) -> bool:
        if self.temperature is not None and self.temperature <= 0.0:
            return True
        if self.top_k == 1:
            return True
        return self.temperature is None and not self.top_k and not (self.top_p and 0.0 < self.top_p < 1.0)

    def validate(self) -> None:
        """Refuse values that would poison a batch step (NaN/inf spread to every row's sampling)."""
        floats = {
            "temperature": self.temperature,
            "runtime_top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }
        for name, value in floats.items():
            if value is not None and not math.isfinite(value):
                raise ValueError(f"input '{name}' must be a finite number, got {value}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"input 'temperature' must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"input 'runtime_top_k' must be >= 0 (0 = no limit), got {self.top_k}")
        if self.top_p is not None and not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"input 'runtime_top_p' must be in [0, 1], got {self.top_p}")
        if self.repetition_penalty is not None and self.repetition_penalty <= 0:
            raise ValueError(f"input 'repetition_penalty' must be > 0, got {self.repetition_penalty}")
        if self.min_tokens < 0:
            raise ValueError(f"input 'min_tokens' must be >= 0, got {self.min_tokens}")


def apply_penalties(
    logits: np.ndarray, params: SamplingParams, prompt_ids: np.ndarray, output_ids: list[int]
) -> np.ndarray:
    """Repetition (prompt+output, divide positive / multiply negative logits), presence and frequency (output)."""
    rp = params.repetition_penalty
    if rp is not None and rp != 1.0:
        seen = np.unique(np.concatenate([prompt_ids, np.asarray(output_ids, np.int64)]).astype(np.int64))
        seen = seen[(seen >= 0) & (seen < logits.shape[-1])]
        vals = logits[seen]
        logits[seen] = np.where(vals > 0, vals / rp, vals * rp)
    if output_ids and (params.presence_penalty or params.frequency_penalty):
        ids, counts = np.unique(np.asarray(output_ids, np.int64), return_counts=True)
        keep = (ids >= 0) & (ids < logits.shape[-1])
        ids, counts = ids[keep], counts[keep]
        if params.presence_penalty:
            logits[ids] -= np.float32(params.presence_penalty)
        if params.frequency_penalty:
            logits[ids] -= np.float32(params.frequency_penalty) * counts.astype(np.float32)
    return logits


def ban_bad_words(logits: np.ndarray, bad_words: list[list[int]], context: list[int]) -> None:
    """Mask the last token of every bad word whose prefix matches the end of ``context`` (TRT-LLM semantics)."""
    for word in bad_words:
        if not word:
            continue
        prefix, last = word[:-1], word[-1]
        if 0 <= last < logits.shape[-1] and (not prefix or context[-len(prefix) :] == prefix):
            logits[last] = -np.inf


def _truncate(logits: np.ndarray, top_k: int | None, top_p: float | None) -> np.ndarray:
    """Keep the top-k and the smallest top-p nucleus; everything else becomes -inf."""
    out = logits
    if top_k and top_k < logits.shape[-1]:
        kth = np.partition(logits, -top_k)[-top_k]
        out = np.where(logits < kth, -np.inf, logits)
    if top_p and 0.0 < top_p < 1.0:
        order = np.argsort(-out, kind="stable")
        sorted_logits = out[order]
        probs = np.exp(sorted_logits - sorted_logits[0])
        probs /= probs.sum()
        cum = np.cumsum(probs)
        cutoff = int(np.searchsorted(cum, top_p, side="left")) + 1  # smallest prefix with mass >= top_p
        mask = np.full(out.shape, -np.inf, np.float32)
        mask[order[:cutoff]] = 0.0
        out = out + mask
    return out


def sample_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, float]:
    """Choose one token from processed (penalised, masked) logits; return (token, its log-prob)."""
    if params.greedy:
        token = int(np.argmax(logits))
        return token, float(log_softmax(logits)[token])
    temp = params.temperature if params.temperature else 1.0
    scaled = logits.astype(np.float64) / temp  # float64: a tiny temperature must not overflow to inf
    logp = log_softmax(scaled)
    truncated = _truncate(scaled, params.top_k, params.top_p)
    top = np.max(truncated)
    if not np.isfinite(top):  # every token masked (bad words, penalties): nothing to sample from
        token = int(np.argmax(scaled))
        return token, float(logp[token])
    probs = np.exp(truncated - top)
    probs /= probs.sum()
    token = int(rng.choice(len(probs), p=probs))
    return token, float(logp[token])
