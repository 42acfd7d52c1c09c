"""CPU engine: token-for-token agreement with transformers, in-flight batching, stop rules, KV budget, sampling.

torch/transformers are test-only dependencies (the reference implementation); the engine itself is numpy.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from backend.cpu_engine.checkpoint import CheckpointError, load_config
from backend.cpu_engine.engine import Engine
from backend.cpu_engine.init_model import create_checkpoint
from backend.cpu_engine.model import TransformerShard
from backend.cpu_engine.sampling import SamplingParams
from backend.cpu_engine.scheduler import GenerationRequest
from backend.cpu_engine.tensors import load_weights
from backend.cpu_engine.triton_io import InputError, encode_words_list, parse_inputs, parse_words_list
from tests.e2e import transformers_greedy

TEXTS = [
    "The",
    "A scheduler is a patient thing.",
    "When many people ask questions at once, the server can answer them together and it",
    "Numbers are honest when we let them be. A benchmark should measure the thing we care about, in the same "
    "way for every system we compare, on the same machine",
]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def ckpt(request, tmp_path_factory) -> Path:
    return Path(create_checkpoint(tmp_path_factory.mktemp("ck") / request.param, family=request.param, seed=1))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return Path(create_checkpoint(tmp_path_factory.mktemp("ck") / "gpt2", family="gpt2", seed=3))


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return Path(create_checkpoint(tmp_path_factory.mktemp("ck") / "llama", family="llama", seed=4))


def _prompts(path: Path) -> list[list[int]]:
    """TEXTS as transformers' AutoTokenizer encodes them (the same ids, checked for both families), without
    importing transformers: seconds of every unit run."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    return [tok.encode(t).ids for t in TEXTS]


def _eos(path: Path) -> int:
    return int(load_config(path).eos_token_id)


def _run_alone(path: Path, req_kwargs: dict, **engine_kwargs) -> GenerationRequest:
    eng = Engine(str(path), **engine_kwargs)
    return eng.generate(GenerationRequest(**req_kwargs))


# ------------------------------------------------------------------------------------------ reference agreement
@pytest.mark.slow
def test_greedy_matches_transformers_generate(ckpt: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    eos = _eos(ckpt)
    n_new = 24
    eng = Engine(str(ckpt), max_batch_size=4)
    reqs = [GenerationRequest(input_ids=p, max_new_tokens=n_new, end_id=eos) for p in _prompts(ckpt)]
    for r in reqs:
        eng.submit(r)
    eng.run_until_idle()
    lengths = set()
    for prompt, r in zip(_prompts(ckpt), reqs, strict=True):
        lengths.add(len(prompt))
        expected = transformers_greedy(ref, prompt, n_new, pad_token_id=eos, eos_token_id=eos)
        if eos in expected:  # TensorRT-LLM semantics: end_id ends the sequence and is not returned
            expected = expected[: expected.index(eos)]
        assert r.output_ids == expected, (len(prompt), r.output_ids, expected)
        assert r.finish_reason == ("end_id" if len(expected) < n_new else "length")
    assert len(lengths) == len(TEXTS)  # prompts really have different lengths


@pytest.mark.slow
def test_prefill_and_decode_logits_match_transformers(ckpt: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    prompt = _prompts(ckpt)[2]
    shard = TransformerShard(load_config(ckpt), load_weights(ckpt), max_slots=2)
    got = shard.prefill(1, np.array(prompt))
    with torch.no_grad():
        full = ref(torch.tensor([prompt + [5, 9]])).logits[0].numpy()
    np.testing.assert_allclose(got, full[len(prompt) - 1], atol=1e-4)
    step1 = shard.decode(np.array([0, 5]), np.array([0, len(prompt)]))  # slot 0 is junk; slot 1 continues
    np.testing.assert_allclose(step1[1], full[len(prompt)], atol=1e-4)


@pytest.mark.slow
def test_one_forward_of_mixed_rows_equals_separate_passes(ckpt: Path) -> None:
    """Decode rows + several ragged prompts (slots not contiguous, not in order) in one forward give the same
    logits and leave the same cache as running each piece on its own."""
    prompts = [np.array(p) for p in _prompts(ckpt)]
    cfg, w = load_config(ckpt), load_weights(ckpt)
    sep = TransformerShard(cfg, w, max_slots=6)
    one = TransformerShard(cfg, w, max_slots=6)
    for shard in (sep, one):  # two running sequences in slots 0, 1
        shard.prefill(0, prompts[1])
        shard.prefill(1, prompts[2])
    dec_tok, dec_pos = np.array([7, 11]), np.array([len(prompts[1]), len(prompts[2])])
    want_dec = sep.decode(dec_tok, dec_pos)
    want_pre = [sep.prefill(slot, prompts[i]) for slot, i in ((4, 3), (2, 0), (3, 1))]
    got = one.forward(dec_tok, dec_pos, [(4, prompts[3]), (2, prompts[0]), (3, prompts[1])])
    assert got.shape == (5, cfg.vocab_size)
    np.testing.assert_allclose(got[:2], want_dec, atol=1e-4)
    for row, want in zip(got[2:], want_pre, strict=True):
        np.testing.assert_allclose(row, want, atol=1e-4)
    for slot, n in (
        (0, len(prompts[1]) + 1),
        (1, len(prompts[2]) + 1),
        (2, len(prompts[0])),
        (3, len(prompts[1])),
        (4, len(prompts[3])),
    ):
        for a, b in zip(sep.k_cache + sep.v_cache, one.k_cache + one.v_cache, strict=True):
            np.testing.assert_allclose(a[slot, :, :n], b[slot, :, :n], atol=1e-4)


def test_checkpoint_errors_are_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["BertModel"], "model_type": "bert"}')
    with pytest.raises(CheckpointError, match="BertModel"):
        load_config(tmp_path)


@pytest.mark.slow  # imports torch
def test_sharded_safetensors_index_and_bf16(llama: Path, tmp_path: Path) -> None:
    """A checkpoint split into two bf16 shards with an index loads and gives (nearly) the same tokens."""
    torch = pytest.importorskip("torch")
    import json
    import shutil

    from safetensors.torch import save_file

    weights = load_weights(llama)
    names = sorted(weights)
    half = len(names) // 2
    out = tmp_path / "sharded"
    out.mkdir()
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(llama / f, out / f)
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: torch.from_numpy(weights[n]).to(torch.bfloat16) for n in part}, str(out / fname))
        weight_map.update({n: fname for n in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = load_weights(out)
    assert set(loaded) == set(weights) and all(v.dtype == np.float32 for v in loaded.values())
    for n in names:
        np.testing.assert_allclose(loaded[n], weights[n], rtol=1e-2, atol=1e-2)
    prompt = _prompts(llama)[1]
    r = _run_alone(out, dict(input_ids=prompt, max_new_tokens=4))
    assert len(r.output_ids) == 4


# ------------------------------------------------------------------------------------------ in-flight batching
def _batch_kwargs(path: Path) -> list[dict]:
    prompts = _prompts(path)
    return [
        dict(input_ids=prompts[0], max_new_tokens=20),
        dict(input_ids=prompts[3], max_new_tokens=7),
        dict(input_ids=prompts[1], max_new_tokens=15, sampling=SamplingParams(temperature=0.9, top_k=20, seed=7)),
        dict(input_ids=prompts[2], max_new_tokens=12, sampling=SamplingParams(temperature=1.2, top_p=0.9, seed=3)),
        dict(input_ids=prompts[1][:3], max_new_tokens=18, return_log_probs=True),
    ]


@pytest.mark.slow
def test_alone_equals_inside_a_busy_batch(ckpt: Path) -> None:
    alone = [_run_alone(ckpt, kw) for kw in _batch_kwargs(ckpt)]
    eng = Engine(str(ckpt), max_batch_size=4)  # fewer slots than requests: one waits for a slot
    busy = [GenerationRequest(**kw) for kw in _batch_kwargs(ckpt)]
    eng.submit(busy[0])
    eng.step()
    eng.step()
    eng.submit(busy[1])
    eng.submit(busy[2])
    eng.step()
    eng.submit(busy[3])
    for _ in range(3):
        eng.step()
    eng.submit(busy[4])
    max_running = 0
    while eng.has_work():
        eng.step()
        max_running = max(max_running, len(eng.scheduler.running))
    assert max_running == 4
    for a, b in zip(alone, busy, strict=True):
        assert b.output_ids == a.output_ids
        assert b.finish_reason == a.finish_reason == "length"
        np.testing.assert_allclose(b.log_probs, a.log_probs, atol=1e-4)
    assert eng.budget.used_blocks == 0 and not eng.scheduler.running


@pytest.mark.slow
def test_streaming_chunks_concatenate_to_the_result(gpt2: Path) -> None:
    chunks: list[list[int]] = []
    finals = []
    eng = Engine(str(gpt2))
    req = GenerationRequest(
        input_ids=_prompts(gpt2)[1],
        max_new_tokens=9,
        streaming=True,
        on_output=lambda o: (chunks.append(o.new_tokens), finals.append(o.finished)),
    )
    eng.generate(req)
    assert sum(chunks, []) == req.output_ids and len(req.output_ids) == 9
    assert finals[-1] is True and not any(finals[:-1])


def test_engine_thread_serves_concurrent_submissions(llama: Path) -> None:
    eng = Engine(str(llama), max_batch_size=4)
    eng.start()
    try:
        reqs = [GenerationRequest(input_ids=p, max_new_tokens=6) for p in _prompts(llama)]
        import threading

        threads = [threading.Thread(target=eng.generate, args=(r, 60)) for r in reqs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(r.finished and len(r.output_ids) == 6 for r in reqs)
    finally:
        eng.shutdown()


@pytest.mark.slow
def test_min_step_is_the_least_time_of_a_step_and_a_stop_still_lands_at_the_next(llama: Path) -> None:
    """`min_step_s` (the `min_step_ms` parameter: a GPU's pace) makes each step on the engine thread take at least
    that long: a lower bound, which a loaded machine only lengthens. A stop that comes between two steps ends the
    request at the next one: it has the tokens made by then, or one more."""
    eng = Engine(str(llama), max_tokens_in_kv_cache=256, min_step_s=0.05)
    eng.start()
    try:
        prompt = _prompts(llama)[0]
        started = time.monotonic()
        paced = eng.generate(GenerationRequest(input_ids=prompt, max_new_tokens=6), timeout=60)
        took = time.monotonic() - started
        assert len(paced.output_ids) == 6 and took >= 5 * 0.05, took  # 5 waits between its 6 steps at least
        made: list[int] = []
        stopped = threading.Event()

        def on_output(_) -> None:
            if len(req.output_ids) >= 3 and not stopped.is_set():  # on the engine thread: the stop comes between
                stopped.set()
                made.append(len(req.output_ids))
                eng.cancel("mine")  # as from another thread (its lock is not held here): applied at the next step

        req = GenerationRequest(
            input_ids=prompt, max_new_tokens=200, request_id="mine", streaming=True, on_output=on_output
        )
        eng.generate(req, timeout=60)
        assert req.finish_reason == "cancelled" and len(req.output_ids) - made[0] <= 1, (made, len(req.output_ids))
    finally:
        eng.shutdown()


# ------------------------------------------------------------------------------------------ stop rules
def _greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    return _run_alone(path, dict(input_ids=prompt, max_new_tokens=n)).output_ids


def _fresh_stop_point(path: Path, n: int, start: int) -> tuple[list[int], list[int], int]:
    """(prompt, greedy output, i) with i >= start such that output[i] does not occur earlier in the output."""
    for prompt in _prompts(path):
        ref = _greedy(path, prompt, n)
        for i in range(start, len(ref)):
            if ref[i] not in ref[:i]:
                return prompt, ref, i
    raise AssertionError("random model output too repetitive for a clean stop point; change the seed")


@pytest.mark.slow
def test_end_id_stops_and_is_not_returned(llama: Path) -> None:
    prompt, ref, i = _fresh_stop_point(llama, 16, 3)
    eng = Engine(str(llama))
    r = eng.generate(GenerationRequest(input_ids=prompt, max_new_tokens=16, end_id=ref[i]))
    assert r.output_ids == ref[:i] and r.finish_reason == "end_id"
    assert eng.budget.used_blocks == 0 or eng.scheduler.running == [r]
    eng.step()  # the finished request leaves at the start of the next step
    assert eng.budget.used_blocks == 0 and not eng.scheduler.running


def test_min_tokens_masks_end_id(llama: Path) -> None:
    prompt = _prompts(llama)[2]
    ref = _greedy(llama, prompt, 16)
    r = _run_alone(
        llama, dict(input_ids=prompt, max_new_tokens=16, end_id=ref[0], sampling=SamplingParams(min_tokens=5))
    )
    assert len(r.output_ids) >= 5 and ref[0] not in r.output_ids[:5]


@pytest.mark.slow
def test_stop_words_multi_token(gpt2: Path) -> None:
    prompt, ref, i = _fresh_stop_point(gpt2, 20, 4)
    stop = [ref[i - 1], ref[i]]
    decoy = [ref[i], 99999]  # never completes
    words = parse_words_list(encode_words_list([decoy, stop]))
    assert words == [decoy, stop]
    eng = Engine(str(gpt2))
    r = eng.generate(GenerationRequest(input_ids=prompt, max_new_tokens=20, stop_words=words))
    assert r.output_ids == ref[: i + 1] and r.finish_reason == "stop_words"


def test_max_tokens_and_bad_words(gpt2: Path) -> None:
    prompt = _prompts(gpt2)[1]
    ref = _greedy(gpt2, prompt, 5)
    assert len(ref) == 5
    r = _run_alone(gpt2, dict(input_ids=prompt, max_new_tokens=5, bad_words=[[ref[0]]]))
    assert r.output_ids[0] != ref[0] and len(r.output_ids) == 5


def test_cancellation_frees_slot_and_budget(llama: Path) -> None:
    eng = Engine(str(llama), max_batch_size=2, max_tokens_in_kv_cache=256)
    prompts = _prompts(llama)
    a = GenerationRequest(input_ids=prompts[0], max_new_tokens=100, request_id="a")
    flag = {"cancel": False}
    b = GenerationRequest(input_ids=prompts[1], max_new_tokens=100, is_cancelled=lambda: flag["cancel"])
    c = GenerationRequest(input_ids=prompts[1], max_new_tokens=10)
    for r in (a, b, c):
        eng.submit(r)
    for _ in range(3):
        eng.step()
    assert [r.request_id for r in eng.scheduler.running] == ["a", b.request_id]
    assert list(eng.scheduler.waiting) == [c]  # no slot and no budget left
    eng.cancel("a")
    flag["cancel"] = True
    eng.step()
    assert a.finish_reason == b.finish_reason == "cancelled"
    assert 0 < len(a.output_ids) < 100
    eng.run_until_idle()
    assert c.finish_reason == "length" and len(c.output_ids) == 10
    assert eng.budget.used_blocks == 0 and eng.stats().completed_requests == 3


def test_cancelling_the_last_request_reports_its_blocks_free(llama: Path) -> None:
    eng = Engine(str(llama), max_tokens_in_kv_cache=256)
    reported = []
    eng.on_step = reported.append
    eng.submit(GenerationRequest(input_ids=_prompts(llama)[0], max_new_tokens=100, request_id="a"))
    eng.step()
    assert reported[-1].used_blocks > 0
    eng.cancel("a")
    eng.step()
    assert reported[-1].used_blocks == 0 and reported[-1].active_requests == 0


def test_a_stop_that_matches_nothing_is_logged_and_dropped(llama: Path, caplog) -> None:
    """As in TensorRT-LLM's backend, a stop for an id the engine does not hold does nothing (DEVELOPERS.md,
    "Abandoned streams"); the log tells one that came after its request ended from one that matched nothing.
    A stop is settled when it comes, idle or not: one left waiting for the engine's next step would stop a
    later request of that id."""
    caplog.set_level(logging.INFO, logger="hpc_serve.cpu_engine")
    eng = Engine(str(llama), max_tokens_in_kv_cache=256)
    eng.start()
    try:
        eng.cancel("early")

        def said(text: str) -> bool:
            return any(text in r.getMessage() for r in caplog.records)

        deadline = time.monotonic() + 30
        while not said("'early' matches nothing") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert said("'early' matches nothing"), [r.getMessage() for r in caplog.records]
        prompt = _prompts(llama)[0]
        early = eng.generate(GenerationRequest(input_ids=prompt, max_new_tokens=5, request_id="early"), timeout=60)
        assert early.finish_reason == "length" and len(early.output_ids) == 5
        eng.cancel("early")  # after its request ended: said so
        deadline = time.monotonic() + 30
        while not said("'early': it finished") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert said("'early': it finished"), [r.getMessage() for r in caplog.records]
    finally:
        eng.shutdown()


@pytest.mark.slow
def test_kv_budget_smaller_than_demand_makes_requests_wait(gpt2: Path) -> None:
    prompts = _prompts(gpt2)
    kws = [dict(input_ids=prompts[i % 3], max_new_tokens=30 + i) for i in range(6)]
    alone = [_run_alone(gpt2, kw).output_ids for kw in kws]
    eng = Engine(str(gpt2), max_batch_size=8, max_tokens_in_kv_cache=256, block_size=64)  # 4 blocks
    reqs = [eng.submit(GenerationRequest(**kw)) for kw in kws]
    peak_used, peak_running = 0, 0
    while eng.has_work():
        eng.step()
        s = eng.stats()
        assert s.used_blocks + s.free_blocks == s.max_blocks == 4
        peak_used = max(peak_used, s.used_blocks)
        peak_running = max(peak_running, s.active_requests)
    assert peak_running < len(kws)  # budget, not slots, limited the batch
    assert peak_used <= 4
    assert [r.output_ids for r in reqs] == alone
    assert all(r.finish_reason == "length" for r in reqs)


def test_request_that_can_never_fit_fails_with_message(gpt2: Path) -> None:
    eng = Engine(str(gpt2), max_tokens_in_kv_cache=128)
    r = eng.generate(GenerationRequest(input_ids=_prompts(gpt2)[3], max_new_tokens=100))
    assert r.finish_reason == "error" and "max_tokens_in_paged_kv_cache" in r.error
    r = eng.generate(GenerationRequest(input_ids=[1] * eng.scheduler.max_seq_len, max_new_tokens=1))
    assert r.finish_reason == "error" and "max_seq_len" in r.error, "a prompt that leaves no room for a token"


# ------------------------------------------------------------------------------------------ sampling
@pytest.mark.slow
def test_seeded_sampling_is_reproducible(llama: Path) -> None:
    prompt = _prompts(llama)[1]

    def run(seed: int, **kw) -> list[int]:
        sp = SamplingParams(temperature=1.0, seed=seed, **kw)
        return _run_alone(llama, dict(input_ids=prompt, max_new_tokens=24, sampling=sp)).output_ids

    assert run(11) == run(11)
    assert run(11, top_k=5) == run(11, top_k=5)
    assert run(11, top_p=0.8) == run(11, top_p=0.8)
    assert run(11) != run(12) or run(13) != run(14)
    greedy = _greedy(llama, prompt, 24)
    assert (
        _run_alone(
            llama, dict(input_ids=prompt, max_new_tokens=24, sampling=SamplingParams(temperature=0.7, top_k=1, seed=5))
        ).output_ids
        == greedy
    )


def test_log_probs_are_consistent(gpt2: Path) -> None:
    r = _run_alone(gpt2, dict(input_ids=_prompts(gpt2)[2], max_new_tokens=8, return_log_probs=True))
    assert len(r.log_probs) == 8 and all(lp <= 0 for lp in r.log_probs)
    assert r.cum_log_prob == pytest.approx(sum(r.log_probs), abs=1e-5)


@pytest.mark.slow
def test_repetition_penalty_changes_repetitive_output(gpt2: Path) -> None:
    prompt = _prompts(gpt2)[0]
    plain = _greedy(gpt2, prompt, 16)
    penal = _run_alone(
        gpt2, dict(input_ids=prompt, max_new_tokens=16, sampling=SamplingParams(repetition_penalty=5.0))
    ).output_ids
    assert len(set(penal)) >= len(set(plain))
    assert penal != plain


# ------------------------------------------------------------------------------------------ tensors in / errors
def _tensors(**extra) -> dict[str, np.ndarray]:
    base = {
        "input_ids": np.array([[5, 6, 7]], np.int32),
        "input_lengths": np.array([3], np.int32),
        "request_output_len": np.array([4], np.int32),
    }
    base.update(extra)
    return base


@pytest.mark.parametrize(
    "name,value",
    [
        ("beam_width", np.array([2], np.int32)),
        ("num_return_sequences", np.array([3], np.int32)),
        ("lora_task_id", np.array([1], np.uint64)),
        ("prompt_embedding_table", np.ones((1, 2, 4), np.float16)),
        ("draft_input_ids", np.array([[1, 2]], np.int32)),
        ("return_generation_logits", np.array([True])),
        ("embedding_bias", np.ones((1, 10), np.float32)),
    ],
)
def test_unsupported_inputs_are_named(name: str, value: np.ndarray) -> None:
    with pytest.raises(InputError, match=f"'{name}'"):
        parse_inputs(_tensors(**{name: value}))


def test_harmless_inputs_are_accepted() -> None:
    reqs, opts = parse_inputs(
        _tensors(
            beam_width=np.array([1], np.int32),
            decoder_input_ids=np.array([[0]], np.int32),
            return_context_logits=np.array([False]),
            embedding_bias=np.zeros((1, 0), np.float32),
            stop_words_list=np.zeros((1, 2, 0), np.int32),
            runtime_top_k=np.array([1], np.int32),
            seed=np.array([9], np.uint64),
            streaming=np.array([True]),
        )
    )
    assert len(reqs) == 1 and reqs[0].sampling.seed == 9 and reqs[0].sampling.greedy and opts.streaming
    assert reqs[0].input_ids.tolist() == [5, 6, 7] and reqs[0].stop_words == []


def test_input_lengths_trim_padded_batch() -> None:
    reqs, opts = parse_inputs(
        {
            "input_ids": np.array([[5, 6, 7], [8, 9, 0]], np.int32),
            "input_lengths": np.array([[3], [2]], np.int32),
            "request_output_len": np.array([[4], [6]], np.int32),
        }
    )
    assert [r.input_ids.tolist() for r in reqs] == [[5, 6, 7], [8, 9]]
    assert [r.max_new_tokens for r in reqs] == [4, 6] and opts.batch_size == 2
