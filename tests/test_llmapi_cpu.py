"""The CPU engine on the llmapi workflow inside the real tritonserver (2.51, python backend), in TensorRT-LLM's
process layout: the leader node (`python -m backend.cpu_engine.llmapi.leader_node`, an MPI singleton here) and
tritonserver, both given the spawn-proxy variables (launcher/contracts/llmapi.py proxy_env), on a repository
written by backend/llmapi_repository.py.

Two models share the leader node: `tensorrt_llm` (decoupled: streaming) and `tensorrt_llm_unary` (model.yaml `decoupled:
false`, upstream's default: unary gRPC `infer`, as tools/llmapi_client.py and tools/tests/test_llmapi_cancel.py send).
Client calls are shaped like those (docs/decisions.md "The llmapi model as upstream ships it"). The leader runs its
steps at a GPU's pace (tests/steps.py) so that a stop's effect is counted in engine steps, read from the leader node
itself (protocol.StatsQuery), never timed.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import numpy as np
import pytest

from backend.cpu_engine.llmapi import protocol as p
from launcher.contracts.llmapi import CPU_MIN_STEP_VAR, new_hmac_key
from tests._llmapi import (
    DECOUPLED,
    PROMPT,
    UNARY,
    Job,
    collect,
    flag,
    grpc,
    infer_async,
    inputs,
    running_job,
    stop_inputs,
    stream,
    text_of,
)
from tests._triton import post_json
from tests.e2e import prometheus_samples, wait_for
from tests.steps import GPU_PACE_MS, LONG_REQUEST, STEPS_AFTER_STOP

pytestmark = [pytest.mark.triton, pytest.mark.slow]
CANCELLED = "StatusCode.CANCELLED"
LONG = LONG_REQUEST


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_gpt2) -> Iterator[Job]:
    with running_job(tmp_path_factory.mktemp("llmapi"), str(tiny_gpt2), 1, {CPU_MIN_STEP_VAR: str(GPU_PACE_MS)}) as job:
        yield job


def _greedy(job: Job, text: str = PROMPT, max_tokens: int = 16, **extra: np.ndarray) -> str:
    return text_of(grpc(job).infer(UNARY, inputs(text, max_tokens, **extra), request_id="g"))


# ------------------------------------------------------------------------------------------------ tests
def test_unary_like_llmapi_client(job):
    """llmapi_client.py: unary gRPC, its default text, request id "1"; without exclude_input_from_output the
    prompt is echoed."""
    text = "Born in north-east France, Soyer trained as a"
    done = infer_async(job, UNARY, inputs(text, 16), "1")
    result, error = done.get(timeout=60)
    assert error is None, error
    assert text_of(result).startswith(text) and len(text_of(result)) > len(text)
    excluded = _greedy(job, text, sampling_param_exclude_input_from_output=flag())
    assert excluded and not excluded.startswith(text)


def test_unary_call_on_the_decoupled_model_is_refused_by_triton(job):
    """Why the repository's decoupled follows model.yaml: tritonserver 2.51 serves no unary gRPC call on a
    decoupled model (upstream's unary clients need `decoupled: false`, their default)."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled"):
        grpc(job).infer(DECOUPLED, inputs(), request_id="1")


def test_streaming_events_carry_cumulative_text(job):
    request = inputs(PROMPT, 6, streaming=flag(), return_finish_reason=flag(), return_stop_reason=flag())
    client, events = stream(job, request)
    responses = collect(events)
    client.stop_stream()
    texts = [text_of(r) for r in responses]
    reasons = [r.as_numpy("finish_reason")[0].decode() for r in responses]
    assert len(texts) >= 2 and reasons[:-1] == ["None"] * (len(texts) - 1) and reasons[-1] == "length"
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))
    assert not texts[-1].startswith(PROMPT)  # streamed events carry the generated text only
    assert responses[-1].as_numpy("stop_reason")[0].decode() == "None"
    assert texts[-1] == _greedy(job, max_tokens=6, sampling_param_exclude_input_from_output=flag())


def test_streaming_is_token_by_token(job):
    """hpc-serve's model streams one event per engine step (upstream's model.py passes `streaming` into
    generate_async's lora_request slot and sends one event): 6 tokens, 6 events, each text longer."""
    request = inputs(PROMPT, 6, streaming=flag(), sampling_param_ignore_eos=flag())
    client, events = stream(job, request)
    texts = [text_of(r) for r in collect(events)]
    client.stop_stream()
    assert len(texts) == 6 and all(len(a) < len(b) for a, b in zip(texts, texts[1:], strict=False)), texts


def test_log_probabilities_come_with_each_response_for_its_new_tokens(job):
    """sampling_param_logprobs 1: `output_log_probs` holds the new tokens' log probabilities in every streamed
    response (one a token here) and all of them in a whole one, summing to cumulative_logprob."""
    asked = {"sampling_param_logprobs": np.array([1], np.int32), "sampling_param_ignore_eos": flag()}
    client, events = stream(job, inputs(PROMPT, 6, streaming=flag(), **asked))
    per_event = [list(r.as_numpy("output_log_probs")) for r in collect(events)]
    client.stop_stream()
    assert [len(v) for v in per_event] == [1] * 6 and all(v[0] <= 0 for v in per_event)
    whole = grpc(job).infer(UNARY, inputs(PROMPT, 6, return_cumulative_logprob=flag(), **asked), request_id="lp")
    values = whole.as_numpy("output_log_probs")
    assert len(values) == 6 and sum(values) == pytest.approx(float(whole.as_numpy("cumulative_logprob")[0]), abs=1e-3)
    assert list(values) == pytest.approx([v[0] for v in per_event], abs=1e-5), "greedy: the same tokens"


def test_hpc_serves_own_inputs_reach_the_engine(job):
    """ignore_eos makes max_tokens; repetition_penalty changes the greedy text (the tiny model repeats itself), the
    same way twice; min_tokens is taken (what each does to the tokens: tests/test_trtllm_standin.py)."""
    exclude = {"sampling_param_exclude_input_from_output": flag(), "return_finish_reason": flag()}
    ignoring = grpc(job).infer(UNARY, inputs(PROMPT, 24, sampling_param_ignore_eos=flag(), **exclude), request_id="e")
    assert ignoring.as_numpy("finish_reason")[0].decode() == "length"
    plain = _greedy(job, max_tokens=16, **exclude)
    penalty = {"sampling_param_repetition_penalty": np.array([1.8], np.float32)}
    penalized = _greedy(job, max_tokens=16, **exclude, **penalty)
    assert penalized != plain and penalized == _greedy(job, max_tokens=16, **exclude, **penalty)
    assert _greedy(job, max_tokens=4, sampling_param_min_tokens=np.array([4], np.int32), **exclude)


def test_the_engines_iteration_stats_are_triton_metrics(job):
    """hpc-serve's model reads the LLM's iteration stats (model.yaml enable_iter_perf_stats) into TensorRT-LLM's
    nv_trt_llm_* families: what an ordered stop reads to know what is in flight, and what autoscaling will read."""
    url = f"http://127.0.0.1:{job.server.metrics_port}"
    _greedy(job, max_tokens=4)
    steps = job.stats().iterations  # the leader node's own count, after the request
    counter = ("nv_trt_llm_general_metrics", "iteration_counter")

    def reading(family_kind: tuple[str, str]) -> float | None:
        """The gauge of the model the request went to (each model instance has its LLM and its own gauges)."""
        family, kind = family_kind
        found = [
            value
            for (name, labels), value in prometheus_samples(url).items()
            if name == family and kind in dict(labels).values() and dict(labels).get("model") == UNARY
        ]
        return found[0] if found else None

    wait_for(lambda: (reading(counter) or 0) >= steps, 30, "the metrics to show the engine's iterations")
    assert reading(("nv_trt_llm_request_metrics", "active")) == 0
    assert reading(("nv_trt_llm_kv_cache_block_metrics", "max")) >= 1
    assert reading(("nv_trt_llm_kv_cache_block_metrics", "tokens_per")) == 32


def test_a_pause_of_the_engine_leaves_the_requests_in_flight_on_the_metrics_page(job):
    """A pause of the engine while a request runs (a long prefill on a GPU; here the leader node stopped by
    SIGSTOP for twice the model's stats timeout) ends the model's read of the LLM's stats, and upstream's stats
    result then stays ended until the next request is submitted. The request is still in flight all along: the
    model's own count says so, the engine's gauges keep their last reading (not 0), and what a drain reads
    (renew_plan.active_requests) is at least 1 until the request ended, then 0."""
    import os
    import signal
    import time

    import httpx

    from backend.models.llmapi import STATS_TIMEOUT_S
    from launcher.contracts.renew_plan import active_requests

    url = f"http://127.0.0.1:{job.server.metrics_port}/metrics"
    scrape_text = lambda url: httpx.get(url, timeout=5).text  # noqa: E731
    request = inputs(PROMPT, LONG, streaming=flag(), sampling_param_ignore_eos=flag())
    client, events = stream(job, request, request_id="paused")
    for _ in range(3):
        _result, error = events.get(timeout=60)
        assert error is None, error
    wait_for(lambda: (active_requests(scrape_text(url)) or 0) >= 1, 30, "the request on the metrics page")
    os.kill(job.nodes.pid, signal.SIGSTOP)
    try:
        time.sleep(2 * STATS_TIMEOUT_S)  # the stall itself: what a long prefill is to the model's stats read
    finally:
        os.kill(job.nodes.pid, signal.SIGCONT)
    _result, error = events.get(timeout=60)  # the engine steps again; the request is still streaming
    assert error is None, error
    page = scrape_text(url)
    own = [
        v
        for (name, labels), v in prometheus_samples(url.removesuffix("/metrics")).items()
        if name == "hpc_serve_model_requests_in_flight" and ("model", DECOUPLED) in labels
    ]
    assert own == [1.0], own
    assert (active_requests(page) or 0) >= 1, "a drain must not see 0 while the request runs"
    client.stop_stream(cancel_requests=True)
    wait_for(lambda: active_requests(scrape_text(url)) == 0, 30, "nothing in flight once the request ended")


def test_kv_cache_events_come_on_request_after_an_event_id(job, tiny_gpt2):
    """hpc-serve's model keeps the LLM's KV-cache events (model.yaml kv_cache_config.event_buffer_max_size) and
    answers `kv_cache_events_since` with those after that event id, one JSON list, for routers that follow what
    each replica holds: a prompt of two full blocks is stored as two chained blocks with its tokens."""
    import json

    from backend.models.tokenizer import load_tokenizer

    def events_after(since: int) -> list[dict]:
        asked = inputs("", None, kv_cache_events_since=np.array([since], np.int64))
        return json.loads(grpc(job).infer(UNARY, asked).as_numpy("kv_cache_events")[0])

    last = max((e["event_id"] for e in events_after(-1)), default=-1)
    prompt = " ".join(f"w{i}" for i in range(60))
    ids = load_tokenizer(tiny_gpt2).encode(prompt)
    assert len(ids) > 64, "two full blocks of 32"
    _greedy(job, prompt, max_tokens=1)
    new = wait_for(lambda: events_after(last), 30, "the prompt's KV-cache events")
    stored = [e["data"] for e in new if e["data"]["type"] == "stored"]
    assert stored and stored[0]["parent_hash"] is None
    blocks = [b for s in stored for b in s["blocks"]]
    assert [t["token_id"] for t in blocks[0]["tokens"]] == ids[:32]
    assert events_after(max(e["event_id"] for e in new)) == [], "nothing after the newest"


def test_cancel_sequence_like_test_llmapi_cancel(job):
    """tools/tests/test_llmapi_cancel.py's sequence: stop before any request, a request, stop after it, the same
    request again under another id: the same greedy text."""
    from tritonclient.utils import InferenceServerException

    client = grpc(job)
    request = inputs(PROMPT, 100)
    for _ in range(2):
        with pytest.raises(InferenceServerException) as stopped:
            client.infer(UNARY, stop_inputs(), request_id="1", parameters={"Streaming": False})
        assert stopped.value.status() == CANCELLED and "Request cancelled by client" in stopped.value.message()
        if _ == 0:
            first = client.infer(UNARY, request, request_id="1", parameters={"Streaming": False})
    second = client.infer(UNARY, request, request_id="2", parameters={"Streaming": False})
    assert np.array_equal(first.as_numpy("text_output"), second.as_numpy("text_output"))


def test_stop_without_request_id_is_refused(job):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="A request id must be provided for request cancellation"):
        grpc(job).infer(UNARY, stop_inputs())
    assert _greedy(job)  # still serving


def _assert_stops_soon(job: Job, before: p.Stats) -> None:
    after = job.wait_for("nothing in flight", lambda s: s.active_requests == 0 and s.waiting_requests == 0)
    assert after.iterations - before.iterations <= STEPS_AFTER_STOP, (before, after)


def test_stop_mid_generation_like_stop_after_ms(job):
    """llmapi_client.py --stop-after-ms: a second call with the same request id and `stop`; both end CANCELLED."""
    from tritonclient.utils import InferenceServerException

    start = job.stats()
    done = infer_async(job, UNARY, inputs(PROMPT, LONG), "7")
    before = job.wait_for("the request generating", lambda s: s.iterations >= start.iterations + 5)
    with pytest.raises(InferenceServerException) as stopped:
        grpc(job).infer(UNARY, stop_inputs(), request_id="7", parameters={"Streaming": False})
    assert stopped.value.status() == CANCELLED
    _assert_stops_soon(job, before)
    result, error = done.get(timeout=60)
    assert result is None and error.status() == CANCELLED
    assert _greedy(job)


def test_request_cancel_like_stop_via_request_cancel(job):
    """llmapi_client.py --stop-via-request-cancel: the client cancels its gRPC call; the is_cancelled polling
    aborts the generation."""
    start = job.stats()
    done = infer_async(job, UNARY, inputs(PROMPT, LONG), "8")
    before = job.wait_for("the request generating", lambda s: s.iterations >= start.iterations + 5)
    done.future.cancel()  # type: ignore[attr-defined]
    _assert_stops_soon(job, before)
    assert _greedy(job)


def test_cancel_a_stream_stops_the_generation(job):
    client, events = stream(job, inputs(PROMPT, LONG, streaming=flag()), request_id="9")
    for _ in range(3):
        _result, error = events.get(timeout=60)
        assert error is None, error
    before = job.stats()
    client.stop_stream(cancel_requests=True)
    _assert_stops_soon(job, before)
    assert _greedy(job)


def test_http_generate_like_curl(job):
    """TensorRT-LLM's curl example. Tritonserver 2.51 answers `generate` on the decoupled model too (one
    response); NVIDIA's docs report 501 for it in other versions."""
    body = {"text_input": "What is machine learning?", "sampling_param_max_tokens": 10}
    for model in (UNARY, DECOUPLED):
        status, reply = post_json("127.0.0.1", job.server.http_port, f"/v2/models/{model}/generate", body)
        assert status == 200, reply
        assert reply["text_output"].startswith("What is machine learning?")
    events = job.server.stream(f"/v2/models/{DECOUPLED}/generate_stream", {**body, "streaming": True})
    assert len(events) >= 2 and events[-1]["text_output"].startswith(events[0]["text_output"])
    status, reply = post_json(
        "127.0.0.1", job.server.http_port, f"/v2/models/{UNARY}/generate", {**body, "streaming": True}
    )
    assert status == 400 and "Streaming is only supported in decoupled mode." in reply["error"]


def test_reasons_logprob_and_perf_metrics_are_strings(job):
    result = grpc(job).infer(
        UNARY,
        inputs(
            PROMPT,
            4,
            return_finish_reason=flag(),
            return_stop_reason=flag(),
            return_cumulative_logprob=flag(),
            sampling_param_return_perf_metrics=flag(),
        ),
        request_id="p",
    )
    value = lambda name: result.as_numpy(name)[0].decode()  # noqa: E731
    assert value("finish_reason") == "length" and value("stop_reason") == "None"
    assert float(value("cumulative_logprob")) < 0
    times = [int(value(n)) for n in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns")]
    assert times == sorted(times) and int(value("last_token_time_ns")) >= times[-1] > 0
    assert value("kv_cache_reused_block") == "0" and value("kv_cache_hit_rate") == "0.0"
    assert int(value("kv_cache_alloc_new_blocks")) == int(value("kv_cache_missed_block")) >= 1
    assert value("total_draft_tokens") == "0"


def test_stop_string_ends_the_text_without_it(job, tiny_gpt2):
    """A `sampling_param_stop` string: finish_reason "stop", stop_reason the string, the text cut before it
    (SamplingParams.include_stop_str_in_output is False by default)."""
    from backend.cpu_engine.engine import Engine
    from backend.cpu_engine.scheduler import GenerationRequest
    from backend.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_gpt2)
    reference = Engine(str(tiny_gpt2)).generate(
        GenerationRequest(input_ids=tokenizer.encode(PROMPT), max_new_tokens=8, end_id=tokenizer.end_id)
    )
    ids = reference.output_ids
    at = next(i for i in range(1, len(ids)) if tokenizer.encode(tokenizer.decode(ids[i : i + 1]), False) == [ids[i]])
    stop = tokenizer.decode(ids[at : at + 1])
    result = grpc(job).infer(
        UNARY,
        inputs(
            PROMPT,
            8,
            sampling_param_stop=np.array([stop.encode()], dtype=np.object_),
            sampling_param_exclude_input_from_output=flag(),
            return_finish_reason=flag(),
            return_stop_reason=flag(),
        ),
        request_id="s",
    )
    assert result.as_numpy("finish_reason")[0].decode() == "stop"
    assert result.as_numpy("stop_reason")[0].decode() == stop
    assert text_of(result) == tokenizer.decode(ids[: ids.index(ids[at])])


def test_a_streamed_stop_string_across_a_token_boundary_ends_the_text_before_it(job, tiny_gpt2):
    """A stop string no single token holds (the last character of one token and the first of the next): found in
    the decoded text as upstream's detokenizing result finds it, on a stream: no event carries it, the last one
    is cut before it with finish_reason "stop" and the string as stop_reason."""
    from backend.cpu_engine.engine import Engine
    from backend.cpu_engine.scheduler import GenerationRequest
    from backend.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_gpt2)
    ids = list(
        Engine(str(tiny_gpt2))
        .generate(GenerationRequest(input_ids=tokenizer.encode(PROMPT), max_new_tokens=12, end_id=None))
        .output_ids
    )
    reference = tokenizer.decode(ids)
    assert reference == _greedy(
        job, max_tokens=12, sampling_param_exclude_input_from_output=flag(), sampling_param_ignore_eos=flag()
    )
    boundaries = [len(tokenizer.decode(ids[: k + 1])) for k in range(len(ids) - 1)]
    at = next(
        b - 1
        for b in boundaries
        if 1 <= b < len(reference)
        and reference.startswith(tokenizer.decode(ids[: boundaries.index(b) + 1]))
        and reference.find(reference[b - 1 : b + 1]) == b - 1
        and reference[b - 1 : b + 1].strip() == reference[b - 1 : b + 1]
    )
    across = reference[at : at + 2]
    asked = inputs(
        PROMPT,
        12,
        streaming=flag(),
        sampling_param_ignore_eos=flag(),
        sampling_param_stop=np.array([across.encode()], dtype=np.object_),
        return_finish_reason=flag(),
        return_stop_reason=flag(),
    )
    client, events = stream(job, asked, request_id="across")
    responses = collect(events)
    client.stop_stream()
    texts = [text_of(r) for r in responses]
    assert all(across not in t for t in texts), (across, texts)
    assert texts[-1] == reference[:at]
    assert responses[-1].as_numpy("finish_reason")[0].decode() == "stop"
    assert responses[-1].as_numpy("stop_reason")[0].decode() == across


# ------------------------------------------------------------------------------------------------ bad input
BAD_INPUTS = {  # name → (inputs, words the error must contain)
    "missing text_input": (lambda: inputs(None, 4), "text_input"),
    "max tokens 0": (lambda: inputs(PROMPT, 0), "input 'sampling_param_max_tokens' must be at least 1, got 0"),
    "max tokens < 0": (lambda: inputs(PROMPT, -3), "input 'sampling_param_max_tokens' must be at least 1"),
    "wrong dtype": (
        lambda: inputs(PROMPT, None, sampling_param_max_tokens=np.array([4], np.int64)),
        "sampling_param_max_tokens",
    ),
    "NaN temperature": (
        lambda: inputs(PROMPT, 4, sampling_param_temperature=np.array([np.nan], np.float32)),
        "input 'sampling_param_temperature' must be a finite number",
    ),
    "100k-character prompt": (lambda: inputs("word " * 20_000, 4), "should not exceed max_seq_len (256)"),
    "invalid UTF-8": (lambda: inputs(b"caf\xc3(", 4), "input 'text_input' is not valid UTF-8"),
    "2-D text_input": (
        lambda: inputs(None, 4, text_input=np.array([[b"a"], [b"b"]], dtype=np.object_)),
        "text_input",
    ),
    "not a scalar": (
        lambda: inputs(PROMPT, None, sampling_param_max_tokens=np.array([4, 5], np.int32)),
        "sampling_param_max_tokens",
    ),
    "streaming unary": (
        lambda: inputs(PROMPT, 4, streaming=flag()),
        "Streaming is only supported in decoupled mode.",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gets_an_error_naming_it_and_the_model_serves_on(job, case):
    from tritonclient.utils import InferenceServerException

    make, words = BAD_INPUTS[case]
    with pytest.raises(InferenceServerException) as refused:
        grpc(job).infer(UNARY, make(), request_id="bad")
    assert words in refused.value.message(), refused.value.message()
    assert _greedy(job, max_tokens=2)


def test_max_tokens_past_the_context_are_cut(job):
    """As TensorRT-LLM's LlmRequest::validate: the new tokens are cut to the room the prompt leaves."""
    result = grpc(job).infer(UNARY, inputs(PROMPT, 100_000, return_finish_reason=flag()), request_id="c")
    assert result.as_numpy("finish_reason")[0].decode() == "length"


def test_a_peer_without_the_key_is_refused(job):
    from multiprocessing import AuthenticationError

    wrong = p.endpoint({**job.env, "TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY": new_hmac_key()})
    with pytest.raises((AuthenticationError, EOFError, ConnectionError)):
        p.connect(wrong, timeout_s=5).send(p.Shutdown())
    assert job.nodes.poll() is None and _greedy(job, max_tokens=2)


def test_200_concurrent_requests_all_answered(job):
    """More requests than the engine's batch (4) at once: they queue in the engine, each gets its answer."""
    client = grpc(job)
    done: queue.Queue = queue.Queue()
    for i in range(200):
        client.async_infer(
            UNARY, inputs(PROMPT, 2), lambda result, error: done.put((result, error)), request_id=f"c{i}"
        )
    answers = [done.get(timeout=120) for _ in range(200)]  # a lost answer fails here
    assert [e for _r, e in answers if e is not None] == []
    assert {text_of(r) for r, _e in answers} == {_greedy(job, max_tokens=2)}


def test_the_gateways_engine_asks_a_model_that_is_not_decoupled_for_one_whole_response(job):
    """hpc.serving.triton's stream on both transaction policies of the same model (model.yaml `decoupled`): the
    decoupled one streams `streaming` true; the other is sent `streaming` false (it refuses true, upstream's
    words) and answers once, the whole text with its finish, which the gateway reads as one piece."""
    import asyncio

    from hpc.serving.model_io import GenerateParams
    from hpc.serving.triton import ModelError, TritonEngine

    url = f"127.0.0.1:{job.server.grpc_port}"
    params = GenerateParams(PROMPT, 12)

    async def pieces(model: str, decoupled: bool) -> list:
        engine = TritonEngine(model=model)
        try:
            return [chunk async for chunk in engine.stream(url, params, workflow="llmapi", decoupled=decoupled)]
        finally:
            await engine.close()

    streamed, whole = asyncio.run(pieces(DECOUPLED, True)), asyncio.run(pieces(UNARY, False))
    assert len(streamed) > 1 and len(whole) == 1
    assert (
        whole[0].text
        == "".join(c.text for c in streamed)
        == _greedy(job, max_tokens=12, sampling_param_exclude_input_from_output=flag())
    )
    assert whole[0].finish_reason == streamed[-1].finish_reason == "length" and whole[0].perf
    with pytest.raises(ModelError, match="Streaming is only supported in decoupled mode"):
        asyncio.run(pieces(UNARY, True))
