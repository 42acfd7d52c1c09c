"""Keep tensor-parallel ranks in lock step when a step goes wrong.

Why this exists: every rank runs the same :class:`~backend.cpu_engine.model.StepPlan` and meets its peers in
two all-reduces per layer.  If one rank raised half-way (a bad token id, a memory error), its peers would wait in
an all-reduce that never comes and the whole replica would hang or die.  So a step is checked the same way on
every rank before any collective (a rejected plan is skipped by all ranks together), a rank that fails inside the
forward pass still joins the all-reduces that were left (with zeros), and one last tiny all-reduce tells every
rank whether anybody failed.  The step's requests then fail with the reason; the ranks go on serving.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .model import StepPlan, TransformerShard


class StepFailed(RuntimeError):
    """This step did not run to the end on every rank; its requests must fail (the ranks stay in step)."""


class PlanRejected(StepFailed):
    """The plan breaks a limit of the model; every rank finds the same problem before any collective."""


def _check_ids(what: str, ids: np.ndarray, vocab: int) -> None:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = int(ids[(ids < 0) | (ids >= vocab)][0])
        raise PlanRejected(f"{what}: token id {bad} is outside the vocabulary [0, {vocab})")


def check_plan(shard: TransformerShard, plan: StepPlan) -> None:
    """Raise :class:`PlanRejected` when ``plan`` cannot run on ``shard``; deterministic, no communication."""
    vocab, slots, max_len = shard.cfg.vocab_size, shard.max_slots, shard.max_seq_len
    for src, dst in plan.moves:
        if not (0 <= src < slots and 0 <= dst < slots):
            raise PlanRejected(f"slot move {src}->{dst} outside 0..{slots - 1}")
    dec = np.asarray(plan.decode_tokens).reshape(-1)
    pos = np.asarray(plan.decode_positions).reshape(-1)
    if len(dec) != len(pos) or len(dec) > slots:
        raise PlanRejected(f"{len(dec)} decode tokens for {len(pos)} positions and {slots} slots")
    _check_ids("decode", dec, vocab)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= max_len):
        raise PlanRejected(f"decode position {int(pos.max())} is outside the context [0, {max_len})")
    if plan.starts and len(plan.starts) != len(plan.prefills):
        raise PlanRejected(f"{len(plan.starts)} prefill starts for {len(plan.prefills)} prefills")
    for (slot, ids), start in zip(plan.prefills, plan.starts or [0] * len(plan.prefills), strict=True):
        ids = np.asarray(ids).reshape(-1)
        if not 0 <= slot < slots:
            raise PlanRejected(f"prefill slot {slot} outside 0..{slots - 1}")
        if not (0 < len(ids) and 0 <= start and start + len(ids) <= max_len):
            raise PlanRejected(f"prompt of {start} + {len(ids)} tokens does not fit the context (1..{max_len})")
        _check_ids("prompt", ids, vocab)
    if (plan.loads or plan.saves) and plan.block_tokens < 1:
        raise PlanRejected(f"block work with blocks of {plan.block_tokens} tokens")


def collective_shapes(shard: TransformerShard, plan: StepPlan) -> Sequence[tuple[int, int]]:
    """The all-reduce buffer shapes of one forward pass, in order (two per layer: attention out, MLP out).

    Mirrors ``TransformerShard.forward``: every layer reduces all ``T`` rows except the last one, which only
    reduces the rows that produce logits (one per decode row, one per prompt)."""
    n_dec, n_pre = len(plan.decode_tokens), len(plan.prefills)
    rows = n_dec + sum(len(np.asarray(ids).reshape(-1)) for _, ids in plan.prefills)
    if rows == 0:
        return []
    hidden, layers = shard.cfg.hidden_size, len(shard.layers)
    return [(rows, hidden)] * (2 * (layers - 1)) + [(n_dec + n_pre, hidden)] * 2


def finish_collectives(shard: TransformerShard, plan: StepPlan, done: int) -> None:
    """Join the all-reduces this rank did not reach (with zeros), so its peers can leave the forward pass."""
    for shape in list(collective_shapes(shard, plan))[done:]:
        shard.comm.allreduce_sum(np.zeros(shape, np.float32))


def anyone_failed(shard: TransformerShard, failed_here: bool) -> bool:
    """One-element all-reduce: did any rank of this replica fail the step?"""
    if shard.comm.size == 1:
        return failed_here
    flag = shard.comm.allreduce_sum(np.array([1.0 if failed_here else 0.0], np.float32))
    return bool(flag[0] > 0)
