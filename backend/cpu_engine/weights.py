"""A transformer shard's weights: taken from a whole Hugging Face checkpoint (each rank slices its part), or
read from this rank's own file of a sharded checkpoint (`rank<r>.safetensors`, written by the build step,
backend/cpu_engine/shards.py), so a rank of a large model reads only its share.

Why a mixin of `TransformerShard` (backend/cpu_engine/model.py): loading is half of what the shard is, but none
of its forward pass; the split keeps both modules readable. The tensor-parallel layout (Megatron style: q/k/v,
gate/up and c_fc split by columns, o_proj/down/c_proj by rows, embeddings and lm_head replicated) is decided
here once, for both paths: a sharded file holds exactly the matrices a rank computes with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .checkpoint import CheckpointError, ModelConfig
from .layers import rope_tables
from .tensors import ShardedWeights

#: a sharded checkpoint's tensor names (TensorRT-LLM's convert_checkpoint spelling) → the shard's attributes
LAYER_TENSORS = {
    "input_layernorm.weight": "ln1_w",
    "input_layernorm.bias": "ln1_b",
    "attention.qkv.weight": "w_qkv",
    "attention.qkv.bias": "b_qkv",
    "attention.dense.weight": "w_o",
    "attention.dense.bias": "b_o",
    "post_layernorm.weight": "ln2_w",
    "post_layernorm.bias": "ln2_b",
    "mlp.fc.weight": "w_up",
    "mlp.fc.bias": "b_up",
    "mlp.proj.weight": "w_down",
    "mlp.proj.bias": "b_down",
}
MODEL_TENSORS = {
    "transformer.vocab_embedding.weight": "wte",
    "transformer.position_embedding.weight": "wpe",
    "transformer.ln_f.weight": "lnf_w",
    "transformer.ln_f.bias": "lnf_b",
    "lm_head.weight": "lm_head_w",
}


def _shard_cols(w: np.ndarray, parts: int, rank: int) -> np.ndarray:
    n = w.shape[-1]
    step = n // parts
    return w[..., rank * step : (rank + 1) * step]


def _shard_rows(w: np.ndarray, parts: int, rank: int) -> np.ndarray:
    n = w.shape[0]
    step = n // parts
    return w[rank * step : (rank + 1) * step]


@dataclass
class Layer:
    ln1_w: np.ndarray
    ln1_b: np.ndarray | None
    # matrices are stored [out, in] (C-contiguous) once loaded, see TransformerShard._linear
    w_qkv: np.ndarray  # [hidden, (Hl + 2*KVl) * D]
    b_qkv: np.ndarray | None
    w_o: np.ndarray  # [Hl*D, hidden]
    b_o: np.ndarray | None  # row-parallel bias: added once, after the all-reduce
    ln2_w: np.ndarray
    ln2_b: np.ndarray | None
    w_up: np.ndarray  # gpt2: c_fc [hidden, Il]; llama: [gate|up] [hidden, 2*Il]
    b_up: np.ndarray | None
    w_down: np.ndarray  # [Il, hidden]
    b_down: np.ndarray | None


class WeightLoading:
    """Fills a shard's weights (`layers`, `wte`, `wpe`, `lnf_w`, `lnf_b`, `lm_head_w`, RoPE tables); the shard
    sets `cfg`, `tp` and `rank` first."""

    cfg: ModelConfig
    tp: int
    rank: int
    layers: list[Layer]
    wte: np.ndarray
    wpe: np.ndarray | None
    lnf_w: np.ndarray
    lnf_b: np.ndarray | None
    lm_head_w: np.ndarray
    lm_head_t: np.ndarray
    rope_cos: np.ndarray | None
    rope_sin: np.ndarray | None

    def _load(self, weights: dict[str, np.ndarray]) -> None:
        """A whole checkpoint's tensors (HF names), or a sharded checkpoint (`ShardedWeights`): this rank's file."""
        if isinstance(weights, ShardedWeights):
            self._load_rank(weights.for_rank(self.tp, self.rank))
            return
        if self.cfg.family == "gpt2":
            self._load_gpt2(weights)
        else:
            self._load_llama(weights)
        for L in self.layers:
            for name in ("w_qkv", "w_o", "w_up", "w_down"):
                setattr(L, name, np.ascontiguousarray(getattr(L, name).T))
        self.lm_head_w = np.ascontiguousarray(self.lm_head_t.T)  # [V, hidden]
        del self.lm_head_t

    def _load_rank(self, tensors: dict[str, np.ndarray]) -> None:
        """This rank's tensors as `rank_tensors` wrote them: already split, fused and [out, in]."""

        def get(name: str, required: bool = True) -> np.ndarray | None:
            if name in tensors:
                return np.ascontiguousarray(tensors[name], dtype=np.float32)
            if required:
                raise CheckpointError(f"sharded checkpoint rank {self.rank} is missing tensor {name!r}")
            return None

        optional = {"ln1_b", "b_qkv", "b_o", "ln2_b", "b_up", "b_down"}
        self.layers = []
        for i in range(self.cfg.num_layers):
            fields = {
                attr: get(f"transformer.layers.{i}.{name}", attr not in optional)
                for name, attr in LAYER_TENSORS.items()
            }
            self.layers.append(Layer(**fields))  # type: ignore[arg-type]
        self.wte = get("transformer.vocab_embedding.weight")  # type: ignore[assignment]
        self.wpe = get("transformer.position_embedding.weight", self.cfg.family == "gpt2")
        self.lnf_w = get("transformer.ln_f.weight")  # type: ignore[assignment]
        self.lnf_b = get("transformer.ln_f.bias", self.cfg.family == "gpt2")
        self.lm_head_w = get("lm_head.weight")  # type: ignore[assignment]
        c = self.cfg
        self.rope_cos = self.rope_sin = None
        if c.family == "llama":
            self.rope_cos, self.rope_sin = rope_tables(c.head_dim, c.max_position_embeddings, c.rope_theta)

    def rank_tensors(self) -> dict[str, np.ndarray]:
        """This rank's weights under a sharded checkpoint's names (what `_load_rank` reads back)."""
        out: dict[str, np.ndarray] = {}
        for i, layer in enumerate(self.layers):
            for name, attr in LAYER_TENSORS.items():
                value = getattr(layer, attr)
                if value is not None:
                    out[f"transformer.layers.{i}.{name}"] = value
        for name, attr in MODEL_TENSORS.items():
            value = getattr(self, attr)
            if value is not None:
                out[name] = value
        return out

    @staticmethod
    def _get(weights: dict[str, np.ndarray], name: str, prefixes: tuple[str, ...]) -> np.ndarray:
        for p in prefixes:
            if p + name in weights:
                return weights[p + name]
        raise CheckpointError(f"checkpoint is missing tensor {name!r} (looked under prefixes {prefixes})")

    def _split_qkv_cols(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Column-parallel shard of q, k, v (each ``[..., heads*D]``) fused into one matrix for one GEMM."""
        return np.ascontiguousarray(
            np.concatenate(
                [
                    _shard_cols(q, self.tp, self.rank),
                    _shard_cols(k, self.tp, self.rank),
                    _shard_cols(v, self.tp, self.rank),
                ],
                axis=-1,
            ),
            dtype=np.float32,
        )

    def _load_gpt2(self, w: dict[str, np.ndarray]) -> None:
        c = self.cfg
        P = ("transformer.", "")
        g = lambda n: self._get(w, n, P).astype(np.float32)  # noqa: E731
        self.wte = g("wte.weight")
        self.wpe = g("wpe.weight")
        H = c.hidden_size
        self.layers: list[Layer] = []
        for i in range(c.num_layers):
            p = f"h.{i}."
            wa, ba = g(p + "attn.c_attn.weight"), g(p + "attn.c_attn.bias")
            self.layers.append(
                Layer(
                    ln1_w=g(p + "ln_1.weight"),
                    ln1_b=g(p + "ln_1.bias"),
                    w_qkv=self._split_qkv_cols(wa[:, :H], wa[:, H : 2 * H], wa[:, 2 * H :]),
                    b_qkv=self._split_qkv_cols(ba[:H], ba[H : 2 * H], ba[2 * H :]),
                    w_o=np.ascontiguousarray(_shard_rows(g(p + "attn.c_proj.weight"), self.tp, self.rank)),
                    b_o=g(p + "attn.c_proj.bias"),
                    ln2_w=g(p + "ln_2.weight"),
                    ln2_b=g(p + "ln_2.bias"),
                    w_up=np.ascontiguousarray(_shard_cols(g(p + "mlp.c_fc.weight"), self.tp, self.rank)),
                    b_up=np.ascontiguousarray(_shard_cols(g(p + "mlp.c_fc.bias"), self.tp, self.rank)),
                    w_down=np.ascontiguousarray(_shard_rows(g(p + "mlp.c_proj.weight"), self.tp, self.rank)),
                    b_down=g(p + "mlp.c_proj.bias"),
                )
            )
        self.lnf_w, self.lnf_b = g("ln_f.weight"), g("ln_f.bias")
        lm = w.get("lm_head.weight")
        self.lm_head_t = np.ascontiguousarray((self.wte if lm is None else lm.astype(np.float32)).T)
        self.rope_cos = self.rope_sin = None

    def _load_llama(self, w: dict[str, np.ndarray]) -> None:
        c = self.cfg
        P = ("model.", "")
        g = lambda n: self._get(w, n, P).astype(np.float32)  # noqa: E731
        opt: Callable[[str], Any] = lambda n: next((w[p + n].astype(np.float32) for p in P if p + n in w), None)  # noqa: E731
        self.wte = g("embed_tokens.weight")
        self.wpe = None
        self.layers = []
        for i in range(c.num_layers):
            p = f"layers.{i}."
            q, k, v = (g(p + f"self_attn.{n}_proj.weight").T for n in "qkv")
            bq, bk, bv = (opt(p + f"self_attn.{n}_proj.bias") for n in "qkv")
            gate, up = g(p + "mlp.gate_proj.weight").T, g(p + "mlp.up_proj.weight").T
            bgate, bup = opt(p + "mlp.gate_proj.bias"), opt(p + "mlp.up_proj.bias")
            bo, bdown = opt(p + "self_attn.o_proj.bias"), opt(p + "mlp.down_proj.bias")
            self.layers.append(
                Layer(
                    ln1_w=g(p + "input_layernorm.weight"),
                    ln1_b=None,
                    w_qkv=self._split_qkv_cols(q, k, v),
                    b_qkv=None if bq is None else self._split_qkv_cols(bq, bk, bv),
                    w_o=np.ascontiguousarray(_shard_rows(g(p + "self_attn.o_proj.weight").T, self.tp, self.rank)),
                    b_o=bo,
                    ln2_w=g(p + "post_attention_layernorm.weight"),
                    ln2_b=None,
                    w_up=np.ascontiguousarray(
                        np.concatenate(
                            [_shard_cols(gate, self.tp, self.rank), _shard_cols(up, self.tp, self.rank)], axis=-1
                        )
                    ),
                    b_up=None
                    if bgate is None
                    else np.concatenate([_shard_cols(bgate, self.tp, self.rank), _shard_cols(bup, self.tp, self.rank)]),
                    w_down=np.ascontiguousarray(_shard_rows(g(p + "mlp.down_proj.weight").T, self.tp, self.rank)),
                    b_down=bdown,
                )
            )
        self.lnf_w, self.lnf_b = g("norm.weight"), None
        lm = next((w[n] for n in ("lm_head.weight",) if n in w), None)
        if lm is None:
            if not c.tie_word_embeddings:
                raise CheckpointError("checkpoint has no lm_head.weight and tie_word_embeddings is false")
            lm = self.wte
        self.lm_head_t = np.ascontiguousarray(lm.astype(np.float32).T)
        self.rope_cos, self.rope_sin = rope_tables(c.head_dim, c.max_position_embeddings, c.rope_theta)
