"""Numpy building blocks (fp32) matching the Hugging Face reference implementations numerically.

Kept as plain functions over arrays so the model file reads like the math and tests can check them one by one.
"""

from __future__ import annotations

import numpy as np

_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """LayerNorm over the last axis (GPT-2).  (Few temporaries, in-place steps: this runs 2x per layer per step.)"""
    inv_n = np.float32(1.0 / x.shape[-1])
    mean = np.add.reduce(x, axis=-1, keepdims=True)
    mean *= inv_n
    xc = x - mean
    var = np.add.reduce(xc * xc, axis=-1, keepdims=True)
    var *= inv_n
    var += np.float32(eps)
    np.sqrt(var, out=var)
    xc /= var
    xc *= weight
    if bias is not None:
        xc += bias
    return xc


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis (Llama)."""
    var = np.add.reduce(x * x, axis=-1, keepdims=True)
    var *= np.float32(1.0 / x.shape[-1])
    var += np.float32(eps)
    np.sqrt(var, out=var)
    out = x / var
    out *= weight
    return out


def gelu_new(x: np.ndarray) -> np.ndarray:
    """GPT-2's tanh-approximated GELU (HF ``gelu_new``): 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))."""
    t = x * x
    t *= np.float32(0.044715)
    t += np.float32(1.0)
    t *= x
    t *= _SQRT_2_OVER_PI
    np.tanh(t, out=t)
    t += np.float32(1.0)
    t *= x
    t *= np.float32(0.5)
    return t


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU / swish (Llama MLP gate)."""
    return x / (np.float32(1.0) + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax; ``-inf`` entries get probability 0."""
    e = x - np.max(x, axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=axis, keepdims=True)
    return e


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(softmax(x)) without forming the probabilities."""
    m = np.max(x, axis=axis, keepdims=True)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def rope_tables(head_dim: int, max_positions: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables ``[max_positions, head_dim]`` in HF's non-interleaved (rotate_half) layout."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    inv_freq = inv_freq.astype(np.float32)
    freqs = np.arange(max_positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate ``x [..., tokens, heads, head_dim]`` with ``cos/sin [..., tokens, 1, head_dim]`` (rotate_half form)."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin
