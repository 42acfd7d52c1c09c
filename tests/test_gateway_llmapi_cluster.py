"""The gateway and hpc-serve's clients over the llmapi workflow, on the Slurm test cluster: a tp 1 job, and a tp 2 job
across node1 and node2 (rank 0 on node1: leader node and tritonserver; rank 1 on node2: a worker node), its `tensorrt_llm`
model decoupled (the spec's default), `hpc-serve gateway` in front of it. Clients no one here wrote: the `openai`
package and curl; then `hpc-serve generate` and `hpc.client`, through the gateway and direct to the replica.

A client that leaves mid-stream must free its slot: its generation is stopped with the model's own `stop` input
(hpc/serving/model_io.py). The engine steps at a GPU's pace here (`HPC_SERVE_CPU_MIN_STEP_MS`), and the steps made
after the client left are read from the leader node's counters, not guessed from time.
"""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest

from launcher.contracts.llmapi import CPU_MIN_STEP_VAR
from tests._llmapi import leader_of
from tests.e2e import CLI, cli, served_on_the_cluster, write_spec
from tests.steps import GPU_PACE_MS, LONG_REQUEST, STEPS_AFTER_STOP

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(400)]
openai = pytest.importorskip("openai")

NAME = "llmapi-gw"
PROMPT = "Once upon a time"
LONG = LONG_REQUEST
#: engine steps a generation may run on after its client left: the gateway stops it at once, the model aborts it
#: at its next look (the same bound as every other stop's, though this way has one more process in it)
STEPS_AFTER_LEAVING = STEPS_AFTER_STOP


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def served(request, slurm_cluster, tritonserver, tiny_gpt2, tmp_path_factory):
    """{"job", "deploy", "token", "url", "client"}: the READY job (tp 1 on one node, or tp 2 across two) and a
    gateway on it."""
    tp = request.param
    folder = tmp_path_factory.mktemp(f"llmapi-gw-tp{tp}")
    paced = {CPU_MIN_STEP_VAR: str(GPU_PACE_MS)}
    spec = write_spec(folder, NAME, tiny_gpt2, tp=tp, nodes=tp, workflow="llmapi", env=paced)
    with served_on_the_cluster(folder, spec) as served:
        yield served


def test_the_endpoint_record_says_llmapi_and_the_gateway_sends_to_tensorrt_llm(served):
    replicas = httpx.get(served["url"] + "/gateway/replicas", headers=_auth(served)).json()
    assert [r["workflow"] for r in replicas] == ["llmapi"]
    response = served["client"].completions.with_raw_response.create(model=NAME, prompt=PROMPT, max_tokens=8)
    assert response.headers["x-hpc-serve-replica"].endswith("/0") and response.parse().choices[0].text


def test_the_gateway_counts_each_replicas_kv_cache_blocks_from_the_engines_perf_metrics(served):
    """The llmapi model's perf metrics, per request, summed per replica: a prompt the engine has not seen misses
    every block; asked again, it finds its blocks in the engine's cache (TensorRT-LLM's enable_block_reuse, on
    by default; the CPU engine's prefix_cache.py, across both ranks) and the gateway counts them reused."""

    def counted() -> tuple[float, float]:
        page = httpx.get(served["url"] + "/metrics").text
        return tuple(  # type: ignore[return-value]
            float(line.split()[-1])
            for name in ("reused", "missed")
            for line in page.splitlines()
            if line.startswith(f"hpc_serve_gateway_replica_kv_{name}_blocks_total{{")
        )

    prompt = "A document only this test sends. " * 12
    before = counted()
    served["client"].completions.create(model=NAME, prompt=prompt, max_tokens=2)
    first = counted()
    served["client"].completions.create(model=NAME, prompt=prompt, max_tokens=2)
    second = counted()
    assert first[0] == before[0] and first[1] > before[1], "unseen: every block missed"
    reused, missed = second[0] - first[0], second[1] - first[1]
    assert reused > 0 and reused + missed == first[1] - before[1], "the same blocks, now found"


def test_completions_whole_and_streamed_agree_with_usage_and_finish(served):
    client = served["client"]
    whole = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8)
    (choice,) = whole.choices
    assert choice.text and choice.finish_reason == "length", "the model said why it ended"
    assert whole.usage.completion_tokens == 8 and whole.usage.prompt_tokens > 0
    chunks = list(
        client.completions.create(
            model=NAME, prompt=PROMPT, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text, "greedy: the same text"
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1, "streamed in pieces, not at the end"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_usage_of_a_generation_cut_at_the_context_counts_the_tokens_made(served, tiny_gpt2):
    """`max_tokens` past the model's context: the engine cuts it to the room the prompt leaves (TensorRT-LLM's
    executor too: `_deduce_max_tokens`, a warning), and usage counts the tokens made (it said 100000: the
    `max_tokens` asked), whole and streamed."""
    client = served["client"]
    context = json.loads((tiny_gpt2 / "config.json").read_text())["n_positions"]
    prompt = PROMPT + " and then" * 90
    room = context - client.completions.create(model=NAME, prompt=prompt, max_tokens=1).usage.prompt_tokens
    assert 0 < room < 100, room
    whole = client.completions.create(model=NAME, prompt=prompt, max_tokens=100_000)
    assert (whole.choices[0].finish_reason, whole.usage.completion_tokens) == ("length", room)
    assert whole.usage.total_tokens == context
    options = {"include_usage": True}
    chunks = list(
        client.completions.create(model=NAME, prompt=prompt, max_tokens=10**5, stream=True, stream_options=options)
    )
    assert chunks[-1].usage.completion_tokens == room


def test_chat_and_sampling_fields_reach_the_engine(served):
    client = served["client"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6)
    streamed = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, stream=True))
    assert streamed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == out.choices[0].message.content
    sampled = [
        client.chat.completions.create(
            model=NAME,
            messages=messages,
            max_tokens=12,
            temperature=1.5,
            top_p=0.95,
            seed=seed,
            extra_body={"top_k": 50},
        )
        .choices[0]
        .message.content
        for seed in (7, 7, 8)
    ]
    assert sampled[0] == sampled[1], "the same seed, the same text"
    assert sampled[0] != out.choices[0].message.content or sampled[2] != sampled[0], "sampling reached the engine"


def test_stop_strings_are_cut_the_same_whole_and_streamed(served):
    client = served["client"]
    text = client.completions.create(model=NAME, prompt="The answer is", max_tokens=16).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"pick a visible stop sequence from {text!r}"
    expected = text[: text.find(stop)]
    cut = client.completions.create(model=NAME, prompt="The answer is", max_tokens=16, stop=[stop])
    assert cut.choices[0].text == expected and cut.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=NAME, prompt="The answer is", max_tokens=16, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected and chunks[-1].choices[0].finish_reason == "stop"
    # curl, as OpenAI's API reference writes it: "stop" a string, whole and streamed (server-sent events)
    body = {"model": NAME, "prompt": "The answer is", "max_tokens": 16, "stop": stop}
    whole = json.loads(_curl(served, "/v1/completions", body))
    assert (whole["choices"][0]["text"], whole["choices"][0]["finish_reason"]) == (expected, "stop"), whole
    events = [
        json.loads(line[5:])
        for line in _curl(served, "/v1/completions", body | {"stream": True}).splitlines()
        if line.startswith("data:") and line[5:].strip() != "[DONE]"
    ]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == expected
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "stop"


def _curl_argv(served: dict, path: str, body: dict) -> list[str]:
    """curl's command line for a POST of `body` to the gateway (`-N`: unbuffered, as one reads a stream)."""
    auth = f"Authorization: Bearer {served['token']}"
    return [
        "curl",
        "-sSN",
        "-H",
        auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps(body),
        served["url"] + path,
    ]


def _curl(served: dict, path: str, body: dict) -> str:
    """curl's output of a POST of `body` to the gateway."""
    argv = _curl_argv(served, path, body)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


def test_streaming_carries_every_token_once_through_the_gateway_and_generate_stream(served):
    """At a GPU's pace (a step every GPU_PACE_MS), through the gateway's OpenAI stream and Triton's generate_stream,
    counted by the log probabilities each chunk carries (one a token): every token asked for comes exactly once,
    in many chunks, none of them empty. Not exactly one a chunk: when the model's sends fall behind the engine (a
    loaded machine, tp 2 more often) the tokens that waited go out in one response, by design
    (backend/models/llmapi.py `_stream`), and the gateway holds a token that is only part of a character (its
    text empty) until the token that completes it (docs/compatibility.md "Streaming text never splits a
    character"). Both were seen here: 2 tokens in one event on tp 2, '' then '� a' on tp 1."""
    client, tokens = served["client"], 16
    chunks = [
        c.choices[0].logprobs.tokens
        for c in client.completions.create(
            model=NAME, prompt=PROMPT, max_tokens=tokens, logprobs=0, stream=True, extra_body={"ignore_eos": True}
        )
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.tokens
    ]
    assert sum(len(c) for c in chunks) == tokens and len(chunks) > 1, chunks
    assert all(c[-1] for c in chunks), f"every chunk ends with a token of text: {chunks}"
    body = {
        "text_input": PROMPT,
        "sampling_param_max_tokens": tokens,
        "sampling_param_ignore_eos": True,
        "sampling_param_logprobs": 1,
        "sampling_param_exclude_input_from_output": True,
        "streaming": True,
    }
    lines = _curl(served, "/v2/models/tensorrt_llm/generate_stream", body).splitlines()
    logprobs = [json.loads(line[5:]).get("output_log_probs") for line in lines if line.startswith("data:")]
    # tritonserver's JSON writes a one-element array as its element
    per_event = [len(v) if isinstance(v, list) else int(v is not None) for v in logprobs]
    assert sum(per_event) == tokens and min(per_event) >= 1 and len(per_event) > 1, per_event


def test_the_engines_extensions_ignore_eos_min_tokens_and_repetition_penalty_reach_the_model(served):
    """What vLLM's, aiperf's and genai-perf's bodies carry for fixed lengths, through the openai package's
    extra_body and curl: ignore_eos makes max_tokens (usage and finish say so, whole and streamed), a repetition
    penalty changes the greedy text the same way twice, min_tokens is taken; out of range is a 400 naming it."""
    client = served["client"]
    fixed = {"ignore_eos": True, "min_tokens": 8}
    out = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0, extra_body=fixed)
    assert (out.usage.completion_tokens, out.choices[0].finish_reason) == (24, "length")
    chunks = list(
        client.completions.create(
            model=NAME,
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            extra_body=fixed,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 24
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text

    def greedy(**extra: float) -> str:
        return (
            client.completions.create(model=NAME, prompt=PROMPT, max_tokens=16, temperature=0, extra_body=extra)
            .choices[0]
            .text
        )

    plain, penalized = greedy(), greedy(repetition_penalty=1.8)
    assert penalized != plain and penalized == greedy(repetition_penalty=1.8)
    with pytest.raises(openai.BadRequestError) as exc:
        greedy(repetition_penalty=0)
    assert exc.value.body["param"] == "repetition_penalty"
    curl = subprocess.run(
        [
            "curl",
            "-sS",
            "-H",
            f"Authorization: Bearer {served['token']}",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps({"model": NAME, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True}),
            f"{served['url']}/v1/completions",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(curl.stdout)["usage"]["completion_tokens"] == 12, curl.stdout


def test_log_probabilities_of_the_chosen_tokens_whole_and_streamed(served):
    """hpc-serve's model returns the LLM API's log probabilities (`output_log_probs`, the new tokens' per response):
    one per generated token, their texts make the text, the same streamed and whole (greedy), and they sum to the
    model's cumulative log probability; alternatives are a 400."""
    client = served["client"]
    out = client.completions.create(
        model=NAME, prompt=PROMPT, max_tokens=8, logprobs=0, extra_body={"ignore_eos": True}
    )
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == out.usage.completion_tokens == 8
    assert "".join(lp.tokens) == out.choices[0].text and all(v <= 0 for v in lp.token_logprobs)
    direct = httpx.post(
        served["url"] + "/v2/models/tensorrt_llm/generate",
        json={
            "text_input": PROMPT,
            "sampling_param_max_tokens": 8,
            "sampling_param_ignore_eos": True,
            "return_cumulative_logprob": True,
        },
        headers=_auth(served),
        timeout=60,
    ).json()
    assert sum(lp.token_logprobs) == pytest.approx(float(direct["cumulative_logprob"]), abs=1e-3)
    chunks = list(
        client.completions.create(
            model=NAME, prompt=PROMPT, max_tokens=8, logprobs=0, stream=True, extra_body={"ignore_eos": True}
        )
    )
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs)
    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, logprobs=True
    )
    assert "".join(t.token for t in chat.choices[0].logprobs.content) == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=NAME, prompt=PROMPT, max_tokens=2, logprobs=2)
    assert exc.value.body["param"] == "logprobs"


def _auth(served: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {served['token']}"}


def test_curl_generate_and_generate_stream_of_tensorrt_llm_through_the_gateway(served):
    """TensorRT-LLM's README requests, through the gateway's address."""
    url = served["url"] + "/v2/models/tensorrt_llm/"
    body = {"text_input": PROMPT, "sampling_param_max_tokens": 8}
    auth = f"Authorization: Bearer {served['token']}"
    whole = subprocess.run(["curl", "-sS", "-H", auth, "-d", json.dumps(body), url + "generate"], capture_output=True)
    answer = json.loads(whole.stdout)
    assert answer["model_name"] == "tensorrt_llm" and answer["text_output"].startswith(PROMPT), answer
    stream_body = json.dumps(body | {"streaming": True, "sampling_param_exclude_input_from_output": True})
    streamed = subprocess.run(
        ["curl", "-sSN", "-H", auth, "-d", stream_body, url + "generate_stream"], capture_output=True
    )
    events = [json.loads(line[5:]) for line in streamed.stdout.decode().splitlines() if line.startswith("data:")]
    assert len(events) > 1 and answer["text_output"] == PROMPT + events[-1]["text_output"], events
    # the engine workflow's model, which this deployment lacks: tritonserver's own 404, not a 503 "no replica
    # of the deployment is ready" (those words read as a stopping replica's)
    other = served["url"] + "/v2/models/ensemble/generate"
    wrong = subprocess.run(
        ["curl", "-sS", "-w", " %{http_code}", "-H", auth, "-d", json.dumps({"text_input": PROMPT}), other],
        capture_output=True,
        text=True,
    )
    assert wrong.stdout.endswith(" 404") and "'ensemble' is not found" in wrong.stdout, wrong.stdout


def _steps_after_leaving(served: dict, leave) -> int:
    """Engine steps between a client's leaving (`leave()`: it reads part of a LONG generation, then goes) and
    the engine's having nothing in flight."""
    leader = leader_of(served["deploy"], served["job"])
    leader.wait_for("nothing in flight", lambda s: s.active_requests == 0 and s.waiting_requests == 0)
    before = leader.stats()
    leave()
    gone = leader.stats()
    end = leader.wait_for("nothing in flight", lambda s: s.active_requests == 0 and s.waiting_requests == 0)
    made = end.iterations - before.iterations
    assert gone.iterations > before.iterations and made < LONG, f"made {made} steps: stopped mid-way"
    print(f"steps: {gone.iterations - before.iterations} before the client left, {made} in all")
    return end.iterations - gone.iterations


def test_a_client_gone_mid_stream_frees_its_slot_within_a_few_engine_steps(served):
    def openai_leaves() -> None:
        stream = served["client"].completions.create(model=NAME, prompt=PROMPT, max_tokens=LONG, stream=True)
        for n, _ in enumerate(stream):
            if n == 3:
                break
        stream.close()

    def passthrough_leaves() -> None:
        body = {"text_input": PROMPT, "sampling_param_max_tokens": LONG, "streaming": True}
        url = served["url"] + "/v2/models/tensorrt_llm/generate_stream"
        with httpx.stream("POST", url, json=body, headers=_auth(served), timeout=60) as response:
            events = response.iter_lines()
            while not next(events).startswith("data:"):
                pass

    def curl_killed() -> None:  # a curl of a stream, killed (SIGKILL: no goodbye) once its first chunk came
        body = {"model": NAME, "prompt": PROMPT, "max_tokens": LONG, "stream": True}
        proc = subprocess.Popen(_curl_argv(served, "/v1/completions", body), stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            while not proc.stdout.readline().startswith("data:"):
                assert proc.poll() is None, "curl ended before its first chunk"
        finally:
            proc.kill()
            proc.wait()

    leaves = (openai_leaves, openai_leaves, passthrough_leaves, curl_killed)
    steps = [_steps_after_leaving(served, leave) for leave in leaves]
    print(f"engine steps after the client left (openai, openai, passthrough, curl killed): {steps}")
    assert max(steps) <= STEPS_AFTER_LEAVING, steps


def test_hpc_serve_generate_and_the_python_client_through_the_gateway_and_direct(served):
    from hpc.client import Client

    job = served["job"]
    through = cli("generate", job, PROMPT, "--max-tokens", "8").stdout.strip()
    direct = cli("generate", job, PROMPT, "--max-tokens", "8", "--direct").stdout.strip()
    assert through and through == direct, "greedy: the same text either way"
    streamed = cli("generate", job, PROMPT, "--max-tokens", "8", "--direct", "--stream").stdout.strip()
    assert streamed == direct
    with Client(job, gateway=False) as client:
        assert client.generate(PROMPT, 8).strip() == direct
        assert "".join(client.stream(PROMPT, 8)).strip() == direct
        assert [t.strip() for t in client.generate_batch([PROMPT, PROMPT], 8)] == [direct, direct]


def test_bench_splits_each_requests_latency_with_the_engines_timestamps(served, tmp_path, tiny_gpt2):
    """`hpc-serve bench` through the gateway asks for the engine's timestamps (engine_timing.py) and splits every
    request's latency: outside the engine + queueing + prefill + decode = the latency it measured, and decode
    holds the steps the engine made (7 after the first token, at the paced 20 ms a step). A token's timestamp is
    taken once its step computed, and the pace pads the step after it: a first step slowed by the prompts it
    prefilled beside (concurrency 4) shortens the next pad, so 7 steps hold at least 6 paces (measured: 126 ms,
    not the 140 ms of 7). Direct to the replica, hpc.client fills the same timestamps from the model's last
    response."""
    import asyncio
    import csv

    from hpc.client import AsyncClient
    from hpc.serving.engine_timing import TIMESTAMPS

    out = tmp_path / "bench"
    proc = cli(
        "bench", served["url"], "--token", served["token"], "--output-dir", str(out), "--num-requests", "12",
        "--concurrency", "4", "--input-tokens", "24", "--output-tokens", "8", "--tokenizer", str(tiny_gpt2),
    )  # fmt: skip
    assert "outside the engine p50 / p90 ms" in proc.stdout and "decode p50 / p90 ms" in proc.stdout, proc.stdout
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    assert run["latency_split_ms"]["requests"] == run["completed"] == 12
    rows = list(csv.DictReader((out / "requests.csv").open()))
    for row in rows:
        parts = [float(row[p]) for p in ("outside", "queue", "prefill", "decode")]
        assert sum(parts) == pytest.approx(float(row["latency"]), abs=1e-6), row
        if int(row["output_tokens"]) == 8:
            assert float(row["decode"]) >= 6 * GPU_PACE_MS / 1000 * 0.95, row  # wall clock: a little slack
    assert (out / "latency_split.png").read_bytes()[:4] == b"\x89PNG"

    async def direct() -> dict:
        timing: dict = {}
        async with AsyncClient(served["job"], gateway=False) as client:
            async for _ in client.stream(PROMPT, 4, timing):
                pass
        return timing

    stamps = asyncio.run(direct())
    assert list(stamps) == list(TIMESTAMPS) and list(stamps.values()) == sorted(stamps.values()), stamps


def test_metrics_shows_the_gateways_in_flight_and_reuse_counters_beside_the_replicas_own(served):
    """The llmapi model publishes no in-flight or KV figures; `hpc-serve metrics` reads them from the deployment's
    gateway (its per-replica families), in each replica's row, and `--watch` rates them."""
    served["client"].completions.create(model=NAME, prompt="counted " * 40, max_tokens=2)
    shown = json.loads(cli("metrics", served["job"], "--json").stdout)
    gateway = {s["name"]: s["value"] for s in shown if s["name"].startswith("hpc_serve_gateway_replica_")}
    assert gateway["hpc_serve_gateway_replica_outstanding"] == 0, gateway
    assert gateway["hpc_serve_gateway_replica_kv_missed_blocks_total"] > 0, gateway
    (replica,) = {s["replica"] for s in shown}  # `JOB@cluster/0`, the gateway's key of it too
    assert replica.startswith(served["job"]) and replica.endswith("/0"), replica
    wide = {**os.environ, "COLUMNS": "250"}  # rich's table at full width, as on a terminal
    watched = subprocess.run(
        [*CLI, "metrics", served["job"], "--watch", "0.5", "--count", "1"], env=wide, capture_output=True, text=True
    ).stdout
    assert "in flight (gw)" in watched and "KV reuse (gw)" in watched, watched
