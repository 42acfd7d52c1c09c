"""The decoder-only transformer (GPT-2 / Llama) as one tensor-parallel shard with a slot-based KV cache.

Why slots: in-flight batching decodes every active sequence in one batched numpy call.  Active sequences occupy
slots ``0..B-1`` of a preallocated cache ``[slots, kv_heads, capacity, head_dim]`` so the batched attention can
use a *view* ``cache[:B, :, :max_len]`` (no gather); when a sequence leaves, the last one is moved into its slot.
Per-sequence lengths are honoured with a mask.  The token *budget* (admission) lives in ``scheduler.py``.

One forward per engine step: the decode rows and every prompt admitted in that step are concatenated (ragged) and
go through the linear layers as one GEMM; only attention is split (decode rows over the cache, prompts padded to
the longest with a causal mask), and the last layer runs its o-proj/MLP only for the rows that produce logits.

Tensor parallelism (Megatron style): q/k/v, gate/up and c_fc are split by columns (heads / intermediate units),
o_proj/down/c_proj by rows, followed by one all-reduce each; embeddings and lm_head are replicated and only the
leader computes logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .checkpoint import CheckpointError, ModelConfig
from .layers import apply_rope, gelu_new, layer_norm, rms_norm, silu, softmax
from .lockstep import StepFailed, anyone_failed, check_plan, finish_collectives
from .parallel import Communicator, SingleComm
from .prefix_cache import BlockStore
from .weights import Layer as _Layer
from .weights import WeightLoading


@dataclass
class StepPlan:
    """Everything one engine iteration asks of every rank (broadcast by the leader in TP mode).

    ``moves``: (src, dst) slot copies done first (compaction after sequences left).
    ``decode_tokens/decode_positions``: one new token per running sequence, slots ``0..B-1``.
    ``prefills``: (slot, token ids) for newly admitted sequences, written from position ``starts[i]`` (0 when
    ``starts`` is empty): the positions before it were copied from cached blocks (prefix_cache.py), which
    ``loads`` (slot, block ids) does before the forward; ``saves`` (slot, [(block position, id)]) keeps blocks of
    this step's prompts after it, ``drops`` evicts; blocks hold ``block_tokens`` tokens.
    """

    moves: list[tuple[int, int]] = field(default_factory=list)
    decode_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    decode_positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    prefills: list[tuple[int, np.ndarray]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    loads: list[tuple[int, list[int]]] = field(default_factory=list)
    saves: list[tuple[int, list[tuple[int, int]]]] = field(default_factory=list)
    drops: list[int] = field(default_factory=list)
    block_tokens: int = 0


class TransformerShard(WeightLoading):
    """One rank's share of the model plus its share of the KV cache."""

    wpe: np.ndarray | None  # GPT-2's learned positions; None for Llama (RoPE)
    lnf_b: np.ndarray | None  # the final norm's bias (LayerNorm); None for RMSNorm
    rope_cos: np.ndarray | None  # RoPE tables (Llama); None for GPT-2
    rope_sin: np.ndarray | None

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, np.ndarray],
        comm: Communicator | None = None,
        max_slots: int = 8,
        max_seq_len: int | None = None,
    ) -> None:
        self.cfg = config
        self.comm = comm or SingleComm()
        tp, rank = self.comm.size, self.comm.rank
        if config.num_heads % tp or config.num_kv_heads % tp:
            raise CheckpointError(
                f"tp_size {tp} must divide num_heads {config.num_heads} and num_kv_heads {config.num_kv_heads}"
            )
        if config.intermediate_size % tp:
            raise CheckpointError(f"tp_size {tp} must divide intermediate_size {config.intermediate_size}")
        self.tp, self.rank = tp, rank
        self.n_heads = config.num_heads // tp
        self.n_kv = config.num_kv_heads // tp
        self.head_dim = config.head_dim
        self.inter = config.intermediate_size // tp
        self.max_slots = max_slots
        self.max_seq_len = min(max_seq_len or config.max_position_embeddings, config.max_position_embeddings)
        self.scale = np.float32(1.0 / np.sqrt(self.head_dim))
        self.compute_logits = rank == 0
        self._load(weights)  # backend/cpu_engine/weights.py: a whole checkpoint, or this rank's file of a sharded one
        self._reduces_done = 0
        self.capacity = 0
        self.k_cache: list[np.ndarray] = []
        #: this rank's share of the cached prompt blocks (prefix_cache.py); made by the first plan that uses it
        self.blocks: BlockStore | None = None
        self.v_cache: list[np.ndarray] = []
        self._ensure_capacity(min(64, self.max_seq_len))

    # ------------------------------------------------------------------ KV cache
    def _ensure_capacity(self, needed: int) -> None:
        """Grow the per-slot capacity (amortised doubling, in 64-token steps, capped at max_seq_len)."""
        if needed <= self.capacity:
            return
        if needed > self.max_seq_len:
            raise ValueError(f"sequence length {needed} exceeds max_seq_len {self.max_seq_len}")
        new_cap = min(self.max_seq_len, max(needed, 2 * self.capacity))
        new_cap = min(self.max_seq_len, -(-new_cap // 64) * 64)
        shape = (self.max_slots, self.n_kv, new_cap, self.head_dim)
        new_k, new_v = [], []
        for i in range(self.cfg.num_layers):
            k = np.zeros(shape, np.float32)
            v = np.zeros(shape, np.float32)
            if self.capacity:
                k[:, :, : self.capacity] = self.k_cache[i]
                v[:, :, : self.capacity] = self.v_cache[i]
            new_k.append(k)
            new_v.append(v)
        self.k_cache, self.v_cache, self.capacity = new_k, new_v, new_cap

    def kv_cache_bytes(self) -> int:
        """Bytes held by this rank's KV cache arrays (for logs)."""
        return sum(a.nbytes for a in self.k_cache) + sum(a.nbytes for a in self.v_cache)

    # ------------------------------------------------------------------ forward
    @staticmethod
    def _linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """``x [T, in] @ w.T`` for ``w`` stored ``[out, in]``, computed as ``(w @ x.T).T``.

        Why: with few rows (decode) OpenBLAS's sgemm is markedly faster with the weight as the left operand
        (docs/decisions.md "The CPU engine's linear layers").  The result is a transposed
        (F-ordered) view; elementwise ops keep that order, and the next ``_linear`` turns it back into a
        contiguous right operand, so nothing is copied.
        """
        return (w @ x.T).T

    def _norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        if self.cfg.family == "gpt2":
            return layer_norm(x, w, b, self.cfg.norm_eps)
        return rms_norm(x, w, self.cfg.norm_eps)

    def _mlp(self, L: _Layer, h: np.ndarray) -> np.ndarray:
        up = self._linear(h, L.w_up)
        if L.b_up is not None:
            up += L.b_up
        if self.cfg.family == "gpt2":
            act = gelu_new(up)
        else:
            act = silu(up[..., : self.inter]) * up[..., self.inter :]
        out = self._linear(act, L.w_down)
        out = self._allreduce(out)
        if L.b_down is not None:
            out += L.b_down
        return out

    def _qkv(self, L: _Layer, h: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Project ``h [T, hidden]`` to q ``[T, Hl, D]``, k/v ``[T, KVl, D]`` (RoPE applied for Llama)."""
        qkv = self._linear(h, L.w_qkv)
        if L.b_qkv is not None:
            qkv += L.b_qkv
        T, D = h.shape[0], self.head_dim
        nq, nk = self.n_heads * D, self.n_kv * D
        q = qkv[:, :nq].reshape(T, self.n_heads, D)
        k = qkv[:, nq : nq + nk].reshape(T, self.n_kv, D)
        v = qkv[:, nq + nk :].reshape(T, self.n_kv, D)
        if self.rope_cos is not None and self.rope_sin is not None:
            cos = self.rope_cos[positions][:, None, :]
            sin = self.rope_sin[positions][:, None, :]
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        return q, k, v

    def _allreduce(self, buf: np.ndarray) -> np.ndarray:
        """All-reduce counted, so a rank that fails mid-step knows how many its peers still wait for."""
        out = self.comm.allreduce_sum(buf)
        self._reduces_done += 1
        return out

    def _embed(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        x = self.wte[tokens]
        if self.wpe is not None:
            x = x + self.wpe[positions]
        return x.astype(np.float32, copy=False)

    def _attn_out(self, L: _Layer, attn: np.ndarray) -> np.ndarray:
        out = self._linear(attn, L.w_o)
        out = self._allreduce(out)
        if L.b_o is not None:
            out += L.b_o
        return out

    def _logits(self, h: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(self._linear(self._norm(h, self.lnf_w, self.lnf_b), self.lm_head_w))

    def prefill(self, slot: int, tokens: np.ndarray) -> np.ndarray | None:
        """Run a whole prompt into ``slot`` (positions 0..P-1); return last-position logits (leader) or None."""
        logits = self.forward(np.zeros(0, np.int64), np.zeros(0, np.int64), [(slot, tokens)])
        return None if logits is None else logits[0]

    def decode(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
        """One token for each sequence in slots ``0..B-1`` at its own position; return logits ``[B, V]`` (leader)."""
        return self.forward(tokens, positions, [])

    def forward(
        self,
        decode_tokens: np.ndarray,
        decode_positions: np.ndarray,
        prefills: list[tuple[int, np.ndarray]],
        starts: list[int] | None = None,
    ) -> np.ndarray | None:
        """One forward pass over every row of the step: ``B`` decode tokens (slots ``0..B-1``) followed by the
        concatenated prompts of ``prefills`` (ragged, each from its position in ``starts``, default 0: the cache
        holds the positions before it).  Returns logits ``[B + N, V]`` (decode rows, then the last position of each
        prompt) on the leader, None elsewhere.

        Why one pass: the linear layers (most of the FLOPs) run as one GEMM over all rows of the step instead of
        one small GEMM per prompt, and TP does one all-reduce per layer half instead of one per prompt.  Attention
        is the only per-sequence part: decode rows attend over the cache view ``[:B, :, :max_len]`` with a
        length mask; prompts are padded to the longest one and attend causally in one batched matmul.
        """
        dec_tok = np.asarray(decode_tokens, np.int64).reshape(-1)
        dec_pos = np.asarray(decode_positions, np.int64).reshape(-1)
        B, N = len(dec_tok), len(prefills)
        lens = np.array([len(ids) for _, ids in prefills], np.int64)
        begins = np.array(starts or [0] * N, np.int64)
        ends = begins + lens  # each prompt's keys: its cached positions and its new ones
        pre_slots = np.array([slot for slot, _ in prefills], np.int64)
        parts_tok = [dec_tok] + [np.asarray(ids, np.int64).reshape(-1) for _, ids in prefills]
        parts_pos = [dec_pos] + [np.arange(b, e, dtype=np.int64) for b, e in zip(begins, ends, strict=True)]
        tokens = np.concatenate(parts_tok) if N else dec_tok
        positions = np.concatenate(parts_pos) if N else dec_pos
        T = len(tokens)
        if T == 0:
            return None
        max_len = int(dec_pos.max()) + 1 if B else 0
        p_max = int(lens.max()) if N else 0
        k_max = int(ends.max()) if N else 0
        self._ensure_capacity(max(max_len, k_max))
        # cache coordinates of every row (decode rows live in slots 0..B-1)
        row_slot = np.concatenate([np.arange(B, dtype=np.int64), np.repeat(pre_slots, lens)]) if N else np.arange(B)
        D, Hl, KVl = self.head_dim, self.n_heads, self.n_kv
        g = Hl // KVl
        if B:
            dec_mask = np.where(np.arange(max_len)[None, :] > dec_pos[:, None], -np.inf, 0.0).astype(np.float32)
            dec_mask = dec_mask[:, None, None, :]  # [B, 1, 1, L]
        if N:
            row_starts = B + np.concatenate([[0], np.cumsum(lens)[:-1]])
            ar = np.arange(p_max)
            # padded [N, Pmax] -> row index (padding repeats a prompt's last row; those outputs are dropped)
            pad_rows = row_starts[:, None] + np.minimum(ar[None, :], lens[:, None] - 1)
            valid = (ar[None, :] < lens[:, None]).reshape(-1)
            # query q of prompt i (position begins[i] + q) sees keys 0..begins[i] + q: [N, 1, 1, Pmax, Kmax]
            seen = np.arange(k_max)[None, None, :] <= (begins[:, None, None] + ar[None, :, None])
            causal = np.where(seen, 0.0, -np.inf).astype(np.float32)[:, None, None]
            s0 = int(pre_slots[0])
            contiguous = bool(np.array_equal(pre_slots, np.arange(s0, s0 + N)))
        last_rows = np.concatenate([np.arange(B), B + np.cumsum(lens) - 1]) if N else None
        x = self._embed(tokens, positions)
        n_layers = len(self.layers)
        for i, L in enumerate(self.layers):
            h = self._norm(x, L.ln1_w, L.ln1_b)
            q, k, v = self._qkv(L, h, positions)
            kc, vc = self.k_cache[i], self.v_cache[i]
            kc[row_slot, :, positions] = k
            vc[row_slot, :, positions] = v
            outs = []
            if B:
                qh = q[:B].reshape(B, KVl, g, D)
                kview = kc[:B, :, :max_len]  # [B, KVl, L, D] (view)
                vview = vc[:B, :, :max_len]
                scores = qh @ kview.transpose(0, 1, 3, 2)  # [B, KVl, g, L]
                scores *= self.scale
                scores += dec_mask
                outs.append((softmax(scores) @ vview).reshape(B, Hl * D))
            if N:
                # q [N, Pmax, Hl, D] -> [N, KVl, g, Pmax, D]; k/v from the cache just written: [N, KVl, 1, Pmax, D]
                qp = q[pad_rows].reshape(N, p_max, KVl, g, D).transpose(0, 2, 3, 1, 4)
                if contiguous:
                    kp, vp = kc[s0 : s0 + N, :, :k_max], vc[s0 : s0 + N, :, :k_max]
                else:
                    kp, vp = kc[pre_slots, :, :k_max], vc[pre_slots, :, :k_max]
                scores = qp @ kp[:, :, None].transpose(0, 1, 2, 4, 3)  # [N, KVl, g, Pmax, Pmax]
                scores *= self.scale
                scores += causal
                attn = softmax(scores) @ vp[:, :, None]  # [N, KVl, g, Pmax, D]
                attn = attn.transpose(0, 3, 1, 2, 4).reshape(N * p_max, Hl * D)
                outs.append(attn[valid])
            attn = outs[0] if len(outs) == 1 else np.concatenate(outs)
            if i == n_layers - 1 and last_rows is not None:
                # only the rows that produce logits matter after the last layer's attention
                x, attn = x[last_rows], attn[last_rows]
            x = x + self._attn_out(L, attn)
            x = x + self._mlp(L, self._norm(x, L.ln2_w, L.ln2_b))
        if not self.compute_logits:
            return None
        return self._logits(x)

    def move_slot(self, src: int, dst: int) -> None:
        """Copy a sequence's cache from ``src`` to ``dst`` (compaction when a sequence leaves)."""
        for kc, vc in zip(self.k_cache, self.v_cache, strict=True):
            kc[dst] = kc[src]
            vc[dst] = vc[src]

    def _load_blocks(self, plan: StepPlan) -> None:
        """Copy the cached blocks each prompt starts with into its slot (prefix_cache.py)."""
        if not plan.loads:
            return
        if self.blocks is None:
            self.blocks = BlockStore(plan.block_tokens)
        self._ensure_capacity(max(len(found) * plan.block_tokens for _, found in plan.loads))
        for slot, found in plan.loads:
            self.blocks.load(self.k_cache, self.v_cache, slot, found)

    def _keep_blocks(self, plan: StepPlan) -> None:
        """Keep this step's new prompt blocks, and drop the evicted ones (prefix_cache.py)."""
        if self.blocks is None and plan.saves:
            self.blocks = BlockStore(plan.block_tokens)
        if self.blocks is None:
            return
        for slot, kept in plan.saves:
            self.blocks.save(self.k_cache, self.v_cache, slot, kept)
        self.blocks.drop(plan.drops)

    def run_step(self, plan: StepPlan) -> tuple[np.ndarray | None, list[np.ndarray | None]]:
        """Execute a :class:`StepPlan`; every rank calls this with the same plan (collectives stay in lock-step).

        Returns (decode logits ``[B, V]`` or None, one ``[V]`` logits row per prefill) on the leader; Nones elsewhere.
        Raises :class:`StepFailed` on every rank when the plan was rejected or any rank failed during it; the
        ranks are still in step afterwards (see ``lockstep.py``), so the caller fails the step's requests only.
        """
        check_plan(self, plan)  # same verdict on every rank, before any collective
        self._reduces_done = 0
        error: BaseException | None = None
        logits = None
        try:
            for src, dst in plan.moves:
                self.move_slot(src, dst)
            self._load_blocks(plan)
            logits = self.forward(plan.decode_tokens, plan.decode_positions, plan.prefills, plan.starts)
            self._keep_blocks(plan)
        except Exception as e:  # noqa: BLE001 - reported below, after the peers were released
            error = e
            finish_collectives(self, plan, self._reduces_done)
        if anyone_failed(self, error is not None):
            reason = f"{type(error).__name__}: {error}" if error else "a tensor-parallel peer rank failed this step"
            raise StepFailed(f"engine step failed: {reason}") from error
        B = len(plan.decode_tokens)
        if logits is None:
            return None, [None] * len(plan.prefills)
        return (logits[:B] if B else None), list(logits[B:])
