"""The OpenAI bodies' keys (hpc/gateway/bodies.py): a key the gateway neither serves nor ignores is a 400 naming
it and the nearest known one, OpenAI-shaped; the keys clients commonly send that change nothing are accepted
and ignored; the same at every level (messages, content parts, stream_options). Through the whole app (FastAPI's
validation errors and the fast path, which must agree) on a replica that answers "ab" (tests/test_gateway.py
`FakeEngine`), with raw bodies and with the `openai` package as the client. The same against a real replica:
tests/test_gateway_e2e.py `test_an_unknown_field_is_400_naming_it_and_the_ignored_ones_are_served`."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpc.gateway.bodies import (
    CHAT_IGNORED,
    IGNORED_FIELDS,
    MESSAGE_IGNORED,
    PART_IGNORED,
    STREAM_IGNORED,
    ChatMessage,
)
from tests.test_gateway import FakeEngine, app_on

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]


class Recording(FakeEngine):
    """FakeEngine that keeps each request's parameters (the prompt the chat template made)."""

    def __init__(self) -> None:
        super().__init__()
        self.params: list[Any] = []

    def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        self.params.append(params)
        return super().stream(grpc_url, params, token)


@pytest.fixture(scope="module")
def tokenizer(tiny_gpt2):
    from backend.models.tokenizer import load_tokenizer

    return load_tokenizer(tiny_gpt2)


@pytest.fixture(params=[True, False], ids=["fast_path", "fastapi"])
def app(request, tiny_gpt2, tokenizer):
    """The gateway's app (with its fast path, or every request through FastAPI) on one replica, "a"."""
    return app_on(Recording(), tiny_gpt2, tokenizer, request.param, "a")


def _post(app, path: str, body: dict) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            return await http.post(path, json=body)

    return asyncio.run(go())


def _error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


def _answered(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("path", "body", "typo", "meant"),
    [
        (COMPLETIONS, {"prompt": "x", "temprature": 0.5}, "temprature", "temperature"),
        (COMPLETIONS, {"prompt": "x", "max_new_tokens": 4}, "max_new_tokens", "max_tokens"),
        (CHAT, {"messages": HI, "max_completion_token": 4}, "max_completion_token", "max_completion_tokens"),
        (CHAT, {"messages": HI, "temprature": 0.5}, "temprature", "temperature"),
        (CHAT, {"messages": HI, "usr": "me"}, "usr", "user"),
    ],
)
def test_an_unknown_field_is_400_naming_it_with_the_field_meant(app, path, body, typo, meant):
    error = _error(_post(app, path, {"model": "m"} | body))
    assert error == {
        "message": f"{typo}: unknown parameter; did you mean {meant!r}?",
        "type": "invalid_request_error",
        "param": typo,
        "code": "unknown_parameter",
    }


def test_an_unknown_field_nothing_is_near_says_where_the_fields_are_listed(app):
    error = _error(_post(app, CHAT, {"model": "m", "messages": HI, "reasoning_effort": "high"}))
    assert error["param"] == "reasoning_effort" and error["code"] == "unknown_parameter"
    assert "did you mean" not in error["message"] and "What it serves" in error["message"]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_a_body_that_is_not_json_is_400_saying_so_and_where(app, path):
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            return await http.post(
                path, content=b'{"model": "m", "prompt": x}', headers={"content-type": "application/json"}
            )

    error = _error(asyncio.run(go()))
    assert (
        error["message"]
        == "the request body is not valid JSON: Expecting value at offset 25 (0 is its first character)"
    ), error
    assert error["param"] is None and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "field", "bound"),
    [
        (COMPLETIONS, "max_tokens", 2**31 - 1),
        (CHAT, "max_tokens", 2**31 - 1),
        (CHAT, "max_completion_tokens", 2**31 - 1),
        (COMPLETIONS, "top_k", 2**31 - 1),
        (COMPLETIONS, "seed", 2**64 - 1),
    ],
)
def test_an_integer_past_what_its_tensor_holds_is_a_400_naming_it(app, path, field, bound):
    """Past the tensor's range, max_tokens or top_k of 10^12 would wrap round in the INT32 tensor (a 500, "must be
    at least 1, got -727379968") and a seed of 10^30 be a bare "Internal Server Error"."""
    body = {"model": "m", "prompt": "x"} if path == COMPLETIONS else {"model": "m", "messages": HI}
    error = _error(_post(app, path, {**body, field: bound + 1}))
    assert error["param"] == field and str(bound) in error["message"], error
    assert _post(app, path, {**body, field: bound}).status_code == 200, "the bound itself is served"


@pytest.mark.parametrize(
    ("content_type", "body", "said"),
    [
        ("text/plain", b'{"model": "m", "prompt": "x"}', "this request's is 'text/plain'"),
        ("application/x-www-form-urlencoded", b'{"model": "m", "prompt": "x"}', "curl: -H 'Content-Type"),
        (None, b'{"model": "m", "prompt": "x"}', "this request has none"),
        ("application/json", b'["model", "m"]', "must be a JSON object"),
    ],
)
def test_a_body_that_is_no_json_object_or_not_sent_as_json_says_so(app, content_type, body, said):
    """Not pydantic's "Input should be a valid dictionary or object to extract fields from"."""

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            return await http.post(
                COMPLETIONS, content=body, headers={"content-type": content_type} if content_type else {}
            )

    error = _error(asyncio.run(go()))
    assert error["message"].startswith("the request body must be a JSON object") and said in error["message"], error


def test_a_path_or_method_without_a_route_is_answered_in_openais_shape_and_words(app):
    async def go() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            return await http.get(COMPLETIONS), await http.post("/v1/complete", json={})

    wrong_method, wrong_path = asyncio.run(go())
    assert wrong_method.status_code == 405 and "POST" in wrong_method.headers["allow"]
    assert wrong_method.json()["error"]["message"] == f"Invalid method for URL (GET {COMPLETIONS})"
    assert wrong_path.status_code == 404
    assert wrong_path.json()["error"] == {
        "message": "Invalid URL (POST /v1/complete)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_a_missing_field_names_the_bodys_key_that_is_likely_its_typo(app):
    error = _error(_post(app, COMPLETIONS, {"model": "m", "promt": "x"}))
    assert error["param"] == "prompt" and "'promt': a typo of 'prompt'?" in error["message"]
    error = _error(_post(app, CHAT, {"model": "m", "mesages": HI}))
    assert error["param"] == "messages" and "'mesages'" in error["message"]


@pytest.mark.parametrize("field", sorted(IGNORED_FIELDS))
def test_each_ignored_field_is_accepted_by_both_routes(app, field):
    value = {"metadata": {"run": "a"}, "store": True, "prompt_cache_options": {"mode": "implicit"}}.get(field, "x")
    _answered(_post(app, COMPLETIONS, {"model": "m", "prompt": "x", "max_tokens": 2, field: value}))
    _answered(_post(app, CHAT, {"model": "m", "messages": HI, "max_tokens": 2, field: value}))


def test_chats_own_ignored_fields_and_tool_choices_that_ask_for_no_call(app):
    for field in CHAT_IGNORED:
        _answered(_post(app, CHAT, {"model": "m", "messages": HI, field: False}))
    assert _error(_post(app, COMPLETIONS, {"model": "m", "prompt": "x", "parallel_tool_calls": False}))["param"] == (
        "parallel_tool_calls"
    ), "chat's alone: completions have no tools"
    for choice in ("none", "auto"):
        _answered(_post(app, CHAT, {"model": "m", "messages": HI, "tool_choice": choice, "function_call": choice}))
    _answered(_post(app, CHAT, {"model": "m", "messages": HI, "modalities": ["text"]}))
    named = {"type": "function", "function": {"name": "f"}}
    refused = [("tool_choice", "required"), ("tool_choice", named), ("function_call", {"name": "f"})]
    refused += [("modalities", ["text", "audio"])]
    for field, value in refused:
        error = _error(_post(app, CHAT, {"model": "m", "messages": HI, field: value}))
        assert error["param"] == field and "not served by this gateway" in error["message"], error


def test_a_key_set_to_null_asks_for_nothing_whatever_its_name(app):
    _answered(_post(app, CHAT, {"model": "m", "messages": HI, "reasoning_effort": None, "audio": None}))


def test_the_parts_of_a_body_refuse_unknown_keys_and_name_them(app):
    """A message, a content part and stream_options: an unknown key (a typo of `content` would send an empty
    message), a part that is not text (it would be left out of the prompt), a tool turn, vLLM's per-event usage."""
    cases = [
        ([{"role": "user", "contnet": "Hi"}], {}, "messages.0.contnet", "did you mean 'content'?"),
        ([{"role": "user", "content": [{"type": "text", "txt": "Hi"}]}], {}, "messages.0.content.0.txt", "'text'?"),
        (
            HI + [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
            {},
            "messages.1.content.0.type",
            "'image_url' is not served",
        ),
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}], {}, "messages.0.tool_calls", "tool"),
        ([{"role": "tool", "content": "1", "tool_call_id": "1"}], {}, "messages.0.role", "no tool calls"),
        ([{"role": "wizard", "content": "Hi"}], {}, "messages.0.role", "one of system, developer, user, assistant"),
        (HI, {"stream": True, "stream_options": {"include_usag": True}}, "stream_options.include_usag", "usage'?"),
        (HI, {"stream_options": {"continuous_usage_stats": True}}, "stream_options.continuous_usage_stats", "once"),
    ]
    for messages, more, param, said in cases:
        error = _error(_post(app, CHAT, {"model": "m", "messages": messages} | more))
        assert error["param"] == param and said in error["message"], error
        assert error["message"].startswith(f"{param}: ") and "Value error" not in error["message"]


def test_what_a_clients_messages_carry_that_changes_nothing_is_accepted(app):
    """An earlier answer sent back whole (the openai package's `message.model_dump()`: nulls, an empty refusal),
    ignored keys of each part, and content parts joined; a message's `name` reaches the chat template."""
    earlier = {"role": "assistant", "content": "Hello", "refusal": None, "annotations": [], "audio": None}
    earlier |= {"function_call": None, "tool_calls": None}
    parts = [
        {"type": "text", "text": "How "},
        {"type": "text", "text": "are you?", **dict.fromkeys(PART_IGNORED, {"mode": "explicit"})},
    ]
    first = {"role": "user", "content": "Hi", "name": "ann"}
    messages = [first, earlier | dict.fromkeys(MESSAGE_IGNORED, []), {"role": "user", "content": parts}]
    stream = {"stream": True, "stream_options": {"include_usage": True} | dict.fromkeys(STREAM_IGNORED, False)}
    _answered(_post(app, CHAT, {"model": "m", "messages": messages} | stream))
    (params,) = app.state.gateway.engine.params
    assert params.prompt == "user: Hi\nassistant: Hello\nuser: How are you?\nassistant:", "the fallback template"
    assert ChatMessage.model_validate(first).for_template() == first, "the template sees the name, as transformers'"


def test_a_developer_message_reaches_the_chat_template_as_system(app):
    """OpenAI's newer name for the system message (current SDKs send it); a checkpoint's template knows `system`."""
    messages = [{"role": "developer", "content": "Be brief."}, *HI]
    _answered(_post(app, CHAT, {"model": "m", "messages": messages}))
    (params,) = app.state.gateway.engine.params
    assert params.prompt == "system: Be brief.\nuser: Hi\nassistant:", "the fallback template"


def test_the_openai_package_gets_400_for_an_unknown_field_and_answers_with_the_ignored_ones(app):
    """The `openai` package as the client: `extra_body` with a typo is a BadRequestError naming it; `user`,
    `metadata`, `store`, `service_tier`, ... as its own arguments are served; a reply sent back as the package's
    own message object too."""
    openai = pytest.importorskip("openai")

    async def go() -> None:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
        client = openai.AsyncOpenAI(base_url="http://gw/v1", api_key="none", max_retries=0, http_client=http)
        with pytest.raises(openai.BadRequestError) as exc:
            await client.completions.create(model="m", prompt="x", max_tokens=2, extra_body={"temprature": 0.5})
        assert exc.value.status_code == 400 and exc.value.code == "unknown_parameter"
        assert exc.value.param == "temprature" and "did you mean 'temperature'?" in exc.value.message
        ignored = {"user": "u1", "metadata": {"run": "a"}, "store": False, "service_tier": "auto"}
        ignored |= {"safety_identifier": "s1", "prompt_cache_key": "k1"}
        out = await client.completions.create(model="m", prompt="x", max_tokens=2, user="u1")
        assert out.choices[0].text == "ab"
        reply = await client.chat.completions.create(model="m", messages=HI, max_completion_tokens=2, **ignored)
        again = HI + [reply.choices[0].message, {"role": "user", "content": [{"type": "text", "text": "More"}]}]
        chunks = await client.chat.completions.create(
            model="m",
            messages=again,
            stream=True,
            stream_options={"include_usage": True},
            parallel_tool_calls=False,
            tool_choice="none",
            **ignored,
        )
        assert "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices]) == "ab"
        dumped = HI + [reply.choices[0].message.model_dump()]
        assert (await client.chat.completions.create(model="m", messages=dumped)).choices[0].message.content == "ab"
        await http.aclose()

    asyncio.run(go())


def test_the_docs_list_every_ignored_key():
    """docs/gateway.md "What it serves" is where a user looks the list up; the code's lists are what is ignored."""
    page = (Path(__file__).parents[1] / "docs" / "gateway.md").read_text()
    section = page[page.index("## What it serves") :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    listed = {key for name in re.findall(r"`([a-z_.]+)`", section) for key in name.split(".")}
    lists = (IGNORED_FIELDS, CHAT_IGNORED, MESSAGE_IGNORED, STREAM_IGNORED, PART_IGNORED)
    missing = {key for keys in lists for key in keys} - listed
    assert not missing, f"docs/gateway.md's 'What it serves' does not list {sorted(missing)}"


class Broken(FakeEngine):
    """An engine with a bug: what no handler of the gateway's own foresaw."""

    def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        raise OverflowError("Python int too large to convert to C unsigned long")


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "fastapi"])
def test_an_unforeseen_failure_is_a_500_in_openais_shape(tiny_gpt2, tokenizer, fast_path):
    """Not Starlette's plain-text "Internal Server Error", which an OpenAI client cannot read."""
    app = app_on(Broken(), tiny_gpt2, tokenizer, fast_path, "a")

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            return await http.post(COMPLETIONS, json={"model": "m", "prompt": "x"})

    answer = asyncio.run(go())
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert error["type"] == "server_error" and "OverflowError" in error["message"], error


@pytest.mark.parametrize(
    "prompt", ["", ["Hi", ""], [], [[5, 6], []]], ids=["text", "in_a_list", "no_list", "no_token_ids"]
)
def test_an_empty_prompt_is_a_400_naming_prompt_and_reaches_no_replica(app, prompt):
    """GPT-2's tokenizer adds no token to an empty prompt, and an engine given none fails the request (it was the
    model's 500, "the model failed the request"): the gateway says it is the client's to fix."""
    error = _error(_post(app, COMPLETIONS, {"model": "m", "prompt": prompt, "max_tokens": 2}))
    assert error["param"] == "prompt" and "an empty" in error["message"], error
