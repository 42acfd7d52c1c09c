"""The simulated engine's one table of facts: the GPUs it can stand in for, the models whose checkpoints
`model.init` writes for it, and the calibration constants of its timing model (timing.py). Every figure is
published or derived; docs/decisions.md "A simulated engine at a GPU's pace" cites each and shows the calibration
against TensorRT-LLM's published throughput.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30


@dataclass(frozen=True)
class GpuProfile:
    """One GPU: its hardware facts (NVIDIA's data sheets) and the timing model's calibration constants
    (fitted to TensorRT-LLM's perf overview by `python -m backend.sim_engine.calibrate`)."""

    name: str
    memory_bytes: int
    #: HBM bandwidth, bytes/s
    bandwidth: float
    #: dense FP8 tensor-core throughput, FLOP/s (the published models are FP8)
    flops: float
    #: the share of `bandwidth` / `flops` a step reaches (calibrated)
    bandwidth_efficiency: float
    flops_efficiency: float
    #: a step's fixed cost: launch, scheduling, sampling, s (calibrated)
    step_overhead_s: float
    #: each sequence of a step adds this much (sampling, the scheduler's per-request work), s (calibrated)
    per_sequence_s: float
    #: an all-reduce's latency (two per layer with tensor parallelism), s: NVLink, order of magnitude
    allreduce_s: float = 8e-6
    #: NVLink bandwidth one way, bytes/s: 900 GB/s both ways on H100 and H200 SXM (data sheets)
    nvlink_bandwidth: float = 450e9
    #: memory the runtime keeps for activations and workspace before the KV cache is sized, bytes (assumed)
    activation_bytes: int = 4 * GIB


#: the GPUs of TensorRT-LLM's perf overview's "Hardware" list that hpc-serve simulates (SXM parts)
GPUS: dict[str, GpuProfile] = {
    g.name: g
    for g in (
        # H100 SXM 80GB: 80 GB HBM3, 3.35 TB/s, 1,979 TFLOPS FP8 dense (NVIDIA H100 data sheet)
        GpuProfile(
            name="h100",
            memory_bytes=80 * 10**9,
            bandwidth=3.35e12,
            flops=1979e12,
            bandwidth_efficiency=0.80,
            flops_efficiency=0.56,
            step_overhead_s=2.0e-3,
            per_sequence_s=4e-6,
        ),
        # H200 SXM 141GB: 141 GB HBM3e, 4.8 TB/s, same compute as H100 (NVIDIA H200 data sheet)
        GpuProfile(
            name="h200",
            memory_bytes=141 * 10**9,
            bandwidth=4.8e12,
            flops=1979e12,
            bandwidth_efficiency=0.62,
            flops_efficiency=0.56,
            step_overhead_s=2.0e-3,
            per_sequence_s=4e-6,
        ),
    )
}
DEFAULT_GPU = "h200"


@dataclass(frozen=True)
class ModelFacts:
    """What the timing model and the KV cache need of a model, read from its config.json."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tied: bool = False
    #: bytes per weight and per KV element: FP8, as the published runs (nvidia/Llama-3.1-8B-Instruct-FP8 ...)
    weight_bytes: float = 1.0
    kv_bytes: float = 1.0

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelFacts:
        """A Llama-style config.json (Llama, Mistral, Qwen spellings)."""
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            max_positions=int(config.get("max_position_embeddings", 8192)),
            tied=bool(config.get("tie_word_embeddings", False)),
        )

    @property
    def params(self) -> int:
        """Parameters: embeddings, per layer attention (q, k, v, o) + gated MLP + two norms, final norm, head."""
        attn = self.hidden * self.heads * self.head_dim * 2 + 2 * self.hidden * self.kv_heads * self.head_dim
        layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * layer + self.hidden

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token, the whole model (tensor parallelism splits it)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes


#: the checkpoints `model.init` writes for the simulated engine: the published config.json values of Meta's
#: meta-llama/Llama-3.1-8B-Instruct and meta-llama/Llama-3.1-70B-Instruct (token ids are the trained tokenizer's)
MODELS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
    "llama-3.1-70b": {
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
}
#: what both share (Llama 3.1's config.json)
LLAMA_31_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
DEFAULT_MODEL = "llama-3.1-8b"


def model_config(name: str) -> dict[str, Any]:
    """config.json's values for one of MODELS (no token ids: the checkpoint's tokenizer gives them)."""
    return {**LLAMA_31_COMMON, **MODELS[name]}
