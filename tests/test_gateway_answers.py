"""The OpenAI answers' models (hpc/gateway/answers.py) against what the gateway sends: every route, answered by the
fast path (hpc/gateway/fastpath.py) and by FastAPI's routes, gives the same bytes (ids and timestamps aside), and
each answer, each stream event, and each error is its model's, key for key (a null key sent, an absent one not).
The same comparison on a real replica: tests/test_gateway_e2e.py::test_the_fast_path_answers_as_fastapis_routes_do.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest

from hpc.serving.engine_timing import TIMESTAMPS, TIMING_HEADER
from hpc.serving.model_io import Chunk
from hpc.serving.triton import ModelError
from tests.test_gateway import app_on

COMPLETIONS, CHAT, MODELS = "/v1/completions", "/v1/chat/completions", "/v1/models"
#: what the engine answers: text with what JSON escapes (a quote, a new line, a non-ASCII character)
PIECES = ("Once", " upon é", ' a "time"', "\n.")
#: a prompt the engine fails half-way (a stream's error event)
FAILS = "FAIL"


class Scripted:
    """An engine answering PIECES, a token each, with their log probabilities when asked, and the engine's
    timestamps on the last; a prompt with FAILS in it breaks after the first piece."""

    async def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        for i, text in enumerate(PIECES):
            if i == 1 and FAILS in params.prompt:
                raise ModelError("the model broke")
            last = i == len(PIECES) - 1
            perf = {name: 1_000 + k for k, name in enumerate(TIMESTAMPS)} if last else None
            yield Chunk(text, 1, (-0.25 * (i + 1),) if params.logprobs else (), perf=perf)


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8} | extra


def _completion(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "Once upon", "max_tokens": 8} | extra


USAGE = {"stream_options": {"include_usage": True}}
TIMING = {TIMING_HEADER: "1"}
#: (path, body or None for a GET, extra headers)
CASES: list[tuple[str, dict[str, Any] | None, dict[str, str]]] = [
    (MODELS, None, {}),
    (COMPLETIONS, _completion(), {}),
    (COMPLETIONS, _completion(logprobs=0), TIMING),
    (COMPLETIONS, _completion(max_tokens=4, stop=["."]), {}),
    (COMPLETIONS, _completion(stream=True), {}),
    (COMPLETIONS, _completion(stream=True, logprobs=0, stop=["time"]) | USAGE, TIMING),
    (COMPLETIONS, _completion(prompt=["a", "b"], echo=True), {}),
    (COMPLETIONS, _completion(n=2, stream=True, echo=True) | USAGE, {}),
    (COMPLETIONS, _completion(prompt=f"{FAILS} x", stream=True), {}),
    (CHAT, _chat(), TIMING),
    (CHAT, _chat(logprobs=True), {}),
    (CHAT, _chat(stream=True) | USAGE, TIMING),
    (CHAT, _chat(stream=True, logprobs=True, stop=["\n"]), {}),
    (CHAT, _chat(n=2), {}),
    (CHAT, _chat(n=2, stream=True, stop=["upon"]) | USAGE, {}),
    (CHAT, _chat(messages=[{"role": "user", "content": f"{FAILS}"}], stream=True), {}),
    (COMPLETIONS, _completion(model="other"), {}),  # 404, the route's
    (COMPLETIONS, _completion(logprobs=3), {}),  # 400, the route's
    (COMPLETIONS, _completion(max_tokens=0), {}),  # 400, the body's validation
    (CHAT, _chat(temprature=0.5), {}),  # 400 unknown_parameter
    (CHAT, _chat(), {"Authorization": "Bearer wrong"}),  # 401
]
STATUSES = [200] * 16 + [404, 400, 400, 400, 401]


def _normalized(text: str) -> str:
    """An answer with what differs between any two (its id, its second) made equal."""
    text = re.sub(r'"id": ?"(chatcmpl|cmpl)-[0-9a-f]+"', r'"id": "\1-X"', text)
    return re.sub(r'"created": ?\d+', '"created": 0', text)


def _answers(fast_path: bool, tiny_gpt2, tokenizer) -> list[httpx.Response]:
    """Every case's answer from a gateway (its fast path on or off) whose one replica `Scripted` answers."""
    app = app_on(Scripted(), tiny_gpt2, tokenizer, fast_path, "a")
    app.state.gateway.discovery.tokens = {"t"}

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=30) as http:
            out = []
            for path, body, headers in CASES:
                sent = {"Authorization": "Bearer t"} | headers
                if body is None:
                    out.append(await http.get(path, headers=sent))
                else:
                    out.append(await http.post(path, json=body, headers=sent))
            return out

    return asyncio.run(go())


@pytest.fixture(scope="module")
def tokenizer(tiny_gpt2):
    from backend.models.tokenizer import load_tokenizer

    return load_tokenizer(tiny_gpt2)


@pytest.fixture(scope="module")
def answers(tiny_gpt2, tokenizer) -> dict[bool, list[httpx.Response]]:
    return {fast: _answers(fast, tiny_gpt2, tokenizer) for fast in (True, False)}


def test_every_route_answers_alike_by_the_fast_path_and_by_fastapis(answers):
    def seen(r: httpx.Response) -> tuple[int, str | None, str | None, str]:
        return r.status_code, r.headers.get("content-type"), r.headers.get("x-hpc-serve-replica"), _normalized(r.text)

    assert [r.status_code for r in answers[True]] == STATUSES, [r.text for r in answers[True]]
    for case, fast, slow in zip(CASES, answers[True], answers[False], strict=True):
        assert seen(fast) == seen(slow), case


def _events(response: httpx.Response) -> list[str]:
    """A stream's events' data, `[DONE]` last."""
    data = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert data[-1] == "[DONE]" or "error" in json.loads(data[-1]), data
    return data


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "fastapi"])
def test_each_answer_is_its_models_key_for_key(answers, fast_path):
    """Parsed by its model and sent again, each answer is the JSON that came: the model names every key sent,
    in its order, with its type, and which keys are there (null or not) and which are not."""
    from hpc.gateway import answers as models

    def fits(model: type[models.Answer], text: str) -> models.Answer:
        parsed = model.model_validate_json(text)
        assert json.dumps(parsed.wire()) == json.dumps(json.loads(text)), (model.__name__, text)
        return parsed

    timed = 0
    for (path, body, headers), response in zip(CASES, answers[fast_path], strict=True):
        if response.status_code != 200:
            fits(models.ErrorBody, response.text)
        elif body is None:
            fits(models.ModelList, response.text)
        elif not body.get("stream"):
            whole = fits(models.ChatCompletion if path == CHAT else models.Completion, response.text)
            assert isinstance(whole, models.Completion | models.ChatCompletion)
            timed += whole.timing is not None
            assert (whole.timing is not None) == (headers == TIMING), "the timing only when asked"
        else:
            chunk = models.ChatCompletionChunk if path == CHAT else models.CompletionChunk
            data = _events(response)
            for event in data[:-1]:
                fits(chunk, event)
            if data[-1] != "[DONE]":
                fits(models.ErrorBody, data[-1])
    assert timed == 2


def test_the_answers_json_is_as_before(answers):
    """What clients depend on, spelled out: a completion's and a chat completion's keys, null or absent."""
    by_case = dict(zip(range(len(CASES)), answers[True], strict=True))
    completion = by_case[2].json()
    assert list(completion) == ["id", "object", "created", "model", "choices", "usage", "hpc_serve_engine_timing"]
    assert list(completion["choices"][0]) == ["index", "finish_reason", "logprobs", "text"]
    assert list(completion["choices"][0]["logprobs"]) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
    chat = by_case[10].json()
    assert list(chat) == ["id", "object", "created", "model", "choices", "usage"]
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "".join(PIECES)}
    assert (
        list(chat["choices"][0]["logprobs"]) == ["content", "refusal"]
        and chat["choices"][0]["logprobs"]["refusal"] is None
    )
    opening, *rest = [json.loads(e) for e in _events(by_case[11])[:-1]]
    assert opening["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    assert rest[0]["choices"] == [{"index": 0, "delta": {"content": "Once"}, "finish_reason": None, "logprobs": None}]
    finish, usage = rest[-2:]
    assert finish["choices"][0]["delta"] == {} and "usage" not in finish and "hpc_serve_engine_timing" in finish
    assert usage["choices"] == [] and set(usage["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert by_case[0].json() == {
        "object": "list",
        "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "hpc-serve"}],
    }
    assert set(by_case[16].json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_a_text_piece_is_its_chunk_models_encoding(chat):
    """The per-token event is a template cut from the model (hpc/gateway/choices.py `Events`): the same bytes as
    the chunk model's whole encoding, for text JSON escapes too."""
    from hpc.gateway.answers import ChatCompletionChunk, CompletionChunk
    from hpc.gateway.choices import Events

    events = Events("cmpl-1", 7, 'a "model"', chat)
    model = ChatCompletionChunk if chat else CompletionChunk
    for text in ("", "x", ' "quoted"\n', "é\x00\u2028", "\\u0000"):
        whole = model(id="cmpl-1", created=7, model='a "model"', choices=[events.choice(0, text)])
        expected = b"data: " + json.dumps(whole.wire()).encode() + b"\n\n"
        assert events.piece(text) == events.event([events.choice(0, text)]) == expected


def test_openapi_describes_every_answer(tiny_gpt2, tokenizer):
    """`/openapi.json` names the answer of each OpenAI route, its streamed chunks and its errors, and every
    schema it refers to is in it."""
    app = app_on(Scripted(), tiny_gpt2, tokenizer, True, "a")

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            return (await http.get("/openapi.json")).json()

    spec = asyncio.run(go())
    ref = "#/components/schemas/"

    def answer(path: str, method: str, status: str, kind: str = "application/json") -> str:
        return spec["paths"][path][method]["responses"][status]["content"][kind]["schema"]["$ref"].removeprefix(ref)

    assert answer(MODELS, "get", "200") == "ModelList"
    assert answer(COMPLETIONS, "post", "200") == "Completion"
    assert answer(COMPLETIONS, "post", "200", "text/event-stream") == "CompletionChunk"
    assert answer(CHAT, "post", "200") == "ChatCompletion"
    assert answer(CHAT, "post", "200", "text/event-stream") == "ChatCompletionChunk"
    assert answer(CHAT, "post", "400") == answer(MODELS, "get", "401") == "ErrorBody"
    schemas = spec["components"]["schemas"]
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(spec)))
    assert refs <= set(schemas), refs - set(schemas)
    assert "hpc_serve_engine_timing" in schemas["ChatCompletionChunk"]["properties"]
    statuses = {status for path in spec["paths"].values() for op in path.values() for status in op["responses"]}
    assert "422" not in statuses, "a request that does not validate is answered 400 (hpc/gateway/errors.py)"
