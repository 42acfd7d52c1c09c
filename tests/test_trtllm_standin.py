"""The CPU engine's stand-in of TensorRT-LLM's public API (backend/standin/tensorrt_llm), in this process (no
spawn proxy: the engine runs in a thread, a world of one rank), held to upstream's contracts: the ones hpc-serve's
model relies on, and the ones NVIDIA's model.py trips over on a GPU, which must trip here too
(docs/compatibility.md "The CPU stand-in of TensorRT-LLM")."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from launcher.contracts.llmapi import STANDIN_ROOT

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def trtllm() -> Iterator[object]:
    """`import tensorrt_llm` as the launcher makes it resolve for backend cpu (the stand-in's folder first)."""
    sys.path.insert(0, str(ROOT / STANDIN_ROOT))
    import tensorrt_llm

    try:
        assert Path(tensorrt_llm.__file__).is_relative_to(ROOT / STANDIN_ROOT)
        yield tensorrt_llm
    finally:
        sys.path.remove(str(ROOT / STANDIN_ROOT))
        for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def llm(trtllm, tiny_gpt2) -> Iterator[object]:
    with trtllm.LLM(model=str(tiny_gpt2), max_batch_size=4, enable_iter_perf_stats=True) as llm:
        yield llm


def _run(coro):  # one event loop per call: a result binds to the loop running when it was made
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------------------ SamplingParams
def test_sampling_params_is_keyword_only_with_upstreams_defaults_and_checks(trtllm):
    params = trtllm.SamplingParams()
    assert (params.max_tokens, params.exclude_input_from_output, params.add_special_tokens) == (32, True, True)
    with pytest.raises(TypeError):
        trtllm.SamplingParams(8)  # upstream's dataclass is kw_only
    with pytest.raises(ValueError, match=r"best_of \(1\) cannot be less than n \(2\)"):
        trtllm.SamplingParams(n=2, best_of=1, top_k=4)
    with pytest.raises(ValueError, match="Greedy decoding in the LLM API does not allow multiple returns"):
        trtllm.SamplingParams(best_of=2)
    for bad, words in [({"top_p": 1.5}, "require 0 <= top_p <= 1"), ({"temperature": -1}, "require temperature >= 0")]:
        with pytest.raises(ValueError, match=words):
            trtllm.SamplingParams(**bad)
    assert trtllm.SamplingParams(logprobs=True).logprobs == 1, "upstream: logprobs=True means top-1"


def test_stop_words_are_tokenized_and_bytes_fail_as_a_hugging_face_tokenizer_fails(trtllm, llm):
    """NVIDIA's helpers.py hands `sampling_param_stop` (a numpy array of bytes) to SamplingParams.stop: the LLM's
    tokenizer refuses it, on a GPU and here."""
    params = trtllm.SamplingParams(stop=["Paris", "x"])._setup(llm.tokenizer)
    assert params._stop_words == [llm.tokenizer.encode(s, add_special_tokens=False) for s in ("Paris", "x")]
    as_sent = np.array([b"Paris"], dtype=np.object_)
    with pytest.raises(ValueError, match="is not valid. Should be a string"):
        llm.generate_async(PROMPT, trtllm.SamplingParams(stop=list(as_sent)))


def test_sampling_params_must_be_the_type(llm):
    with pytest.raises(TypeError, match="The sampling_params must be type SamplingParams or None"):
        llm.generate_async(PROMPT, {"max_tokens": 4})


# ------------------------------------------------------------------------------------------------ results
def test_streaming_yields_the_same_growing_result_token_by_token(trtllm, llm):
    async def stream() -> list[tuple[str, list[int], str | None]]:
        result = llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=6, ignore_eos=True), streaming=True)
        seen = []
        async for output in result:
            assert output is result
            out = output.outputs[0]
            seen.append((out.text_diff, list(out.token_ids_diff), out.finish_reason))
        return seen

    seen = _run(stream())
    assert len(seen) == 6 and all(len(ids) == 1 for _, ids, _ in seen), seen
    assert [reason for *_, reason in seen] == [None] * 5 + ["length"]


def test_a_positional_streaming_lands_in_lora_request_and_gives_one_final_event(trtllm, llm):
    """NVIDIA's model.py calls generate_async(prompt, params, streaming): upstream's third parameter is
    lora_request, dropped without enable_lora, so the request does not stream."""

    async def events() -> int:
        result = llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=6, ignore_eos=True), True)
        return len([o async for o in result])

    assert _run(events()) == 1


def test_ignore_eos_makes_max_tokens_and_min_tokens_holds_the_end_back(trtllm, llm):
    first = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=1)).outputs[0].token_ids[0]
    ends = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=8, end_id=first)).outputs[0]
    assert (ends.token_ids, ends.finish_reason) == ([], "stop"), "the greedy first token is the end: nothing made"
    held = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=8, end_id=first, min_tokens=5)).outputs[0]
    assert len(held.token_ids) >= 5 and first not in held.token_ids[:5]
    ignored = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=8, end_id=first, ignore_eos=True)).outputs[0]
    assert (len(ignored.token_ids), ignored.finish_reason) == (8, "length")


def test_a_stop_string_ends_the_text_without_it_and_is_the_stop_reason(trtllm, llm):
    greedy = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=12, ignore_eos=True)).outputs[0]
    word = llm.tokenizer.decode(greedy.token_ids[4:6])
    stopped = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=12, stop=[word])).outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == word
    assert greedy.text.startswith(stopped.text) and word not in stopped.text[len(stopped.text) - len(word) :]
    kept = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=12, stop=[word], include_stop_str_in_output=True))
    assert kept.outputs[0].text.endswith(word)
    # a stop string across a token boundary: upstream finds it in the decoded text, cuts there and aborts
    start = len(llm.tokenizer.decode(greedy.token_ids[:4])) + 1
    across = greedy.text[start : start + 3]
    cut = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=12, stop=across)).outputs[0]
    assert (cut.text, cut.finish_reason, cut.stop_reason) == (greedy.text[: greedy.text.find(across)], "stop", across)


def _across_a_boundary(tokenizer, ids: list[int], text: str) -> tuple[str, int]:
    """A 2-character string of `text` made of the last character of one generated token and the first of the next
    (so no token holds it: only a match in the decoded text finds it), first found there; and where it starts."""
    for k in range(1, len(ids) - 1):
        end = len(tokenizer.decode(ids[: k + 1]))
        if text.startswith(tokenizer.decode(ids[: k + 1])) and len(text) > end and end >= 1:
            across = text[end - 1 : end + 1]
            if text.find(across) == end - 1 and across.strip() == across:
                return across, end - 1
    raise AssertionError(f"no stop string across a token boundary in {text!r}")


def test_a_stop_string_across_a_token_boundary_ends_a_stream_as_upstreams_detokenizing_result(trtllm, llm):
    """upstream (executor/result.py@a678b91a DetokenizedGenerationResultBase): each streamed output's decoded
    text is searched for the stop strings; the first output holding one is cut before it and is the last
    (finish_reason "stop", the string its stop_reason), and the request is aborted in the engine."""
    greedy = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=16, ignore_eos=True)).outputs[0]
    across, at = _across_a_boundary(llm.tokenizer, greedy.token_ids, greedy.text)

    async def streamed() -> list[tuple[str, bool, str | None, str | int | None]]:
        params = trtllm.SamplingParams(max_tokens=16, ignore_eos=True, stop=[across])
        return [
            (o.outputs[0].text, o.finished, o.outputs[0].finish_reason, o.outputs[0].stop_reason)
            async for o in llm.generate_async(PROMPT, params, streaming=True)
        ]

    events = _run(streamed())
    assert all(across not in text for text, *_ in events), events
    assert events[-1] == (greedy.text[:at], True, "stop", across)
    assert not any(finished for _, finished, *_ in events[:-1])
    assert llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=2)).finished, "the LLM serves on"


def test_an_echoed_prompt_is_searched_for_the_stop_strings_too(trtllm, llm):
    """upstream decodes the returned tokens as one text, the prompt's with them when the input is returned
    (exclude_input_from_output False, not streamed), and searches all of it: a stop string in the prompt cuts
    the answer inside the prompt. Stricter than a client may expect; hpc-serve's gateway always excludes the input."""
    word = PROMPT.split()[1]  # "capital"
    out = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=4, stop=[word], exclude_input_from_output=False))
    assert (out.outputs[0].text, out.outputs[0].stop_reason) == (PROMPT[: PROMPT.find(word)], word)


def test_without_exclude_input_from_output_the_prompt_is_echoed_unless_streaming(trtllm, llm):
    echoed = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=4, exclude_input_from_output=False))
    assert echoed.outputs[0].text.startswith(PROMPT)
    assert not llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=4)).outputs[0].text.startswith(PROMPT)


def test_abort_ends_the_request_cancelled_and_the_llm_serves_on(trtllm, llm):
    async def aborted() -> tuple[str | None, int]:
        result = llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=200, ignore_eos=True), streaming=True)
        async for output in result:
            if len(output.outputs[0].token_ids) == 2:
                result.abort()
        return result.outputs[0].finish_reason, len(result.outputs[0].token_ids)

    reason, made = _run(aborted())
    assert reason == "cancelled" and made < 200
    assert llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=2)).finished


def test_a_prompt_past_the_context_is_refused_in_upstreams_words(trtllm, llm):
    with pytest.raises(ValueError, match=r"The sum of prompt length \(\d+\.0\), query length \(0\) should not exceed"):
        llm.generate_async("word " * 2000, trtllm.SamplingParams(max_tokens=2))


def test_async_reads_need_the_loop_the_result_was_made_on(trtllm, llm):
    result = llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=2))  # no running loop here
    with pytest.raises(AssertionError, match="asyncio event loop was not present during initialization"):
        _run(result.aresult())
    assert result.result().finished, "the synchronous read works"


def test_perf_metrics_only_when_asked(trtllm, llm):
    out = llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=3, return_perf_metrics=True)).outputs[0]
    timing = out.request_perf_metrics.timing_metrics
    assert timing.arrival_time <= timing.first_token_time <= timing.last_token_time
    assert out.request_perf_metrics.kv_cache_metrics.num_total_allocated_blocks >= 1
    assert llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=3)).outputs[0].request_perf_metrics is None


# ------------------------------------------------------------------------------------------------ stats
@pytest.fixture()
def stats_llm(trtllm, tiny_gpt2) -> Iterator[object]:
    """An LLM of its own: upstream's stats result is made by its first request, and `async for` over it works only
    when that request came with an event loop running (the module's `llm` made its first one blocking)."""
    with trtllm.LLM(model=str(tiny_gpt2), max_batch_size=4, enable_iter_perf_stats=True) as llm:
        yield llm


def test_iteration_stats_come_as_upstreams_dicts_once_per_new_iteration(trtllm, stats_llm, tiny_gpt2):
    llm = stats_llm

    async def read(request: bool) -> list[dict]:
        if request:
            await llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=3)).aresult()
        return [s async for s in llm.get_stats_async(0.3)]

    (stats,) = _run(read(request=True))
    assert stats["iter"] >= 3 and stats["numActiveRequests"] == 0 and stats["numQueuedRequests"] == 0
    assert stats["kvCacheStats"]["maxNumBlocks"] >= 1 and stats["kvCacheStats"]["tokensPerBlock"] == 32
    assert _run(read(request=False)) == [], "nothing new: upstream yields nothing until the next iteration"
    with trtllm.LLM(model=str(tiny_gpt2), max_batch_size=2) as quiet:
        quiet.generate(PROMPT, trtllm.SamplingParams(max_tokens=2))
        assert quiet.get_stats(0.3) == [], "without enable_iter_perf_stats the PyTorch backend keeps none"


def test_stats_end_for_good_after_a_read_timed_out_until_the_next_request(trtllm, tiny_gpt2, monkeypatch):
    """upstream's IterationResult is one object for the LLM's life (executor.py `_maybe_initialize_iteration_results`):
    once a read waited its timeout, every later read ends at once, even while the engine steps, until a request
    is submitted (which marks it undone). A reader of a long request therefore sees nothing after one gap of the
    timeout (a long prefill on a GPU): what hpc-serve's model guards against by counting its own requests. The
    engine steps every 100 ms here, so a read that waits 20 ms for an iteration times out while a request runs."""
    monkeypatch.setenv("HPC_SERVE_CPU_MIN_STEP_MS", "100")
    with trtllm.LLM(model=str(tiny_gpt2), max_batch_size=4, enable_iter_perf_stats=True) as llm:

        async def scenario() -> tuple[list[dict], list[dict]]:
            long = llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=60, ignore_eos=True), streaming=True)
            assert llm.get_stats_async(5) is llm.get_stats_async(5), "one shared object, as upstream's"
            async for _ in llm.get_stats_async(0.02):  # ends at the first gap of 20 ms between iterations
                pass
            first = await long.__anext__()  # the request is live and stepping
            assert not first.finished
            gone = [s async for s in llm.get_stats_async(30)]  # done: ends at once, though the request steps
            after = llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=2))
            fresh = []
            async for stats in llm.get_stats_async(30):  # the submit marked it undone
                fresh.append(stats)
                break
            long.abort()
            await after.aresult()
            async for _ in long:
                pass
            return gone, fresh

        gone, fresh = _run(scenario())
    assert gone == [], "upstream: a done IterationResult ends every read at once"
    assert len(fresh) == 1 and fresh[0]["numActiveRequests"] >= 1, "a new request makes the stats flow again"


def test_async_stats_need_a_loop_when_the_first_request_was_made(trtllm, tiny_gpt2):
    """upstream's IterationResult takes its asyncio queue when the first request makes it: after a blocking
    `generate`, `async for` over the stats fails with upstream's AssertionError (blocking reads still work)."""
    with trtllm.LLM(model=str(tiny_gpt2), max_batch_size=2, enable_iter_perf_stats=True) as llm:
        llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=2))

        async def read() -> list[dict]:
            return [s async for s in llm.get_stats_async(0.2)]

        with pytest.raises(AssertionError, match="event loop was not present"):
            _run(read())
        assert llm.get_stats(0.2), "the blocking read has the iterations"


def test_more_than_one_rank_needs_the_launch(trtllm, tiny_gpt2):
    with pytest.raises(RuntimeError, match="only under trtllm-llmapi-launch"):
        trtllm.LLM(model=str(tiny_gpt2), tensor_parallel_size=2)


def test_shutdown_is_final(trtllm, tiny_gpt2):
    llm = trtllm.LLM(model=str(tiny_gpt2))
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shutting down or has already been shut down"):
        llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=2))


# ------------------------------------------------------------------------------------------------ KV-cache events
def test_kv_cache_events_follow_the_cached_blocks_in_upstreams_shape(trtllm, tiny_gpt2):
    """kv_cache_config.event_buffer_max_size > 0 with block reuse: "created", then "stored" for a prompt's new full
    blocks (chained by parent_hash, with their tokens), nothing for a prompt found whole in the cache, "removed"
    when blocks are evicted; reading before any request is upstream's AssertionError."""
    kv = {"event_buffer_max_size": 64, "tokens_per_block": 4, "max_tokens": 48}
    with trtllm.LLM(model=str(tiny_gpt2), max_batch_size=2, kv_cache_config=kv) as llm:
        with pytest.raises(AssertionError, match="KV Event IterationResult is not properly instantiated"):
            llm.get_kv_cache_events(0.1)
        prompt = list(range(10, 19))  # 9 tokens: 2 full blocks of 4 (the last token is always computed)
        llm.generate(prompt, trtllm.SamplingParams(max_tokens=1, end_id=-1))
        events = llm.get_kv_cache_events(0.2)
        assert [e["data"]["type"] for e in events] == ["created", "stored"]
        assert [e["event_id"] for e in events] == [0, 1] and events[0]["window_size"] >= 9
        stored = events[1]["data"]
        assert stored["parent_hash"] is None
        assert [[t["token_id"] for t in b["tokens"]] for b in stored["blocks"]] == [prompt[:4], prompt[4:8]]
        llm.generate(prompt, trtllm.SamplingParams(max_tokens=1, end_id=-1))
        assert llm.get_kv_cache_events(0.2) == [], "found whole in the cache: nothing new is stored"
        longer = [*prompt[:8], 40, 41, 42, 43, 44]
        llm.generate(longer, trtllm.SamplingParams(max_tokens=1, end_id=-1))
        (more,) = llm.get_kv_cache_events(0.2)
        assert more["data"]["parent_hash"] == stored["blocks"][1]["block_hash"], "chained after the cached prefix"
        for start in range(100, 160, 12):  # new prompts until the cache must evict
            llm.generate(list(range(start, start + 9)), trtllm.SamplingParams(max_tokens=1, end_id=-1))
        kinds = [e["data"]["type"] for e in llm.get_kv_cache_events(0.2)]
        assert "removed" in kinds and "stored" in kinds
    with trtllm.LLM(model=str(tiny_gpt2), max_batch_size=2) as quiet:
        quiet.generate(PROMPT, trtllm.SamplingParams(max_tokens=2))
        assert quiet.get_kv_cache_events(0.1) == [], "upstream's default event_buffer_max_size is 0: none"


def test_stats_run_on_while_the_engine_steps(trtllm, stats_llm):
    """upstream's IterationResult: `async for` over get_stats_async yields each new iteration until none came for
    `timeout` seconds, so it runs on across requests and a reader that waits for the loop to end waits as long as
    the engine steps. Each item here comes after a request ran to its end inside the loop: no race with the
    engine's pace (a request racing the reads can lose on a loaded core)."""
    llm = stats_llm

    async def during() -> list[int]:
        await llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=4)).aresult()  # stats exist from here
        iterations: list[int] = []
        async for stats in llm.get_stats_async(20):
            iterations.append(stats["iter"])
            if len(iterations) == 3:
                break
            await llm.generate_async(PROMPT, trtllm.SamplingParams(max_tokens=4, ignore_eos=True)).aresult()
        return iterations

    first, second, third = _run(during())
    assert first < second < third, "each item is a later iteration, and the loop did not end between requests"


def test_model_yaml_goes_through_update_llm_args_with_extra_dict_as_upstreams_model_does(trtllm, tiny_gpt2):
    """Sections become their classes, built from the mapping's keys: a misspelt kv_cache_config key fails there."""
    from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict

    args = update_llm_args_with_extra_dict({}, {"model": str(tiny_gpt2), "kv_cache_config": {"tokens_per_block": 16}})
    assert isinstance(args["kv_cache_config"], trtllm.KvCacheConfig) and args["kv_cache_config"].tokens_per_block == 16
    with trtllm.LLM(**args) as llm:
        assert llm.generate(PROMPT, trtllm.SamplingParams(max_tokens=2)).finished
    with pytest.raises(TypeError, match="tokens_per_blok"):
        update_llm_args_with_extra_dict({}, {"kv_cache_config": {"tokens_per_blok": 16}})
