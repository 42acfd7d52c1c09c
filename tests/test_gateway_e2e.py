"""`hpc-serve gateway` in front of a real job (local executor, tritonserver, CPU engine), with the `openai`
package as the client: the OpenAI API, Triton passthrough, the access token, errors, log probabilities,
metrics, the access log, and the generation routes' fast path answering as FastAPI's routes do. One job and one
CLI gateway for the module (tests/conftest.py `gateway`; a gateway with other options runs in this process, on
the same job). Admission, affinity, several replicas and a client that leaves: tests/test_gateway_e2e_replicas.py."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.e2e import prometheus_samples

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]

openai = pytest.importorskip("openai")


def test_models_lists_the_deployment(client, gateway):
    assert [m.id for m in client.models.list().data] == [gateway["model"]]


def test_completion_usage_and_stream_agree(client, gateway):
    out = client.completions.create(model=gateway["model"], prompt="Once upon a time", max_tokens=8)
    (choice,) = out.choices
    assert choice.text and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 8 and out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8

    chunks = list(
        client.completions.create(
            model=gateway["model"],
            prompt="Once upon a time",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text, "greedy: streamed and whole answers are the same text"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_stop_sequence_is_cut_and_reported(client, gateway):
    whole = client.completions.create(model=gateway["model"], prompt="The answer is", max_tokens=16)
    text = whole.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"pick a visible stop sequence from {text!r}"
    expected = text[: text.find(stop)]
    cut = client.completions.create(model=gateway["model"], prompt="The answer is", max_tokens=16, stop=[stop])
    assert cut.choices[0].text == expected and cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=gateway["model"], prompt="The answer is", max_tokens=16, stop=stop, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_whole_and_streamed(client, gateway):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    out = client.chat.completions.create(model=gateway["model"], messages=messages, max_tokens=6, seed=1)
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content and out.usage.completion_tokens == 6
    chunks = list(
        client.chat.completions.create(model=gateway["model"], messages=messages, max_tokens=6, seed=1, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == out.choices[0].message.content
    sampled = client.chat.completions.create(
        model=gateway["model"],
        messages=messages,
        max_tokens=6,
        temperature=0.8,
        top_p=0.9,
        seed=7,
        extra_body={"top_k": 20},
    )
    assert sampled.usage.completion_tokens <= 6


def test_token_missing_or_wrong_is_401(gateway):
    for key in ("wrong", None):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = httpx.get(gateway["url"] + "/v1/models", headers=headers)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=gateway["url"] + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=gateway["model"], prompt="x", max_tokens=1)
    response = httpx.post(gateway["url"] + "/v2/models/ensemble/generate", json={"text_input": "x", "max_tokens": 1})
    assert response.status_code == 401


def test_unknown_model_is_404_and_bad_fields_are_400(client, gateway):
    with pytest.raises(openai.NotFoundError) as exc:
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    assert exc.value.body["code"] == "model_not_found"
    for bad, field in (({"temperature": 5}, "temperature"), ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model=gateway["model"], prompt="x", **{"max_tokens": 1, **bad})
        assert exc.value.body["param"] == field, exc.value.body


def test_openai_fields_it_does_not_serve_are_400_when_set_and_ignored_at_their_defaults(client, gateway):
    """Refused, naming the field, rather than answered as if honoured: a logit bias, best_of > 1, a suffix, tools
    or functions, a JSON response format, more than MAX_STOPS stop sequences or MAX_MESSAGES messages; their defaults
    (as some clients send them) are served."""
    from hpc.gateway.bodies import MAX_MESSAGES, MAX_STOPS

    model = gateway["model"]
    completions = (
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"extra_body": {"best_of": 2}}, "best_of"),
        ({"suffix": "The end."}, "suffix"),
        ({"stop": [f"s{i}" for i in range(MAX_STOPS + 1)]}, "stop"),
    )
    for bad, field in completions:
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model=model, prompt="x", max_tokens=1, **bad)
        assert exc.value.body["param"] == field, exc.value.body
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    chat = (
        ({"tools": [tool]}, "tools"),
        ({"functions": [tool["function"]]}, "functions"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    )
    messages = [{"role": "user", "content": "Hi"}]
    chat += (({"messages": messages * (MAX_MESSAGES + 1)}, "messages"),)
    for bad, field in chat:
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=model, max_tokens=1, **({"messages": messages} | bad))
        assert exc.value.body["param"] == field, exc.value.body
        assert exc.value.body["message"].startswith(f"{field}: ") and "Value error" not in exc.value.body["message"]
    defaults = {"logit_bias": {}, "extra_body": {"best_of": 1}, "stop": [f"s{i}" for i in range(MAX_STOPS)]}
    assert client.completions.create(model=model, prompt="Once upon", max_tokens=2, **defaults).choices[0].text
    fmt = {"response_format": {"type": "text"}, "tools": []}
    assert client.chat.completions.create(model=model, messages=messages, max_tokens=2, **fmt).choices[0].message


def test_an_unknown_field_is_400_naming_it_and_the_ignored_ones_are_served(client, gateway):
    """As OpenAI answers an argument it does not know: a 400 naming it, with the field meant (a typo answered with
    the default is worse). Fields clients commonly send that change nothing are served, the same answer (each:
    tests/test_gateway_bodies.py), and so is a reply sent back as the package's message object."""
    model, messages = gateway["model"], [{"role": "user", "content": "Hi there"}]
    routes = ((client.completions.create, {"prompt": "x"}), (client.chat.completions.create, {"messages": messages}))
    for create, args in routes:
        with pytest.raises(openai.BadRequestError) as exc:
            create(model=model, max_tokens=1, extra_body={"temprature": 0.5}, **args)
        assert exc.value.code == "unknown_parameter" and exc.value.param == "temprature", exc.value.body
        assert exc.value.body["message"] == "temprature: unknown parameter; did you mean 'temperature'?"
    ignored = {"user": "u1", "metadata": {"run": "e2e"}, "store": False, "service_tier": "auto"}
    ignored |= {"safety_identifier": "s1", "prompt_cache_key": "k1", "parallel_tool_calls": False}
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    same = client.chat.completions.create(model=model, messages=messages, max_tokens=4, **ignored)
    assert same.choices[0].message.content == plain.choices[0].message.content, "greedy: ignored, the same answer"
    again = [*messages, same.choices[0].message, {"role": "user", "content": [{"type": "text", "text": "And?"}]}]
    options = {"stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 3}
    chunks = list(client.chat.completions.create(model=model, messages=again, **options, **ignored))
    assert chunks[-1].usage.completion_tokens == 3
    assert client.completions.create(model=model, prompt="Once", max_tokens=2, user="u1").usage.completion_tokens == 2


def test_a_request_longer_than_the_context_is_400_context_length_exceeded(client, gateway):
    """As OpenAI answers it: 400 `context_length_exceeded` naming `prompt` (or chat's `messages`), streamed or not,
    with the engine's words on what to shorten (the tiny model's context is 256 tokens). A prompt that fits but
    leaves less room than `max_tokens` (or chat's default) asks for is served, cut to the room left, as
    TensorRT-LLM cuts it (greedy, the tiny model never says its end token), and its `finish_reason` is "length".
    The gateway serves on."""
    long_prompt = "Once upon a time " * 200
    cases = [
        (
            lambda **kw: client.completions.create(prompt=long_prompt, max_tokens=4, **kw),
            "prompt",
            "shorten the prompt",
        ),
        (
            lambda **kw: client.chat.completions.create(
                messages=[{"role": "user", "content": long_prompt}], max_tokens=4, **kw
            ),
            "messages",
            "shorten the prompt",
        ),
    ]
    for create, field, advice in cases:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as exc:
                create(model=gateway["model"], stream=stream)
            body = exc.value.body
            assert body["code"] == "context_length_exceeded" and body["param"] == field, body
            assert "max_seq_len" in body["message"] and advice in body["message"], body
    cut = client.completions.create(model=gateway["model"], prompt="Once upon a time", max_tokens=255, temperature=0)
    assert cut.usage.total_tokens == 256, f"cut to the room the prompt left: {cut.usage}"
    assert cut.choices[0].finish_reason == "length", "cut at the context, as at max_tokens: OpenAI's 'length'"
    streamed = list(
        client.completions.create(
            model=gateway["model"], prompt="Once upon a time", max_tokens=255, temperature=0, stream=True
        )
    )
    assert streamed[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text
    chat = client.chat.completions.create(model=gateway["model"], messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].finish_reason in ("length", "stop") and chat.usage.completion_tokens >= 1, chat.usage


def test_a_body_over_the_bound_is_413_unread_or_cut_off_and_the_gateway_serves_on(client, gateway):
    """The gateway's default bound (16 MiB): a larger body is 413 `request_too_large` naming --max-body-mb, on
    the fast path, on FastAPI's routes (the Triton passthrough) and before the token is looked at, whether its
    length is declared (refused unread) or it comes in chunks (refused once it passes the bound); the `openai`
    package gets it as an APIStatusError; the gateway serves on."""
    from hpc.spec.limits import MAX_BODY_MB

    url, headers = gateway["url"], {"Authorization": f"Bearer {gateway['token']}", "Content-Type": "application/json"}
    prompt = "x" * (MAX_BODY_MB * 2**20 + 1)
    body = json.dumps({"model": gateway["model"], "prompt": prompt, "max_tokens": 1}).encode()

    def chunks():
        for i in range(0, len(body), 2**20):
            yield body[i : i + 2**20]

    for path in ("/v1/completions", "/v1/chat/completions", "/v2/models/ensemble/generate"):
        for content, sent in ((body, headers), (chunks(), headers), (body, {})):
            answer = httpx.post(url + path, content=content, headers=sent, timeout=60)
            error = answer.json()["error"]
            assert answer.status_code == 413 and error["code"] == "request_too_large", (path, answer.text[:300])
            assert f"({MAX_BODY_MB} MiB)" in error["message"] and "--max-body-mb" in error["message"], error
    with pytest.raises(openai.APIStatusError) as exc:
        client.completions.create(model=gateway["model"], prompt=prompt, max_tokens=1)
    assert exc.value.status_code == 413
    assert client.completions.create(model=gateway["model"], prompt="Once upon", max_tokens=2).choices[0].text


def test_presence_and_frequency_penalties_reach_the_model_and_out_of_range_is_400(client, gateway):
    """OpenAI's `presence_penalty` / `frequency_penalty` are the ensemble's inputs of the same names: greedy text that
    repeats itself (the tiny random model does) changes under a penalty, and the same penalty twice gives the same
    text; OpenAI's range is -2..2, outside it is 400 naming the field."""

    def text(**penalty: float) -> str:
        out = client.completions.create(
            model=gateway["model"], prompt="Once upon", max_tokens=12, temperature=0, **penalty
        )
        return out.choices[0].text

    plain = text()
    assert len(set(plain.split())) < len(plain.split()), f"the greedy text repeats a word: {plain!r}"
    for name in ("presence_penalty", "frequency_penalty"):
        penalized = text(**{name: 2.0})
        assert penalized != plain and penalized == text(**{name: 2.0}), (name, plain, penalized)
        with pytest.raises(openai.BadRequestError) as exc:
            text(**{name: 2.5})
        assert exc.value.body["param"] == name, exc.value.body


def test_triton_passthrough(gateway):
    """Triton's generate extension through the gateway: the replica's answers, and which replica gave them."""
    headers = {"Authorization": f"Bearer {gateway['token']}"}
    assert httpx.get(gateway["url"] + "/v2/health/live").status_code == 200
    body = {"text_input": "Once upon a time", "max_tokens": 4}
    response = httpx.post(gateway["url"] + "/v2/models/ensemble/generate", json=body, headers=headers, timeout=60)
    assert response.status_code == 200 and response.json()["text_output"], response.text
    with httpx.stream(
        "POST",
        gateway["url"] + "/v2/models/ensemble/generate_stream",
        json={**body, "stream": True},
        headers=headers,
        timeout=60,
    ) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("data:")]
    assert stream.status_code == 200 and events
    replica = f"{gateway['job']}/0"
    assert response.headers["x-hpc-serve-replica"] == stream.headers["x-hpc-serve-replica"] == replica, "as OpenAI's"
    missing = httpx.post(gateway["url"] + "/v2/models/nope/generate", json=body, headers=headers, timeout=60)
    assert missing.status_code >= 400, "the replica's own answer, passed on"


def test_triton_routes_it_does_not_forward_say_so_to_tritonclient(gateway):
    """tritonclient's infer through the gateway: a Triton-shaped 404 that names what is forwarded and where the
    rest is served, not FastAPI's bare "Not Found"."""
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from hpc.gateway.passthrough import NOT_FORWARDED

    headers = {"Authorization": f"Bearer {gateway['token']}"}
    text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([["Hi"]], dtype=object))
    client = httpclient.InferenceServerClient(gateway["url"].removeprefix("http://"))
    with pytest.raises(InferenceServerException) as info:
        client.infer("preprocessing", [text], headers=dict(headers))  # it adds to the dict it is given
    assert NOT_FORWARDED.format(path="/v2/models/preprocessing/infer") in str(info.value)
    assert client.is_server_ready(headers=dict(headers)), "health is forwarded"
    metadata = httpx.get(gateway["url"] + "/v2/models/ensemble", headers=headers)
    assert metadata.status_code == 404 and "hpc-serve endpoints TARGET" in metadata.json()["error"]


def test_logprobs_of_completions_and_chat(client, gateway):
    """The chosen tokens' log probabilities: one per generated token, their texts make the text, the same
    streamed and whole (greedy), and their sum is the ensemble's own `cum_log_probs`."""
    model, prompt = gateway["model"], "Once upon a time"
    out = client.completions.create(model=model, prompt=prompt, max_tokens=8, logprobs=0)
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == out.usage.completion_tokens == 8
    assert "".join(lp.tokens) == out.choices[0].text and all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.top_logprobs[0] == {lp.tokens[0]: lp.token_logprobs[0]}
    direct = httpx.post(
        gateway["url"] + "/v2/models/ensemble/generate",
        json={"text_input": prompt, "max_tokens": 8, "return_log_probs": True},
        headers={"Authorization": f"Bearer {gateway['token']}"},
        timeout=60,
    ).json()
    assert sum(lp.token_logprobs) == pytest.approx(direct["cum_log_probs"], abs=1e-4)

    chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=8, logprobs=0, stream=True))
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs)

    messages = [{"role": "user", "content": "Hi there"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=5, logprobs=True)
    content = chat.choices[0].logprobs.content
    assert len(content) == 5 and "".join(t.token for t in content) == chat.choices[0].message.content
    assert all(t.top_logprobs == [] and t.bytes == list(t.token.encode()) for t in content)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=model, messages=messages, max_tokens=5, logprobs=True, top_logprobs=3)
    assert exc.value.body["param"] == "top_logprobs" and "alternatives" in exc.value.body["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=model, prompt=prompt, max_tokens=2, logprobs=2)
    assert exc.value.body["param"] == "logprobs"


def test_metrics_count_requests_tokens_and_replicas(client, gateway):
    before = prometheus_samples(gateway["url"])
    for _ in range(2):
        client.completions.create(model=gateway["model"], prompt="Hello", max_tokens=3)
    list(client.completions.create(model=gateway["model"], prompt="Hello", max_tokens=3, stream=True))
    after = prometheus_samples(gateway["url"])

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    route = {"route": "/v1/completions"}
    assert grew("hpc_serve_gateway_requests_total", status="200", **route) == 3
    assert grew("hpc_serve_gateway_request_duration_seconds_count", **route) == 3
    assert grew("hpc_serve_gateway_time_to_first_token_seconds_count", **route) == 3
    assert grew("hpc_serve_gateway_output_tokens_total", **route) == 9
    assert grew("hpc_serve_gateway_prompt_tokens_total", **route) > 0
    (replica,) = [dict(k[1])["replica"] for k in after if k[0] == "hpc_serve_gateway_replica_outstanding"]
    assert replica.startswith(gateway["job"] + "/")
    assert after[("hpc_serve_gateway_replica_outstanding", (("replica", replica),))] == 0
    assert grew("hpc_serve_gateway_replica_served_total", replica=replica) == 3
    assert grew("hpc_serve_gateway_picks_total", outcome="least") == 3, "short prompts: no prefix key"
    access = [json.loads(line) for line in gateway["log"].read_text().splitlines() if line.startswith("{")]
    assert [a["stream"] for a in access if a["route"] == "/v1/completions"][-3:] == [False, False, True]
    assert all(a["replica"] == replica and a["completion_tokens"] == 3 for a in access[-3:]), "bare JSON lines"


def _normalized(text: str) -> str:
    """An answer's text with what differs between any two answers (its id, its second) made equal."""
    text = re.sub(r'"id": ?"(chatcmpl|cmpl)-[0-9a-f]+"', r'"id": "\1-X"', text)
    return re.sub(r'"created": ?\d+', '"created": 0', text)


def test_the_fast_path_answers_as_fastapis_routes_do(gateway, serve_app):
    """The same requests to the module's gateway (the generation routes' fast path, hpc/gateway/fastpath.py) and
    to one with `fast_path=False` (every request through FastAPI): the same status, headers and bytes, answers
    and errors alike, streamed or not (ids and timestamps aside)."""
    plain = serve_app(gateway["job"], fast_path=False)
    token = {"Authorization": f"Bearer {gateway['token']}"}
    model = gateway["model"]
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6}
    cases: list[tuple[str, dict, object]] = [
        ("/v1/completions", token, {"model": model, "prompt": "Once upon", "max_tokens": 6}),
        ("/v1/completions", token, {"model": model, "prompt": "Once upon", "max_tokens": 6, "logprobs": 0}),
        ("/v1/completions", token, {"model": model, "prompt": "Once", "stream": True, "max_tokens": 5} | _USAGE),
        ("/v1/chat/completions", token, chat | {"logprobs": True}),
        ("/v1/chat/completions", token, chat | {"stream": True, "stop": ["e"]}),
        ("/v1/completions", token, {"model": "other", "prompt": "x"}),  # 404, the route's APIError
        ("/v1/completions", token, {"model": model, "prompt": "x", "logprobs": 3}),  # 400, the route's
        ("/v1/completions", token, {"model": model, "prompt": "x", "max_tokens": 0}),  # 400, validation
        ("/v1/chat/completions", token, {"model": model, "messages": []}),
        ("/v1/completions", {}, {"model": model, "prompt": "x"}),  # 401
        ("/v1/completions", {"Authorization": "Bearer wrong"}, {"model": model, "prompt": "x"}),
        ("/v1/completions", token, b'{"model": "gw", "prompt": '),  # not JSON
        ("/v1/completions", token | {"Content-Type": "text/plain"}, b'{"model": "gw", "prompt": "x"}'),
        ("/v1/completions", token, b'{"model": "gw", "prompt": "x"}'),  # no content type: FastAPI's 400
        ("/v1/completions", token | _JSON, [b'{"model": "gw", ', b'"prompt": "Once", "max_tokens": 3}']),  # parts
        ("/v1/chat/completions", token, chat | {"temprature": 0.5}),  # 400, an unknown field
        ("/v1/chat/completions", token, chat | {"user": "u1", "metadata": {"run": "a"}}),  # ignored fields
    ]

    def answer(url: str, path: str, headers: dict, body: object) -> tuple[int, str | None, str | None, str]:
        if isinstance(body, dict):
            kwargs: dict = {"json": body}
        else:
            kwargs = {"content": iter(body) if isinstance(body, list) else body}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            r = http.post(path, **kwargs)
        return r.status_code, r.headers.get("content-type"), r.headers.get("x-hpc-serve-replica"), _normalized(r.text)

    for path, headers, body in cases:
        fast, slow = answer(gateway["url"], path, headers, body), answer(plain, path, headers, body)
        assert fast == slow, f"{path} {body!r}"
    statuses = [answer(gateway["url"], *case)[0] for case in cases]
    assert statuses == [200] * 5 + [404, 400, 400, 400, 401, 401, 400, 400, 400, 200, 400, 200], "the cases meant"


_USAGE = {"stream_options": {"include_usage": True}}
_JSON = {"Content-Type": "application/json"}
