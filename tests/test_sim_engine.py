"""The simulated engine's parts, without tritonserver: the timing model, the paged KV cache (reuse by chained
hashes, eviction, events), the text it answers with, and the engine's batching and stop rules, on its own clock
(`SimEngine.run_offline`: nothing waits)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend.cpu_engine.sampling import SamplingParams
from backend.cpu_engine.scheduler import GenerationOutput, GenerationRequest
from backend.sim_engine.checkpoint import create_sim_checkpoint
from backend.sim_engine.engine import SimEngine, SimModel
from backend.sim_engine.kv_cache import ROOT_HASH, PagedKvCache, block_hash
from backend.sim_engine.node import build_engine
from backend.sim_engine.profiles import GPUS, MODELS, ModelFacts, model_config
from backend.sim_engine.text import CorpusText
from backend.sim_engine.timing import StepTiming, StepWork

EIGHT_B = ModelFacts.from_config(model_config("llama-3.1-8b"))
SEVENTY_B = ModelFacts.from_config(model_config("llama-3.1-70b"))


@pytest.fixture(scope="session")
def sim_checkpoint(shared_tmp) -> Path:
    return Path(create_sim_checkpoint(shared_tmp / "sim-llama-3.1-8b", "llama-3.1-8b"))


def tokenizer(checkpoint: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(checkpoint / "tokenizer.json"))


# ---------------------------------------------------------------------------------------------- the model's facts
def test_the_published_dimensions_give_the_published_sizes():
    """Llama 3.1 8B and 70B: 8.03 and 70.6 billion parameters; 128 KiB of KV per token at FP16 is 64 KiB at FP8."""
    assert round(EIGHT_B.params / 1e9, 2) == 8.03
    assert round(SEVENTY_B.params / 1e9, 1) == 70.6
    assert EIGHT_B.kv_bytes_per_token == 2 * 32 * 8 * 128
    assert set(MODELS) == {"llama-3.1-8b", "llama-3.1-70b"} and {"h100", "h200"} <= set(GPUS)


# ---------------------------------------------------------------------------------------------- timing
def test_prefill_time_grows_with_the_tokens_computed():
    t = StepTiming(GPUS["h200"], EIGHT_B)
    times = [t.step_s(StepWork(prefill_tokens=n, prefill_pairs=n * n / 2)) for n in (512, 2048, 8192)]
    assert times[0] < times[1] < times[2]
    assert times[2] / times[1] > 2, "compute bound at thousands of tokens: about proportional"


def test_a_decode_step_grows_with_batch_and_context():
    t = StepTiming(GPUS["h200"], EIGHT_B)
    small = t.step_s(StepWork(decode_sequences=8, decode_context=8 * 1000))
    wider = t.step_s(StepWork(decode_sequences=64, decode_context=64 * 1000))
    longer = t.step_s(StepWork(decode_sequences=64, decode_context=64 * 8000))
    assert small < wider < longer
    assert t.step_s(StepWork()) == 0.0


def test_tensor_parallelism_splits_weights_and_kv_and_pays_its_all_reduces():
    one, two = StepTiming(GPUS["h100"], SEVENTY_B, 1), StepTiming(GPUS["h100"], SEVENTY_B, 2)
    assert two.weight_bytes == pytest.approx(one.weight_bytes / 2)
    assert two.kv_token_bytes == pytest.approx(one.kv_token_bytes / 2)
    work = StepWork(decode_sequences=64, decode_context=64 * 2000)
    assert two.step_s(work) < one.step_s(work), "a memory-bound step: half the bytes per GPU"
    assert two.kv_capacity_tokens(0.9) > 10 * one.kv_capacity_tokens(0.9), "70B in FP8 nearly fills an 80 GB H100"


def test_the_cache_holds_what_the_gpus_memory_leaves():
    t = StepTiming(GPUS["h200"], EIGHT_B)
    tokens = t.kv_capacity_tokens(0.9)
    expected = (141e9 - EIGHT_B.params - GPUS["h200"].activation_bytes) * 0.9 / (2 * 32 * 8 * 128)
    assert tokens == int(expected)
    assert t.kv_capacity_tokens(0.5) < tokens


# ---------------------------------------------------------------------------------------------- the KV cache
def ids(*values: int) -> np.ndarray:
    return np.asarray(values, np.int64)


def test_blocks_are_found_by_chained_hashes_of_their_tokens():
    events: list[dict] = []
    cache = PagedKvCache(16, 2, on_event=events.append)
    prompt = ids(1, 2, 3, 4, 5)
    first = cache.admit(prompt, 7)
    assert first is not None and first.reused == 0 and first.blocks == 4
    cache.store(first, prompt)
    (stored,) = events
    h1 = block_hash(ROOT_HASH, ids(1, 2))
    h2 = block_hash(h1, ids(3, 4))
    assert stored["type"] == "stored" and stored["parent_hash"] is None
    assert [b["block_hash"] for b in stored["blocks"]] == [h1, h2]
    assert [[t["token_id"] for t in b["tokens"]] for b in stored["blocks"]] == [[1, 2], [3, 4]]
    cache.release(first)
    assert cache.used_blocks == 0 and cache.cached_blocks == 2

    again = cache.admit(ids(1, 2, 3, 4, 9), 6)
    assert again is not None and again.reused == 2, "the same prefix: both blocks"
    cache.release(again)
    other = cache.admit(ids(9, 9, 3, 4, 5), 6)
    assert other is not None and other.reused == 0, "the same tokens after another prefix are another block"
    cache.release(other)
    whole = cache.admit(ids(1, 2, 3, 4), 5)
    assert whole is not None and whole.reused == 1, "the last token is always computed"
    cache.release(whole)


def test_idle_blocks_are_evicted_least_recently_used_first_and_said():
    events: list[dict] = []
    cache = PagedKvCache(4, 2, on_event=events.append)
    for prompt in (ids(1, 2, 3, 4), ids(5, 6, 7, 8)):
        held = cache.admit(prompt, 4)
        assert held is not None
        cache.store(held, prompt)
        cache.release(held)
    assert cache.cached_blocks == 4 and cache.free_blocks == 4, "cached blocks no one holds count as free"
    events.clear()
    newcomer = cache.admit(ids(9, 9, 9), 4)
    assert newcomer is not None
    (removed,) = events
    older = [block_hash(ROOT_HASH, ids(1, 2)), block_hash(block_hash(ROOT_HASH, ids(1, 2)), ids(3, 4))]
    assert removed == {"type": "removed", "block_hashes": list(reversed(older))}, "a chain goes from its end"
    assert cache.admit(ids(5, 6, 7, 8, 1), 6) is None, "held blocks are never evicted: 2 + 3 > 4"
    cache.release(newcomer)
    assert cache.used_blocks == 0


def test_without_reuse_nothing_is_kept_or_said():
    events: list[dict] = []
    cache = PagedKvCache(4, 2, reuse=False, on_event=events.append)
    held = cache.admit(ids(1, 2, 3, 4), 4)
    assert held is not None
    cache.store(held, ids(1, 2, 3, 4))
    cache.release(held)
    assert cache.cached_blocks == 0 and events == [] and cache.free_blocks == 4


# ---------------------------------------------------------------------------------------------- text
def test_answers_are_the_corpus_read_on_deterministic_per_seed_and_prompt(sim_checkpoint):
    text = CorpusText(str(sim_checkpoint))
    tok = tokenizer(sim_checkpoint)
    prompt = np.asarray(tok.encode("Tell me a story").ids)
    start = text.start(7, prompt)
    assert start == text.start(7, prompt)
    assert text.start(8, prompt) != start and text.start(7, prompt[1:]) != start
    answer = tok.decode([text.token(start, i) for i in range(40)])
    assert len(answer.split()) >= 10 and "\ufffd" not in answer
    assert all(word.strip(".,;:'\"!?()-").isalpha() or not word.strip(".,;:'\"!?()-") for word in answer.split()[:-1])


# ---------------------------------------------------------------------------------------------- the engine
def engine(checkpoint: Path, **llm_args) -> SimEngine:
    args = {"max_batch_size": 4, "max_num_tokens": 64, **llm_args}
    return build_engine(str(checkpoint), args, tokens_per_block=4, on_kv_event=None)


def request(prompt: list[int], max_tokens: int = 8, **kwargs) -> GenerationRequest:
    return GenerationRequest(input_ids=np.asarray(prompt, np.int64), max_new_tokens=max_tokens, **kwargs)


def test_the_batch_and_the_token_budget_bound_each_step(sim_checkpoint):
    e = engine(sim_checkpoint)
    reqs = [request(list(range(10 + i, 60 + i)), 4) for i in range(6)]
    for r in reqs:
        e.submit(r)
    step = e._plan()
    assert step is not None and len(e.running) == 2, "50-token prompts: the 64-token budget starts two"
    assert [chunk for _, chunk in step.prefill] == [50, 14], "the second prompt is chunked"
    e._complete(step, 1)
    while e.has_work():
        s = e._plan()
        if s is not None:
            assert len(s.decode) + len(s.prefill) <= 4, "max_batch_size"
            e._complete(s, 1)
    assert all(r.finished and r.finish_reason == "length" and len(r.output_ids) == 4 for r in reqs)


def test_a_reused_prefix_is_reported_and_shortens_the_first_token(sim_checkpoint):
    e = engine(sim_checkpoint, max_num_tokens=8192)
    prompt = list(range(1, 1000))
    first, second = request(prompt, 2), request(prompt, 2)
    t1 = e.run_offline([first])
    t2 = e.run_offline([second])
    assert first.kv_blocks_reused == 0 and second.kv_blocks_reused == 249, "999 tokens: 249 full blocks of 4 found"
    assert second.kv_blocks_allocated == first.kv_blocks_allocated
    assert t2 < t1, "only the last block is computed"


def test_stop_words_min_tokens_and_streaming(sim_checkpoint):
    e = engine(sim_checkpoint)
    probe = request([5, 6, 7], 6)
    e.run_offline([probe])
    word = probe.output_ids[2:4]
    chunks: list[GenerationOutput] = []
    stopped = request([5, 6, 7], 6, stop_words=[word], streaming=True, on_output=chunks.append)
    e.run_offline([stopped])
    assert stopped.finish_reason == "stop_words" and stopped.output_ids == probe.output_ids[:4]
    assert [len(c.new_tokens) for c in chunks] == [1, 1, 1, 1] and chunks[-1].finished
    late = request([5, 6, 7], 6, stop_words=[probe.output_ids[0:1]], sampling=SamplingParams(min_tokens=3))
    e.run_offline([late])
    assert late.finish_reason == "length", "a stop word before min_tokens does not stop"


def test_a_cancelled_request_lets_go_of_its_blocks(sim_checkpoint):
    e = engine(sim_checkpoint)
    r = request(list(range(1, 40)), 100)
    e.submit(r)
    step = e._plan()
    assert step is not None and e.stats().used_blocks > 0
    e._complete(step, 1)
    e.cancel(r.request_id)
    assert e._plan() is None
    assert r.finish_reason == "cancelled" and e.stats().used_blocks == 0 and e.stats().active_requests == 0


def test_a_prompt_longer_than_the_context_fails_at_once(sim_checkpoint):
    e = engine(sim_checkpoint, max_seq_len=32)
    r = request(list(range(1, 40)), 4)
    e.run_offline([r])
    assert r.finish_reason == "error" and "max_seq_len is 32" in (r.error or "")


def test_the_stand_in_picks_its_engine_by_one_variable():
    from backend.engines import ENGINE_KINDS, engine_kind
    from launcher.contracts.llmapi import BACKENDS, ENGINE_VAR

    assert engine_kind({}).name == "cpu" and engine_kind({ENGINE_VAR: "sim"}).name == "sim"
    assert set(ENGINE_KINDS) < set(BACKENDS)
    with pytest.raises(SystemExit, match="cpu, sim"):
        engine_kind({ENGINE_VAR: "gpu"})


def test_the_engine_reads_its_sizes_from_the_checkpoint_and_the_gpu(sim_checkpoint):
    e = build_engine(str(sim_checkpoint), {}, gpu="h100", kv_cache_tokens=4096)  # kv_cache_config.max_tokens
    assert e.cache.max_tokens == 4096 and e.max_batch_size == 2048 and e.max_num_tokens == 8192
    assert e.max_seq_len == 4096, "the context is the cache's, when the model's is longer"
    assert isinstance(e.config, SimModel) and e.config.vocab_size == tokenizer(sim_checkpoint).get_vocab_size()
    from backend.cpu_engine.llmapi.engine_args import EngineArgsError

    with pytest.raises(EngineArgsError, match="h100, h200"):
        build_engine(str(sim_checkpoint), {}, gpu="a100")


@pytest.mark.slow
def test_the_calibration_reproduces_a_published_point():
    """Llama 3.1 8B on an H200, ISL 2048 / OSL 128 (prefill-bound): within 20 % of TensorRT-LLM's published
    throughput (backend/sim_engine/calibrate.py has every point; docs/decisions.md the table)."""
    from backend.sim_engine.calibrate import PUBLISHED, simulate

    published = PUBLISHED[("llama-3.1-8b", "h200", 1)][(2048, 128)]
    assert 0.8 < simulate("llama-3.1-8b", "h200", 1, 2048, 128) / published < 1.2


def test_a_stopping_rank_refuses_new_requests_drains_and_says_so(sim_checkpoint):
    """The CPU engine's drain rules (backend/cpu_engine/drain.py), applied by the simulated engine's loop."""
    e = engine(sim_checkpoint)
    said: list[str] = []
    e.report_drain = said.append
    deadline: list[float | None] = [None]
    e.drain_deadline = lambda: deadline[0]
    running = request(list(range(1, 20)), 3)
    e.submit(running)
    step = e._plan()
    assert step is not None
    e._enforce_drain(1000.0)
    assert said == [], "not stopping: nothing said"
    deadline[0] = 2000.0
    e._enforce_drain(1000.0)
    late = e.submit(request([1, 2, 3], 2))
    assert late.finish_reason == "error" and "retry on another replica" in (late.error or "")
    assert said == ["draining"]
    e._complete(step, 1)
    e.run_offline([])
    e._enforce_drain(1001.0)
    assert running.finish_reason == "length" and said == ["draining", "drained"]


def test_a_conversations_next_turn_finds_its_history_its_answers_included(sim_checkpoint):
    """An answer's blocks are kept when it ends, so the next turn (history + answer + a new question, tokenized
    again from text) finds all but the block where the answer's first token met the prompt's text."""
    tok = tokenizer(sim_checkpoint)
    e = build_engine(str(sim_checkpoint), {"max_batch_size": 8})
    text = "system: You answer questions about the town and its market. " * 4 + "\nuser: The bridge?\nassistant:"
    found = []
    for _ in range(3):
        prompt = tok.encode(text).ids
        r = request(prompt, 64)
        e.run_offline([r])
        found.append((r.kv_blocks_reused, (len(prompt) - 1) // e.cache.tokens_per_block))
        text += tok.decode(r.output_ids) + "\nuser: And then?\nassistant:"
    assert found[0][0] == 0
    for reused, blocks in found[1:]:
        assert reused >= blocks - 1 and reused > found[0][1], found


def test_a_slowdown_stretches_the_wait_not_the_gpu_time(sim_checkpoint):
    from backend.cpu_engine.llmapi.engine_args import EngineArgsError
    from backend.sim_engine.node import slowdown
    from launcher.contracts.llmapi import SIM_SLOWDOWN_VAR

    assert slowdown({}) == 1.0 and slowdown({SIM_SLOWDOWN_VAR: "4"}) == 4.0
    with pytest.raises(EngineArgsError, match="from 1 to 1000"):
        slowdown({SIM_SLOWDOWN_VAR: "fast"})
    slow = build_engine(str(sim_checkpoint), {}, slowed=4.0)
    assert slow.slowdown == 4.0
    assert slow.run_offline([request([1, 2, 3], 4)]) == engine(sim_checkpoint).run_offline([request([1, 2, 3], 4)])


def test_the_llm_api_over_the_simulated_engine_streams_real_text_and_its_kv_events(sim_checkpoint, monkeypatch):
    """The stand-in's `LLM` in this process picks the engine as the leader node does (HPC_SERVE_STANDIN_ENGINE):
    text from the checkpoint's tokenizer, and KV-cache events in TensorRT-LLM's shape with chained hashes."""
    import sys

    from launcher.contracts.llmapi import ENGINE_VAR, STANDIN_ROOT

    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv(ENGINE_VAR, "sim")
    sys.path.insert(0, str(root / STANDIN_ROOT))
    try:
        import tensorrt_llm

        kv = {"event_buffer_max_size": 64, "tokens_per_block": 4}
        with tensorrt_llm.LLM(model=str(sim_checkpoint), max_batch_size=2, kv_cache_config=kv) as llm:
            prompt = list(range(10, 19))
            out = llm.generate(prompt, tensorrt_llm.SamplingParams(max_tokens=12))
            assert len(out.outputs[0].text.split()) >= 3 and "\ufffd" not in out.outputs[0].text
            events = llm.get_kv_cache_events(0.2)
            assert [e["data"]["type"] for e in events][:2] == ["created", "stored"]
            stored = events[1]["data"]
            first, second = stored["blocks"][:2]
            assert stored["parent_hash"] is None and [t["token_id"] for t in first["tokens"]] == prompt[:4]
            assert first["block_hash"] == block_hash(ROOT_HASH, np.asarray(prompt[:4]))
            assert second["block_hash"] == block_hash(first["block_hash"], np.asarray(prompt[4:8]))
    finally:
        sys.path.remove(str(root / STANDIN_ROOT))
        for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
            del sys.modules[name]


def test_the_engine_waits_each_steps_time(sim_checkpoint):
    """Started, the engine does not run ahead of its GPU: the request's first to last token spans at least the
    time of the steps that made them (a lower bound: a loaded machine only makes it later)."""
    import threading
    import time

    e = build_engine(str(sim_checkpoint), {"max_batch_size": 2}, slowed=20.0)
    done = threading.Event()
    r = request(list(range(1, 200)), 6, on_output=lambda out: out.finished and done.set())
    e.start()
    try:
        started = time.monotonic()
        e.submit(r)
        assert done.wait(60), "the request finished"
        waited = time.monotonic() - started
    finally:
        e.shutdown()
    assert r.finish_reason == "length" and e.iterations == 6
    assert waited >= e.busy_s * 20.0
