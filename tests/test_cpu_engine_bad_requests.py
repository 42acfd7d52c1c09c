"""Bad requests against the CPU engine: each gets its own error naming the input and the allowed range, and the
requests beside it in the same batch are served exactly as if they had been alone."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from backend.cpu_engine.checkpoint import load_config
from backend.cpu_engine.engine import Engine
from backend.cpu_engine.init_model import create_checkpoint
from backend.cpu_engine.lockstep import PlanRejected
from backend.cpu_engine.model import StepPlan
from backend.cpu_engine.sampling import SamplingParams
from backend.cpu_engine.scheduler import GenerationRequest
from backend.cpu_engine.triton_io import InputError, parse_inputs

GOOD = [[3, 17, 42, 5], [9, 9, 9], [101, 7, 8, 12, 40]]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return Path(create_checkpoint(tmp_path_factory.mktemp("ck") / "gpt2", family="gpt2", seed=3))


def _alone(path: Path, prompt: list[int]) -> list[int]:
    return (
        Engine(str(path), max_batch_size=8).generate(GenerationRequest(input_ids=prompt, max_new_tokens=6)).output_ids
    )


def _vocab(path: Path) -> int:
    return load_config(path).vocab_size


BAD = {
    "too large": (lambda v: dict(input_ids=[5, v, 7], max_new_tokens=4), "token id {v} at position 1"),
    "int32 max": (lambda v: dict(input_ids=[2**31 - 1], max_new_tokens=4), "token id 2147483647 at position 0"),
    "negative": (lambda v: dict(input_ids=[5, 6, -3], max_new_tokens=4), "token id -3 at position 2"),
    "empty": (lambda v: dict(input_ids=[], max_new_tokens=4), "input 'input_ids' is empty"),
    "zero tokens": (lambda v: dict(input_ids=[5], max_new_tokens=0), "'request_output_len' must be at least 1"),
    "negative tokens": (lambda v: dict(input_ids=[5], max_new_tokens=-7), "'request_output_len' must be at least 1"),
    "prompt past context": (lambda v: dict(input_ids=[5] * 5000, max_new_tokens=1), "shorten the prompt"),
    "end_id": (lambda v: dict(input_ids=[5], max_new_tokens=2, end_id=v + 5), "input 'end_id'"),
    "pad_id": (lambda v: dict(input_ids=[5], max_new_tokens=2, pad_id=-9), "input 'pad_id'"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_request_fails_alone_inside_a_busy_batch(gpt2: Path, case: str) -> None:
    make, expected = BAD[case]
    vocab = _vocab(gpt2)
    engine = Engine(str(gpt2), max_batch_size=8)
    good = [GenerationRequest(input_ids=p, max_new_tokens=6) for p in GOOD]
    bad = GenerationRequest(**make(vocab))
    for req in (good[0], bad, *good[1:]):
        engine.submit(req)
    engine.run_until_idle()
    assert bad.finish_reason == "error" and expected.format(v=vocab) in bad.error, bad.error
    assert [r.output_ids for r in good] == [_alone(gpt2, p) for p in GOOD]
    assert engine.generate(GenerationRequest(input_ids=GOOD[0], max_new_tokens=6)).finish_reason == "length"


@pytest.mark.slow
def test_new_tokens_past_the_context_are_cut_to_the_room_left_as_tensorrt_llm_does(gpt2: Path) -> None:
    """Not an error: TensorRT-LLM cuts them with a warning, and the answer ends for its "length"."""
    engine = Engine(str(gpt2), max_batch_size=8)
    context = engine.scheduler.max_seq_len
    out = engine.generate(GenerationRequest(input_ids=[5, 6, 7], max_new_tokens=10**6, end_id=-1))
    assert out.error is None and out.finish_reason == "length" and len(out.output_ids) == context - 3


def test_a_plan_with_a_foreign_token_is_rejected_before_it_runs(gpt2: Path) -> None:
    engine = Engine(str(gpt2))
    with pytest.raises(PlanRejected, match="outside the vocabulary"):
        engine.shard.run_step(StepPlan(prefills=[(0, np.array([1, _vocab(gpt2)]))]))
    with pytest.raises(PlanRejected, match="slot"):
        engine.shard.run_step(StepPlan(prefills=[(99, np.array([1]))]))


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(gpt2: Path, monkeypatch) -> None:
    engine = Engine(str(gpt2), max_batch_size=8)
    victims = [engine.submit(GenerationRequest(input_ids=p, max_new_tokens=6)) for p in GOOD[:2]]
    real = engine.shard.forward
    monkeypatch.setattr(engine.shard, "forward", lambda *a: (_ for _ in ()).throw(MemoryError("no room")))
    assert "MemoryError: no room" in engine.step_or_fail()
    assert [v.finish_reason for v in victims] == ["error", "error"] and "no room" in victims[0].error
    monkeypatch.setattr(engine.shard, "forward", real)
    after = engine.generate(GenerationRequest(input_ids=GOOD[2], max_new_tokens=6))
    assert after.output_ids == _alone(gpt2, GOOD[2])


def test_sampling_that_would_poison_a_batch_is_refused() -> None:
    for params, name in [
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=float("inf")), "runtime_top_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(presence_penalty=float("-inf")), "presence_penalty"),
    ]:
        with pytest.raises(ValueError, match=f"'{name}'"):
            SamplingParams(**params).validate()


def test_a_tiny_temperature_samples_like_greedy(gpt2: Path) -> None:
    engine = Engine(str(gpt2))
    r = engine.generate(
        GenerationRequest(input_ids=GOOD[0], max_new_tokens=6, sampling=SamplingParams(temperature=1e-30, seed=1))
    )
    assert r.finish_reason == "length" and r.output_ids == _alone(gpt2, GOOD[0])


def _tensors(**extra) -> dict[str, np.ndarray]:
    base = {
        "input_ids": np.array([[5, 6, 7]], np.int32),
        "input_lengths": np.array([3], np.int32),
        "request_output_len": np.array([4], np.int32),
    }
    return {**base, **extra}


@pytest.mark.parametrize(
    "extra,message",
    [
        (dict(input_ids=np.array([[5.0, 6.0]], np.float32)), "integer token ids"),
        (dict(input_ids=np.zeros((1, 2, 3), np.int32)), "must be \\[batch, tokens\\]"),
        (dict(input_lengths=np.array([0], np.int32)), "the prompt is empty"),
        (dict(input_lengths=np.array([9], np.int32)), "must be in \\[1, 3\\]"),
        (dict(request_output_len=np.array([[4], [5]], np.int32)), "give one value per row"),
        (dict(stop_words_list=np.zeros((1, 3, 2), np.int32)), "'stop_words_list' must be \\[2, L\\]"),
        (dict(bad_words_list=np.array([[[5, 6], [2, 1]]], np.int32)), "'bad_words_list': offset 1"),
        (dict(temperature=np.array([np.nan], np.float32)), "'temperature' must be a finite number"),
        (dict(runtime_top_k=np.array([-1], np.int32)), "'runtime_top_k' must be >= 0"),
    ],
)
def test_tensor_level_mistakes_are_named(extra: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_inputs(_tensors(**extra))


def test_stats_after_the_last_step_show_nothing_active(gpt2: Path) -> None:
    """The finished request leaves its slot only at the next step; the metrics must not show it as active
    while the engine idles (they are only updated after steps)."""
    engine = Engine(str(gpt2), max_batch_size=8)
    engine.generate(GenerationRequest(input_ids=GOOD[0], max_new_tokens=3))
    stats = engine.stats()
    assert engine.scheduler.running, "precondition: the finished request still holds its slot"
    assert stats.active_requests == 0 and stats.used_blocks == 0 and stats.free_blocks == stats.max_blocks


def test_stopping_engine_fails_what_cannot_finish_before_its_drain_time(gpt2: Path) -> None:
    """Told to stop (its launcher's stop file): close to the drain deadline, queued and running requests get an
    error naming the stop, and new ones are refused at once, so the ranks can still stop in order."""
    engine = Engine(str(gpt2), max_batch_size=1)
    reqs = [engine.submit(GenerationRequest(input_ids=GOOD[0], max_new_tokens=200)) for _ in range(3)]
    reported = []
    engine.on_step = reported.append
    engine.drain_deadline = lambda: time.time() + 1.0  # already less than DRAIN_MARGIN_S away
    engine.start()
    try:
        deadline = time.monotonic() + 60
        while not all(r.finished for r in reqs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [r.finish_reason for r in reqs] == ["error"] * 3 and all("stopping" in r.error for r in reqs)
        late = engine.submit(GenerationRequest(input_ids=GOOD[1], max_new_tokens=2))
        assert late.finished and "stopping" in late.error
        assert reported[-1].active_requests == 0 and reported[-1].waiting_requests == 0  # the metrics say so too
    finally:
        engine.shutdown()


def test_a_stopping_engine_with_time_to_spare_still_serves_what_it_has(gpt2: Path) -> None:
    engine = Engine(str(gpt2))
    engine.drain_deadline = lambda: time.time() + 60.0  # stopping, but with time to spare
    req = engine.submit(GenerationRequest(input_ids=GOOD[0], max_new_tokens=4))  # queued before the loop looks
    engine.start()
    try:
        deadline = time.monotonic() + 30
        while not req.finished and time.monotonic() < deadline:
            time.sleep(0.02)
        assert req.finish_reason == "length"
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_a_stopping_engine_refuses_new_requests_and_finishes_those_in_flight(gpt2: Path) -> None:
    """Told to stop with time to spare: a request in flight streams to its end, a new one is refused at once
    naming the stop, and the engine reports "draining" then "drained" (its launcher SIGTERMs tritonserver only
    then: launcher/node/stop.py LeaderDrain)."""
    engine = Engine(str(gpt2), max_batch_size=2)
    reports: list[str] = []
    engine.report_drain = reports.append
    running = engine.submit(GenerationRequest(input_ids=GOOD[0], max_new_tokens=60))
    engine.start()
    try:
        engine.drain_deadline = lambda: time.time() + 60.0
        deadline = time.monotonic() + 60
        while not reports and time.monotonic() < deadline:
            time.sleep(0.02)
        late = engine.submit(GenerationRequest(input_ids=GOOD[1], max_new_tokens=2))
        assert late.finished and late.finish_reason == "error" and "stopping" in late.error
        while reports[-1:] != ["drained"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running.finish_reason == "length" and len(running.output_ids) == 60
        assert reports == ["draining", "drained"]
    finally:
        engine.shutdown()
