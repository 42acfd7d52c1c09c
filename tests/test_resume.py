"""A stream whose replica fails it half-way goes on on another replica (hpc/serving/resume.py; the gateway's
`Gateway.resumed`, the Python client's `_from_replicas`): the prompt and the text made so far are sent on for the
tokens left, and the client reads one answer, by the gateway's fast path and by FastAPI's alike; an error of the
request itself (not of its replica) is not resumed, and a failure that follows the request ends it after RESUMES
continuations."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx
import pytest

from hpc.serving.model_io import Chunk
from hpc.serving.resume import RESUMES
from hpc.serving.triton import ContextTooLong, ModelError, ReplicaUnavailable
from tests.test_gateway import app_on


class Breaking:
    """Answers `pieces` tokens ("t0", "t1", ...), a token a piece, on every replica; the `breaks` first streams
    raise `error` after `after` pieces. Each call's replica and parameters are kept."""

    def __init__(
        self, error: BaseException, after: int = 2, breaks: int = 1, finish: bool = True, counted: bool = True
    ) -> None:
        self.error, self.after, self.breaks, self.finish, self.counted = error, after, breaks, finish, counted
        self.calls: list[tuple[str, Any]] = []
        self.on_break: Any = None  # called as a stream breaks (a test's discovery dropping the replica)

    async def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        self.calls.append((grpc_url, params))
        breaking = len(self.calls) <= self.breaks
        for i in range(params.max_tokens + 1):
            if breaking and i == self.after:
                if self.on_break is not None:
                    self.on_break()
                raise self.error
            if i < params.max_tokens:
                last = self.finish and i == params.max_tokens - 1
                yield Chunk(f" t{i}", 1 if self.counted else None, finish_reason="length" if last else None)

    async def close(self) -> None:
        """As TritonEngine's: its channels closed."""


@pytest.fixture(scope="module")
def tokenizer(tiny_gpt2):
    from backend.models.tokenizer import load_tokenizer

    return load_tokenizer(tiny_gpt2)


def _stream(
    engine, tiny_gpt2, tokenizer, fast_path: bool, body: dict, replicas=("a", "b", "c"), hold_s: float = 0
) -> tuple[list, Any]:
    """The stream's events' data (JSON, `[DONE]` as the string) and the gateway (`hold_s`: its autoscale.hold_s)."""
    app = app_on(engine, tiny_gpt2, tokenizer, fast_path, *replicas)
    app.state.gateway.discovery.tokens = {"t"}
    if hold_s:  # and the replica gone from discovery as its stream breaks: nothing serves
        app.state.gateway.target = dataclasses.replace(app.state.gateway.target, hold_s=hold_s)
        engine.on_break = lambda: app.state.gateway.balancer.update([])
    sent = {"model": "m", "prompt": "Once upon", "stream": True, "stream_options": {"include_usage": True}} | body

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=30) as http:
            return await http.post("/v1/completions", json=sent, headers={"Authorization": "Bearer t"})

    answer = asyncio.run(go())
    assert answer.status_code == 200, answer.text
    data = [line.removeprefix("data: ") for line in answer.text.split("\n\n") if line]
    return [d if d == "[DONE]" else json.loads(d) for d in data], app.state.gateway


def _text(events: list) -> str:
    return "".join(e["choices"][0]["text"] or "" for e in events if isinstance(e, dict) and e.get("choices"))


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("error", [ReplicaUnavailable("a: the stream ended"), ModelError("engine shut down")])
def test_a_stream_its_replica_failed_half_way_goes_on_on_another(tiny_gpt2, tokenizer, fast_path, error, caplog):
    engine = Breaking(error, after=2)
    events, _ = _stream(engine, tiny_gpt2, tokenizer, fast_path, {"max_tokens": 6, "min_tokens": 5})
    assert events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict)), events
    (first, asked), (second, more) = engine.calls
    assert second != first
    assert more.prompt == asked.prompt + " t0 t1" and more.max_tokens == 4 and more.min_tokens == 3
    assert _text(events) == " t0 t1 t0 t1 t2 t3"
    assert events[-2]["usage"]["completion_tokens"] == 6
    assert [e for e in events if isinstance(e, dict) and e.get("choices")][-1]["choices"][0][
        "finish_reason"
    ] == "length"
    said = [r.getMessage() for r in caplog.records if "goes on on another replica" in r.getMessage()]
    assert said == [f"replica {first} failed a stream after 2 token(s) ({error}); it goes on on another replica"]


def test_a_failure_that_follows_the_request_ends_it_after_the_continuations(tiny_gpt2, tokenizer):
    engine = Breaking(ModelError("the model broke"), after=1, breaks=RESUMES + 5)
    events, _ = _stream(engine, tiny_gpt2, tokenizer, True, {"max_tokens": 6})
    assert "the model broke" in events[-1]["error"]["message"], events
    replicas = [replica for replica, _ in engine.calls]
    assert len(replicas) == RESUMES + 1 and len(set(replicas)) == RESUMES + 1, "each on a replica not tried"


def test_an_error_of_the_request_itself_is_not_resumed(tiny_gpt2, tokenizer):
    engine = Breaking(ContextTooLong("the prompt leaves no room"), after=2)
    events, _ = _stream(engine, tiny_gpt2, tokenizer, True, {"max_tokens": 6})
    assert "error" in events[-1] and len(engine.calls) == 1, events


@pytest.mark.parametrize("hold_s", [0, 600])
def test_with_no_other_replica_the_first_failure_is_the_answer(tiny_gpt2, tokenizer, hold_s):
    """At once, even under `autoscale.hold_s` (a request that finds nothing serving is held; a stream half-way is
    not: its client has waited for text since its replica failed)."""
    engine = Breaking(ReplicaUnavailable("a: the stream ended"), after=2)
    events, _ = _stream(engine, tiny_gpt2, tokenizer, True, {"max_tokens": 6}, replicas=("a",), hold_s=hold_s)
    assert "the stream ended" in events[-1]["error"]["message"] and len(engine.calls) == 1, events
    assert _text(events) == " t0 t1"


def test_a_stream_that_had_made_every_token_ends_at_its_length_without_another_replica(tiny_gpt2, tokenizer):
    """The replica made all 3 tokens, then failed before its final response (a model that says its finish)."""
    engine = Breaking(ReplicaUnavailable("a: the stream ended"), after=3, finish=False)
    events, _ = _stream(engine, tiny_gpt2, tokenizer, True, {"max_tokens": 3})
    assert events[-1] == "[DONE]" and len(engine.calls) == 1, events
    assert _text(events) == " t0 t1 t2" and events[-2]["usage"]["completion_tokens"] == 3
    assert [e for e in events if isinstance(e, dict) and e.get("choices")][-1]["choices"][0][
        "finish_reason"
    ] == "length"


def _client_text(engine, tiny_gpt2, max_tokens: int, replicas=("a", "b", "c")) -> str:
    """What the Python client's direct path (no gateway) streams from `replicas`, whose requests `engine` answers."""
    import httpx as _httpx

    from hpc.client.aio import AsyncClient
    from hpc.serving.balancer import Replica
    from hpc.serving.deployment import Target
    from hpc.serving.model_io import GenerateParams

    async def go() -> str:
        client = AsyncClient(Target(tiny_gpt2.parent, "m", tiny_gpt2), gateway=False)
        client._http, client._engine = _httpx.AsyncClient(), engine
        client._balancer.update([Replica(key=k, http_url=f"http://{k}", grpc_url=k) for k in replicas])
        try:
            return "".join([p async for p in client._from_replicas(GenerateParams("Once upon", max_tokens))])
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("counted", [True, False])
def test_the_python_clients_stream_goes_on_on_another_replica(tiny_gpt2, tokenizer, counted):
    """Counted by the engine, or (llmapi: none counted) by the deployment's tokenizer, loaded for it."""
    engine = Breaking(ReplicaUnavailable("a: the stream ended"), after=2, counted=counted)
    made = 2 if counted else len(tokenizer.encode(" t0 t1", add_special_tokens=False))
    assert _client_text(engine, tiny_gpt2, 8) == " t0 t1" + "".join(f" t{i}" for i in range(8 - made))
    (first, asked), (second, more) = engine.calls
    assert second != first and more.prompt == asked.prompt + " t0 t1" and more.max_tokens == 8 - made


def test_the_python_clients_stream_ends_with_its_first_failure_when_none_can_go_on(tiny_gpt2):
    from hpc.client.errors import ServerError

    engine = Breaking(ReplicaUnavailable("a: the stream ended"), after=2)
    with pytest.raises(ServerError, match="the stream ended"):
        _client_text(engine, tiny_gpt2, 5, replicas=("a",))
    engine = Breaking(ModelError("the model broke"), after=1, breaks=RESUMES + 5)
    with pytest.raises(ServerError, match="the model broke"):
        _client_text(engine, tiny_gpt2, 5)
    assert len(engine.calls) == RESUMES + 1


def test_each_of_several_streamed_choices_goes_on_on_another_replica(tiny_gpt2, tokenizer):
    """`n` 2: the first choice's replica fails it half-way; both choices end whole, usage counting every token."""
    engine = Breaking(ReplicaUnavailable("a: the stream ended"), after=2)
    events, _ = _stream(engine, tiny_gpt2, tokenizer, True, {"max_tokens": 4, "n": 2})
    assert events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict)), events
    texts = {0: "", 1: ""}
    for event in events:
        if isinstance(event, dict):
            for choice in event.get("choices") or ():
                texts[choice["index"]] += choice.get("text") or ""
    assert sorted(texts.values()) == [" t0 t1 t0 t1", " t0 t1 t2 t3"], texts
    assert events[-2]["usage"]["completion_tokens"] == 8 and len(engine.calls) == 3
