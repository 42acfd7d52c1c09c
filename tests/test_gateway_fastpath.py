"""The generation routes' fast path (hpc/gateway/fastpath.py) on its own: which requests it answers and which it
hands to the app behind it, with their body intact. Its answers against FastAPI's on a real replica:
tests/test_gateway_e2e.py::test_the_fast_path_answers_as_fastapis_routes_do."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest

from hpc.gateway import openai_api
from hpc.gateway.accesslog import RequestRecord
from hpc.gateway.fastpath import FastPath, is_json
from tests.test_gateway import _gateway

JSON = {"Content-Type": "application/json"}
TOKEN = "secret-token"


@pytest.mark.parametrize(
    ("content_type", "parsed"),
    [
        (None, False),
        (b"application/json", True),
        (b"Application/JSON; charset=utf-8", True),
        (b"application/vnd.api+json", True),
        (b"text/plain", False),
        (b"application/x-www-form-urlencoded", False),
        (b"text/json", False),
    ],
)
def test_json_is_what_fastapi_parses_as_json(content_type, parsed):
    assert is_json(content_type) is parsed


class Behind:
    """The app behind the fast path: records what reached it (method, path, the body it read) and answers 299."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []

    async def __call__(self, scope, receive, send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.seen.append((scope["method"], scope["path"], body))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"behind"})


@pytest.fixture
def served(tiny_gpt2):
    """(post(path, headers, content) → response, the app behind, the records the access log would get)."""
    from backend.models.tokenizer import load_tokenizer
    from hpc.serving.deployment import Target

    gw, _ = _gateway("a")
    gw.target = Target(tiny_gpt2.parent, "m", tiny_gpt2)
    gw.tokenizer = load_tokenizer(tiny_gpt2)
    gw.discovery.tokens = {TOKEN}
    behind = Behind()
    fast = FastPath(behind, routes=openai_api.router.routes)
    records: list[RequestRecord] = []
    holder = SimpleNamespace(state=SimpleNamespace(gateway=gw))

    async def app(scope, receive, send) -> None:  # what Starlette and the access log put in the scope
        record = RequestRecord(scope["method"], scope["path"])
        records.append(record)
        await fast(scope | {"app": holder, "state": {"record": record}}, receive, send)

    def post(path: str, headers: dict, content: bytes | list[bytes]) -> httpx.Response:
        """A list of parts is sent as that many body messages (chunked)."""

        async def parts():
            for part in content:
                yield part

        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
                return await http.post(path, headers=headers, content=parts() if isinstance(content, list) else content)

        return asyncio.run(go())

    return post, behind, records


def _body(**fields) -> bytes:
    return json.dumps({"model": "m", "prompt": "x", "max_tokens": 2} | fields).encode()


def test_a_well_formed_request_is_answered_without_the_app_behind(served):
    post, behind, records = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    response = post("/v1/completions", auth | JSON, _body())
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "ab"
    assert behind.seen == []
    assert records[0].replica == "a" and records[0].completion_tokens == 2 and records[0].prompt_tokens


def test_a_route_error_is_answered_by_the_fast_path_with_its_openai_shape(served):
    post, behind, _ = served
    response = post("/v1/completions", {"Authorization": f"Bearer {TOKEN}"} | JSON, _body(model="other"))
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"
    assert behind.seen == []


def test_what_the_fast_path_does_not_answer_reaches_the_app_behind_with_its_body(served):
    post, behind, _ = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    refused = [
        ("/v1/completions", JSON, _body()),  # no token: the app's 401
        ("/v1/completions", {"Authorization": "Bearer nope"} | JSON, _body()),
        ("/v1/completions", auth, _body()),  # no content type
        ("/v1/completions", auth | {"Content-Type": "text/plain"}, _body()),
        ("/v1/completions", auth | JSON, b'{"model": "m"'),  # not JSON
        ("/v1/completions", auth | JSON, _body(max_tokens=0)),  # does not validate
        ("/v1/chat/completions", auth | JSON, _body()),  # no messages
        ("/v2/models/ensemble/generate", auth | JSON, _body()),  # not a fast route
    ]
    for path, headers, content in refused:
        assert post(path, headers, content).status_code == 299, (path, headers, content)
    assert behind.seen == [("POST", path, content) for path, _, content in refused]


def test_a_body_in_several_messages_is_read_whole(served):
    post, behind, _ = served
    parts = [b'{"model": "m", ', b'"prompt": "x", ', b'"max_tokens": 2}']
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert post("/v1/completions", auth | JSON, parts).json()["choices"][0]["text"] == "ab"
    assert post("/v1/completions", auth | JSON, parts[:2]).status_code == 299, "cut short: the app's 400"
    assert behind.seen == [("POST", "/v1/completions", b"".join(parts[:2]))]
