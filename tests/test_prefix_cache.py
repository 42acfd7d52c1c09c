"""KV-cache block reuse in the CPU engine (backend/cpu_engine/prefix_cache.py), TensorRT-LLM's
`enable_block_reuse`: a prompt that starts with blocks an earlier prompt computed copies them, and its tokens are
exactly those of an engine that computes everything (GPT-2's learned positions and Llama's RoPE alike); the
counts are the blocks really copied; the cache holds only what the KV budget has free, least recently used out
first. Across two ranks: tests/test_cpu_engine_tp.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend.cpu_engine.engine import Engine
from backend.cpu_engine.init_model import create_checkpoint
from backend.cpu_engine.prefix_cache import BlockIndex
from backend.cpu_engine.sampling import SamplingParams
from backend.cpu_engine.scheduler import GenerationRequest

BLOCK = 4
DOC = list(range(30, 67))  # 37 tokens: 9 full blocks and one token


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def ckpt(request, tmp_path_factory) -> Path:
    return Path(create_checkpoint(tmp_path_factory.mktemp("ck") / request.param, family=request.param, seed=7))


def _requests() -> list[GenerationRequest]:
    """Questions on one document, greedy and sampled, then one on another document."""
    tails = [[5, 6], [7], [], [8, 9, 10, 11, 12]]
    out = []
    for i, tail in enumerate(tails):
        sampling = SamplingParams(temperature=0.9, top_k=20, seed=40 + i) if i % 2 else SamplingParams()
        out.append(GenerationRequest(input_ids=DOC + tail, max_new_tokens=10, sampling=sampling))
    out.append(GenerationRequest(input_ids=list(range(100, 141)), max_new_tokens=10))
    return out


def _serve(ckpt: Path, **engine) -> list[GenerationRequest]:
    """Each request alone, in order (so a later one finds what an earlier one left)."""
    eng = Engine(str(ckpt), max_batch_size=4, block_size=BLOCK, **engine)
    return [eng.generate(r) for r in _requests()]


@pytest.mark.slow
def test_reused_blocks_give_the_tokens_computing_them_gives(ckpt):
    plain, reused = _serve(ckpt), _serve(ckpt, block_reuse=True)
    assert [r.output_ids for r in reused] == [r.output_ids for r in plain]
    for a, b in zip(reused, plain, strict=True):
        assert np.allclose(a.log_probs, b.log_probs, atol=1e-4)
    # the first finds nothing; the others on the document find its 9 full blocks (the last token is computed:
    # the bare document has 37 tokens, so it finds all 9); the other document finds none
    assert [r.kv_blocks_reused for r in reused] == [0, 9, 9, 9, 0]
    assert [r.kv_blocks_reused for r in plain] == [0] * 5


def test_a_prompt_of_whole_blocks_computes_its_last_token_itself():
    index = BlockIndex(BLOCK)
    assert index.place(list(range(8))).found == [] and len(index) == 2
    again = index.place(list(range(8)))
    assert len(again.found) == 1 and again.start == BLOCK and again.keep == [], "block 2 holds the last token"
    longer = index.place(list(range(9)))
    assert len(longer.found) == 2 and longer.start == 8


def test_only_the_same_whole_prefix_is_reused():
    index = BlockIndex(BLOCK)
    index.place([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(index.place([1, 2, 3, 4, 0, 6, 7, 8, 9]).found) == 1, "block 2 follows another block 1"
    assert index.place([0, 2, 3, 4, 5, 6, 7, 8, 9]).found == []


def test_the_cache_keeps_what_the_budget_has_free_least_recently_used_out_first():
    index = BlockIndex(BLOCK)
    a, b = [1] * 9, [2] * 9  # two blocks each
    first, second = index.place(a), index.place(b)
    index.place(a)  # a used last
    dropped = index.evict_to(3)
    assert dropped == [second.keep[1][1]], "b was least recently used, and its second block goes first"
    assert index.evict_to(2) == [second.keep[0][1]]
    assert [block for _, block in first.keep] == index.place(a).found
    assert index.evict_to(0, keep=index.place(a).found) == [] and len(index) == 2, "blocks a step uses stay"


def test_a_small_budget_evicts_from_a_prefixs_end_and_the_counts_say_so(ckpt):
    """A KV budget of 16 blocks: a request of 37 + 10 tokens holds 12, leaving 4 free, so of its 9 prompt blocks
    the cache keeps 4 once it decodes: the document's first 4 (eviction shortens a prefix from its end). The
    next question on it copies those 4 and computes the rest."""
    eng = Engine(str(ckpt), max_batch_size=1, block_size=BLOCK, block_reuse=True, max_tokens_in_kv_cache=16 * BLOCK)
    first = eng.generate(GenerationRequest(input_ids=DOC, max_new_tokens=10))
    again = eng.generate(GenerationRequest(input_ids=DOC + [5], max_new_tokens=10))
    assert (first.kv_blocks_reused, again.kv_blocks_reused) == (0, 4)
    plain = Engine(str(ckpt), max_batch_size=1, block_size=BLOCK)
    assert again.output_ids == plain.generate(GenerationRequest(input_ids=DOC + [5], max_new_tokens=10)).output_ids


def test_a_failed_step_forgets_every_block(ckpt):
    eng = Engine(str(ckpt), max_batch_size=2, block_size=BLOCK, block_reuse=True)
    eng.generate(GenerationRequest(input_ids=DOC, max_new_tokens=2))
    assert len(eng.reuse.index) == 9
    real = eng.shard.forward

    def failing(*args, **kwargs):
        raise MemoryError("injected")

    eng.shard.forward = failing
    failed = eng.submit(GenerationRequest(input_ids=DOC + [1], max_new_tokens=2))
    assert eng.step_or_fail() and failed.finish_reason == "error"
    eng.shard.forward = real
    assert len(eng.reuse.index) == 0, "the failed step's blocks may not be on every rank"
    after = eng.generate(GenerationRequest(input_ids=DOC + [1], max_new_tokens=2))
    assert after.kv_blocks_reused == 0 and after.finish_reason == "length"
    assert eng.shard.blocks is not None and len(eng.shard.blocks) == 9, "the next plan dropped the old ones"


def test_prompts_admitted_in_one_step_do_not_copy_what_that_step_computes(ckpt):
    """Two questions on a new document in one step: neither finds the other's blocks (they exist only after the
    step's forward), both compute them, and the next question finds them."""
    eng = Engine(str(ckpt), max_batch_size=4, block_size=BLOCK, block_reuse=True)
    pair = [eng.submit(GenerationRequest(input_ids=DOC + [i], max_new_tokens=3)) for i in (1, 2)]
    eng.run_until_idle()
    assert [r.kv_blocks_reused for r in pair] == [0, 0] and all(r.finish_reason == "length" for r in pair)
    assert eng.generate(GenerationRequest(input_ids=DOC + [3], max_new_tokens=3)).kv_blocks_reused == 9
