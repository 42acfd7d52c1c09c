"""How long one engine step takes on the simulated GPU: a roofline per step, calibrated (profiles.py).

A step computes some prefill tokens (chunks of prompts, after cache reuse) and one token for each decoding
sequence. Each GPU of a tensor-parallel group holds 1/tp of the weights and of the KV cache and does 1/tp of the
arithmetic, and two all-reduces per layer join them. The step's time is the larger of
- reading: every weight once, plus the KV cache of every token attended (decoding sequences' whole contexts,
  prefill chunks' prefixes), at the HBM bandwidth reached;
- computing: 2 FLOP per parameter per token, plus attention's 4 · layers · heads · head_dim per (query, key)
  pair, at the tensor-core throughput reached;
plus a fixed cost per step and a cost per sequence, and with tensor parallelism the all-reduces' latency and
bytes over NVLink. Nothing here computes a model: the engine waits this long.
"""

from __future__ import annotations

from dataclasses import dataclass

from .profiles import GpuProfile, ModelFacts


@dataclass(frozen=True)
class StepWork:
    """What one step computes."""

    #: prompt tokens computed (not those found in the cache)
    prefill_tokens: int = 0
    #: (query, key) pairs of those tokens' attention: a chunk of c tokens after a prefix of p attends c·p + c²/2
    prefill_pairs: float = 0.0
    #: KV tokens the prefill chunks read (their cached prefixes)
    prefill_context: int = 0
    #: sequences decoding one token each, and their total context (prompt + tokens so far)
    decode_sequences: int = 0
    decode_context: int = 0

    @property
    def sequences(self) -> int:
        return self.decode_sequences + (1 if self.prefill_tokens else 0)


class StepTiming:
    """A model on `tp` GPUs of one profile."""

    def __init__(self, gpu: GpuProfile, model: ModelFacts, tp: int = 1) -> None:
        if tp < 1:
            raise ValueError(f"tp must be at least 1, got {tp}")
        self.gpu, self.model, self.tp = gpu, model, tp
        m = model
        #: weights read per step per GPU (the embedding table is looked up, not read whole)
        self.weight_bytes = (m.params - m.vocab * m.hidden) * m.weight_bytes / tp
        self.kv_token_bytes = m.kv_bytes_per_token / tp
        self.flop_per_token = 2.0 * m.params / tp
        self.flop_per_pair = 4.0 * m.layers * m.heads * m.head_dim / tp
        self._bw = gpu.bandwidth * gpu.bandwidth_efficiency
        self._fl = gpu.flops * gpu.flops_efficiency
        #: an all-reduce per attention and per MLP of every layer: its latency, and a ring's 2(tp-1)/tp of the
        #: activations (bf16) over NVLink
        self._comm_s = 2 * m.layers * gpu.allreduce_s if tp > 1 else 0.0
        self._comm_per_token_s = 2 * m.layers * 2 * (tp - 1) / tp * m.hidden * 2 / gpu.nvlink_bandwidth

    def step_s(self, work: StepWork) -> float:
        """Seconds the step takes; 0 for a step with nothing to compute."""
        tokens = work.prefill_tokens + work.decode_sequences
        if tokens == 0:
            return 0.0
        read = self.weight_bytes + (work.decode_context + work.prefill_context) * self.kv_token_bytes
        pairs = work.prefill_pairs + work.decode_context
        compute = tokens * self.flop_per_token + pairs * self.flop_per_pair
        g = self.gpu
        return (
            g.step_overhead_s
            + g.per_sequence_s * work.sequences
            + self._comm_s
            + self._comm_per_token_s * tokens
            + max(read / self._bw, compute / self._fl)
        )

    def kv_capacity_tokens(self, free_fraction: float) -> int:
        """KV tokens the GPU memory left after weights and activations holds, at `free_fraction` of it
        (kv_cache_config.free_gpu_memory_fraction, TensorRT-LLM's share of free memory for the cache)."""
        m, g = self.model, self.gpu
        weights = m.params * m.weight_bytes / self.tp
        free = g.memory_bytes - weights - g.activation_bytes
        return max(0, int(free * free_fraction / self.kv_token_bytes))
