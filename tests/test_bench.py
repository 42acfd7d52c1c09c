"""`hpc-serve bench`'s parts without a server: workloads and arrivals (seeded, reproducible), the statistics
(percentile math, goodput), the load generator against an in-process stream (concurrency bound, duration, error
kinds), the files and plots it writes; and `metrics`' parsing and rates on a real tritonserver page."""

from __future__ import annotations

import asyncio
import json
import math
import types
from collections.abc import AsyncIterator

import pytest

from hpc.bench import loadgen
from hpc.bench.arrivals import arrival_times
from hpc.bench.loadgen import LoadSpec, run_load
from hpc.bench.replica_metrics import Snapshot, key_of, rates, summable, summed
from hpc.bench.stats import RequestRecord, distribution, summarize
from hpc.bench.workloads import BenchRequest, WordTokenizer, WorkloadSpec, make_requests


@pytest.fixture(scope="module")
def tokenizer(tiny_gpt2):
    from backend.models.tokenizer import load_tokenizer

    return load_tokenizer(tiny_gpt2)


@pytest.mark.slow
def test_token_norm_dist_is_reproducible_and_near_the_asked_lengths(tokenizer):
    spec = WorkloadSpec(input_mean=100, input_stdev=20, output_mean=50, output_stdev=10)
    first = make_requests(spec, 200, tokenizer, seed=7)
    assert first == make_requests(spec, 200, tokenizer, seed=7)
    assert first != make_requests(spec, 200, tokenizer, seed=8)
    inputs = [r.input_tokens for r in first]
    outputs = [r.max_tokens for r in first]
    assert 90 <= sum(inputs) / len(inputs) <= 110 and 45 <= sum(outputs) / len(outputs) <= 55
    assert max(inputs) - min(inputs) > 40, "a standard deviation of 20 spreads the lengths"
    for request in first[:20]:  # the length reported is the prompt's length in the model's tokens
        assert request.input_tokens == len(tokenizer.encode(request.prompt, add_special_tokens=False))


def test_fixed_lengths_and_shared_prefixes(tokenizer):
    fixed = make_requests(WorkloadSpec(kind="fixed", input_mean=64, output_mean=8), 20, tokenizer, seed=1)
    assert {r.max_tokens for r in fixed} == {8}
    assert all(60 <= r.input_tokens <= 68 for r in fixed)
    spec = WorkloadSpec(kind="shared-prefix", input_mean=16, prefix_tokens=128, num_prefixes=3)
    shared = make_requests(spec, 60, tokenizer, seed=1)
    starts = {r.prompt[:200] for r in shared}
    assert len(starts) == 3, "every prompt starts with one of the 3 prefixes"
    assert len({r.prompt for r in shared}) > 50


def test_dataset_jsonl_prompts_and_errors(tmp_path, tokenizer):
    data = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": "Tell me about rivers", "output_tokens": 12},
        {"conversations": [{"from": "human", "value": "Why is the sky blue?"}, {"from": "gpt", "value": "..."}]},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    requests = make_requests(WorkloadSpec(kind="dataset", dataset=data, output_mean=5), 30, tokenizer, seed=3)
    assert {r.prompt for r in requests} == {"Tell me about rivers", "Why is the sky blue?"}
    assert {r.max_tokens for r in requests if r.prompt.startswith("Tell")} == {12}
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"answer": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no prompt"):
        make_requests(WorkloadSpec(kind="dataset", dataset=tmp_path / "bad.jsonl"), 5, tokenizer, seed=0)
    with pytest.raises(ValueError, match="--dataset"):
        WorkloadSpec(kind="dataset")


def test_arrivals_poisson_constant_and_all_at_once():
    poisson = arrival_times(4000, 50.0, "poisson", seed=5)
    assert poisson == arrival_times(4000, 50.0, "poisson", seed=5) != arrival_times(4000, 50.0, "poisson", seed=6)
    assert poisson == sorted(poisson) and poisson[0] == 0.0
    assert 4000 / 50 * 0.95 < poisson[-1] < 4000 / 50 * 1.05  # mean gap 1/rate
    gaps = [b - a for a, b in zip(poisson, poisson[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    stdev = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert 0.9 < stdev / mean < 1.1, "exponential gaps: standard deviation equals the mean"
    assert arrival_times(5, 2.0, "constant") == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="--arrivals"):
        arrival_times(3, 1.0, "bursty")


def test_percentiles_are_linear_interpolation_in_milliseconds():
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    d = distribution(values)
    assert d["mean"] == pytest.approx(50.5)
    assert d["p50"] == pytest.approx(50.5) and d["p90"] == pytest.approx(90.1) and d["p99"] == pytest.approx(99.01)
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def _record(i: int, sent: float, first: float, end: float, tokens: int, error: str | None = None) -> RequestRecord:
    gaps = [(end - first) / (tokens - 1)] * (tokens - 1)
    r = RequestRecord(i, sent, 10, tokens, sent=sent, first=first, end=end, output_tokens=tokens, gaps=gaps)
    r.error = error
    return r


def test_summary_throughput_ttft_itl_errors_and_goodput():
    records = [
        _record(0, 0.0, 0.1, 1.0, 10),  # TTFT 100 ms, TPOT 100 ms
        _record(1, 0.5, 0.55, 1.5, 20),  # TTFT 50 ms, TPOT 50 ms
        _record(2, 1.0, 1.3, 2.0, 8),  # TTFT 300 ms, TPOT 100 ms
        RequestRecord(3, 1.0, 10, 5, sent=1.0, error="Busy"),
    ]
    s = summarize(records, slo_ttft_ms=200, slo_itl_ms=60)
    assert (s["requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["duration_s"] == pytest.approx(2.0)
    assert s["requests_per_s"] == pytest.approx(1.5) and s["output_tokens_per_s"] == pytest.approx(19.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert s["latency_ms"]["mean"] == pytest.approx((1000 + 1000 + 1000) / 3)
    assert s["itl_ms"]["p50"] == pytest.approx(50.0)  # 19 gaps of 50 ms against 9 + 7 of 100 ms
    assert s["errors"] == {"Busy": 1}
    assert s["goodput"]["good_requests"] == 1 and s["goodput"]["requests_per_s"] == pytest.approx(0.5)


def _stream(delay_s: float, pieces: int, fail_every: int = 0):
    calls = {"n": 0, "in_flight": 0, "peak": 0}

    async def send(request: BenchRequest, timing: dict) -> AsyncIterator[str]:
        calls["n"] += 1
        calls["in_flight"] += 1
        calls["peak"] = max(calls["peak"], calls["in_flight"])
        try:
            if fail_every and calls["n"] % fail_every == 0:
                raise TimeoutError
            for _ in range(pieces):
                await asyncio.sleep(delay_s)
                yield " the"
        finally:
            calls["in_flight"] -= 1

    return send, calls


def test_load_generator_bounds_concurrency_counts_tokens_and_errors():
    send, calls = _stream(0.005, 4, fail_every=5)
    requests = [BenchRequest("x", 1, 4)]
    records = asyncio.run(run_load(requests, LoadSpec([0.0] * 40, concurrency=6), send, WordTokenizer()))
    assert len(records) == 40 and calls["peak"] == 6
    ok = [r for r in records if r.ok]
    assert len(ok) == 32 and {r.output_tokens for r in ok} == {4} and all(len(r.gaps) == 3 for r in ok)
    assert summarize(records)["errors"] == {"timeout": 8}


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only where a real one would sleep: with nothing ready to run, it jumps to
    its next timer. What runs on it keeps every schedule exactly, however busy the machine."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        select = self._selector.select  # type: ignore[attr-defined]

        def jump(timeout: float | None = None) -> list:
            if timeout is None:  # no timer: only I/O can wake it (none of these tests waits for I/O)
                return select(None)
            events = select(0)
            if not events:
                self.now += timeout
            return events

        self._selector.select = jump  # type: ignore[attr-defined]

    def time(self) -> float:
        return self.now


def test_load_generator_keeps_the_schedule_and_stops_at_the_duration(monkeypatch):
    """On virtual time (the generator's clock is the loop's): what is checked is how the generator schedules,
    not how late a busy machine wakes it."""
    loop = VirtualTimeLoop()
    monkeypatch.setattr(loadgen, "time", types.SimpleNamespace(perf_counter=loop.time))
    send, calls = _stream(0.1, 2)  # each request takes 0.2 s: a closed loop would fall 10 sends behind per second
    times = arrival_times(1000, 50.0, "constant")  # 20 s of schedule
    try:
        records = loop.run_until_complete(
            run_load([BenchRequest("x", 1, 2)], LoadSpec(times, duration_s=0.5), send, WordTokenizer())
        )
    finally:
        loop.close()
    assert [r.scheduled for r in records] == times[:26], "sent at 0, 0.02, … 0.5, then stopped at the duration"
    assert [r.sent for r in records] == pytest.approx(times[:26]), "an open loop sends on time"
    assert all(r.ok and r.end - r.sent == pytest.approx(0.2) for r in records), "each streamed for its 0.2 s"
    assert calls["peak"] >= 10, "requests overlap: one sent every 0.02 s while the last 0.2 s of them stream"


@pytest.mark.slow
def test_outputs_and_plots_are_written(tmp_path):
    from hpc.bench import plots
    from hpc.bench.report import write_outputs

    records = [_record(i, i * 0.1, i * 0.1 + 0.05, i * 0.1 + 0.5, 10) for i in range(30)]
    records.append(RequestRecord(30, 3.0, 10, 5, sent=3.0, error="ServerError"))
    summary = summarize(records)
    written = write_outputs(tmp_path, {"target": "t"}, [("rate 10/s", summary, records)])
    assert json.loads(written[0].read_text())["runs"][0]["completed"] == 30
    assert len(written[1].read_text().splitlines()) == 32
    for path in (
        plots.distributions(records, tmp_path / "d.png", "t"),
        plots.timeline(records, tmp_path / "t.png", "t"),
        plots.sweep_curve([("a", summary), ("b", summary)], tmp_path / "s.png", "t"),
    ):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


PAGE = """# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="ensemble",version="1"}} {done}
nv_inference_request_success{{model="tensorrt_llm",version="1"}} {done}
# TYPE nv_inference_count counter
nv_inference_count{{model="postprocessing",version="1"}} {tokens}
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="tensorrt_llm",version="1"}} {queue}
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="used",model="tensorrt_llm",version="1"}} {used}
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",model="tensorrt_llm",version="1"}} 256
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"}} 64
"""


def _values(**numbers: float) -> dict[str, float]:
    from hpc.serving.metrics import parse

    return {key_of(s.name, s.labels): s.value for s in parse(PAGE.format(**numbers), prefixes=())}


def test_metrics_rates_and_sums_over_replicas():
    before = _values(done=10, tokens=100, queue=1000, used=0)
    now = _values(done=30, tokens=500, queue=5000, used=12)
    r = rates(now, before, 2.0)
    assert r.requests_per_s == 10.0 and r.tokens_per_s == 200.0 and r.queue_ms == pytest.approx(0.2)
    assert (r.kv_used, r.kv_max) == (12, 256)
    snapshot = Snapshot(0.0, values={"1/0": now, "1/1": _values(done=1, tokens=1, queue=1, used=4)})
    total = summed(snapshot)
    assert (
        total[key_of("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "used", "model": "tensorrt_llm"})]
        == 16
    )
    tokens_per = key_of(
        "nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "tokens_per", "model": "tensorrt_llm"}
    )
    assert not summable(tokens_per) and tokens_per not in total


@pytest.mark.slow
def test_bench_refuses_bad_input_naming_the_option(tmp_path, hpc_home):
    from hpc.cli.main import main

    with pytest.raises(SystemExit):
        main(["bench", "x", "--sweep", "speed=1,2"])
    assert main(["bench", "http://127.0.0.1:9", "--workload", "dataset"]) == 2
    assert main(["bench", str(tmp_path / "nothing.yaml"), "--num-requests", "1"]) == 3
    assert main(["bench", "http://127.0.0.1:9", "--num-requests", "1"]) == 3  # nothing listens there


LLMAPI_PAGE = """# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="tensorrt_llm",version="1"}} {done}
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{model="tensorrt_llm",reason="BACKEND",version="1"}} {failed}
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="tensorrt_llm",version="1"}} 0
"""


def test_metrics_of_an_llmapi_replica_are_what_it_has_and_no_invented_figures():
    """The llmapi model publishes Triton's per-model counters only (docs/decisions.md "The llmapi model as upstream
    ships it"): requests and failures are its; tokens, batch and KV figures are None (shown as "—"), with where
    tokens are counted instead."""
    from hpc.serving.metrics import parse

    def values(**numbers: float) -> dict[str, float]:
        return {key_of(s.name, s.labels): s.value for s in parse(LLMAPI_PAGE.format(**numbers), prefixes=())}

    r = rates(values(done=30, failed=3), values(done=10, failed=1), 2.0)
    assert (r.requests_per_s, r.failures_per_s) == (10.0, 1.0)
    assert (r.tokens_per_s, r.active, r.waiting, r.kv_used, r.kv_max) == (None,) * 5
    assert "gateway" in r.token_source


def test_latency_split_from_the_engines_timestamps():
    """Each part a difference on one clock: outside = the client's latency less the engine's span; queue, prefill
    and decode from the engine's own timestamps. Requests without them are left out of the split (not zeros)."""
    from hpc.bench.report import summary_table

    base = 1_800_000_000 * 10**9  # epoch ns: the engine's clock, unrelated to the client's
    stamps = {
        "arrival_time_ns": base,
        "first_scheduled_time_ns": base + 20_000_000,  # 20 ms queued
        "first_token_time_ns": base + 50_000_000,  # 30 ms prefill
        "last_token_time_ns": base + 450_000_000,  # 400 ms decode
    }
    timed = _record(0, 0.0, 0.1, 0.5, 10)  # 500 ms on the client's clock: 50 ms outside the engine
    timed.engine = dict(stamps)
    untimed = _record(1, 0.0, 0.1, 0.9, 10)
    s = summarize([timed, untimed])
    split = s["latency_split_ms"]
    assert split["requests"] == 1
    assert {part: round(split[part]["p50"], 3) for part in ("outside", "queue", "prefill", "decode")} == {
        "outside": 50.0,
        "queue": 20.0,
        "prefill": 30.0,
        "decode": 400.0,
    }
    assert timed.to_row()["decode"] == pytest.approx(0.4) and untimed.to_row()["decode"] is None
    assert "latency_split_ms" not in summarize([untimed]), "no timestamps, no split"
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(summary_table([("run", s)], "t"))
    text = console.export_text()
    assert "queueing p50 / p90 ms" in text and "400.0 / 400.0" in text
