"""The gateway's serving rules without a replica: a full replica's refusal (retry elsewhere, then 429), prefix
affinity through `Gateway.generate`, log probabilities lined up with the text, and the metrics and access log
of an app whose deployment has no job yet."""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend.cpu_engine.drain import RAN_OUT, STOPPING
from backend.cpu_engine.scheduler import GenerationRequest, KVBudget, Scheduler
from hpc.gateway.errors import APIError
from hpc.gateway.logprobs import TokenTrail, chat_logprobs, completion_logprobs
from hpc.serving.balancer import Balancer, Replica
from hpc.serving.model_io import Chunk, GenerateParams
from hpc.serving.triton import ContextTooLong, ModelError, ReplicaBusy, ReplicaStopping, model_error


class Engine:
    """Replicas named `busy*` refuse every request, their queue full; the others answer "a", "b" with log
    probabilities -1, -2 when asked."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        self.calls.append(grpc_url)
        if grpc_url.startswith("busy"):
            raise model_error("Exceeds maximum queue size")
        if grpc_url.startswith("stopping"):
            raise model_error(STOPPING)  # the CPU engine's drain refusal
        for text, logprob in (("a", -1.0), ("b", -2.0)):
            yield Chunk(text, 1, (logprob,) if params.logprobs else ())


def _gateway(*keys: str, max_outstanding: int | None = None):
    from hpc.gateway.metrics import Metrics
    from hpc.gateway.state import Gateway
    from hpc.serving.discovery import Discovery
    from hpc.serving.text import ChatTemplate

    balancer = Balancer(max_outstanding=max_outstanding)
    balancer.update([Replica(key=k, http_url=f"http://{k}", grpc_url=k) for k in keys])
    discovery = Discovery(None, balancer, None)  # type: ignore[arg-type]
    metrics = Metrics(lambda: balancer)
    gw = Gateway(None, balancer, discovery, Engine(), None, None, ChatTemplate(None), metrics=metrics)  # type: ignore[arg-type]
    return gw


def _run(gw, prompt: str = "x", logprobs: bool = False) -> list[Chunk]:
    async def collect() -> list[Chunk]:
        params = GenerateParams(prompt=prompt, max_tokens=2, logprobs=logprobs)
        pieces = gw.generate(params)
        first = await gw.first(pieces)  # as the routes take it: the answers when none is left
        return [first, *[c async for c in pieces]] if first else []

    return asyncio.run(collect())


def _sample(gw, name: str, **labels: str) -> float:
    from prometheus_client import generate_latest

    text = generate_latest(gw.metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_the_refusal_of_a_full_queue_is_told_apart_from_the_models_errors():
    assert isinstance(model_error("Exceeds maximum queue size"), ReplicaBusy)
    assert isinstance(model_error("Maximum queue size of 4 has been reached, please try again"), ReplicaBusy)
    assert not isinstance(model_error("input too long"), ReplicaBusy)


def test_a_request_longer_than_the_context_is_told_apart_in_both_engines_words():
    trtllm = "Encountered an error in forward: Prompt length (301) exceeds maximum input length (256). Set log level"
    assert type(model_error(trtllm)) is ContextTooLong
    scheduler = Scheduler(KVBudget(max_tokens=4096), max_batch_size=4, max_seq_len=256)
    for prompt in (256, 301):  # a prompt that leaves no room for a new token
        refusal = scheduler.check(GenerationRequest(input_ids=np.full(prompt, 5), max_new_tokens=4))
        assert refusal is not None and type(model_error(refusal)) is ContextTooLong, refusal
    assert type(model_error("input 'temperature' must be positive")) is ModelError


def test_a_stopping_replicas_refusal_is_told_apart_in_each_servers_words():
    for words in (
        STOPPING,
        RAN_OUT,
        "Server is stopping, scheduler for model has stopped accepting new inference requests",
        "Request for unknown model: 'ensemble' has no available versions",
    ):
        assert type(model_error(words)) is ReplicaStopping, words
    assert type(model_error("input 'temperature' must be positive")) is ModelError
    # a model the replica never had is no stop: tritonserver's 404 goes back as it is, not a 503 "no replica"
    assert type(model_error("Request for unknown model: 'ensemble' is not found")) is ModelError


def test_a_request_refused_by_a_stopping_replica_goes_to_another_and_none_left_is_503():
    """A replica whose stop has begun refuses new requests (before the gateway's next look marks it draining):
    nothing was generated, so the request is retried on another, not answered 500; that replica is benched."""
    gw = _gateway("stopping-1", "z-live")
    assert "".join(c.text for c in _run(gw)) == "ab"
    assert gw.engine.calls == ["stopping-1", "z-live"], "stopping-1 sorts first: tried, refused, then z-live"
    stopping = next(r for r in gw.balancer.replicas if r.key == "stopping-1")
    assert stopping.failures == 1 and stopping not in gw.balancer.healthy()
    assert _sample(gw, "hpc_serve_gateway_retries_total", reason="stopping") == 1

    with pytest.raises(APIError) as exc:
        _run(_gateway("stopping-1", "stopping-2"))
    assert exc.value.status == 503 and exc.value.code == "no_replica_ready"


def test_a_full_replica_is_skipped_not_benched_and_all_full_is_429():
    gw = _gateway("busy-1", "live")
    assert "".join(c.text for c in _run(gw)) == "ab"
    assert gw.engine.calls == ["busy-1", "live"]
    busy = next(r for r in gw.balancer.replicas if r.key == "busy-1")
    assert busy.refusals == 1 and busy.failures == 0 and busy in gw.balancer.healthy(), "busy, not broken"
    assert _sample(gw, "hpc_serve_gateway_retries_total", reason="busy") == 1

    gw = _gateway("busy-1", "busy-2")
    with pytest.raises(APIError) as exc:
        _run(gw)
    assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "1"
    assert exc.value.code == "replicas_busy"


def test_every_replica_at_the_admission_bound_is_429_before_any_is_asked():
    gw = _gateway("a", max_outstanding=1)
    (a,) = gw.balancer.replicas
    with gw.balancer.track(a):
        with pytest.raises(APIError) as exc:
            _run(gw)
    assert exc.value.status == 429 and "1 requests in flight" in exc.value.message
    assert gw.engine.calls == []
    assert "".join(c.text for c in _run(gw)) == "ab", "the request ended: room again"


def test_requests_sharing_a_prefix_go_to_one_replica():
    gw = _gateway("r1", "r2", "r3")
    shared = "You are a terse assistant. " * 12  # > 256 characters
    for question in ("one", "two", "three", "four"):
        _run(gw, shared + question)
    assert len(set(gw.engine.calls)) == 1, gw.engine.calls
    for question in ("one", "two", "three"):
        _run(gw, question)  # short prompts: no key, least outstanding takes turns
    assert len(set(gw.engine.calls[4:])) == 3


def test_logprobs_follow_the_text_sent_and_are_cut_with_it():
    trail = TokenTrail()
    for chunk in (Chunk("", 1, (-0.1,)), Chunk("é x", 1, (-0.2,)), Chunk(" y.", 1, (-0.3,)), Chunk("z", 0)):
        trail.add(chunk)
    assert [t.text for t in trail.tokens] == ["", "é x", " y.z"], "a tail without a token joins the last one"
    assert [t.offset for t in trail.tokens] == [0, 0, 3]
    assert [t.text for t in trail.sent(2)] == [""], "only tokens whose text is all sent"
    assert [t.text for t in trail.sent(3)] == ["é x"]
    rest = trail.finish(5)  # a stop sequence "." cut the text to "é x y"
    assert [(t.text, t.offset) for t in rest] == [(" y", 3)]

    whole = TokenTrail()
    whole.add(Chunk("ab", 2, (-1.0, -2.0)))  # a response with two tokens: the text goes to the last
    tokens = whole.finish(2)
    assert completion_logprobs(tokens) == {
        "tokens": ["", "ab"],
        "token_logprobs": [-1.0, -2.0],
        "top_logprobs": [{"": -1.0}, {"ab": -2.0}],
        "text_offset": [0, 0],
    }
    assert chat_logprobs(tokens)["content"][1] == {
        "token": "ab",
        "logprob": -2.0,
        "bytes": [97, 98],
        "top_logprobs": [],
    }


def test_generate_passes_the_log_probabilities_on():
    gw = _gateway("a")
    assert [c.logprobs for c in _run(gw, logprobs=True)] == [(-1.0,), (-2.0,)]
    assert [c.logprobs for c in _run(gw)] == [(), ()]


def test_metrics_and_access_log_of_an_app_without_replicas(tmp_path, tiny_gpt2, caplog):
    """`/metrics` needs no token and counts every answer; one JSON access line per request, none for probes."""
    from fastapi.testclient import TestClient

    from hpc.gateway.app import create_app
    from hpc.serving.deployment import Target

    app = create_app(Target(tmp_path / "runs", "nothing", tiny_gpt2))
    caplog.set_level(logging.INFO, logger="hpc_serve.gateway.access")
    with TestClient(app) as http:
        assert http.post("/v1/completions", json={"model": "nothing", "prompt": "x"}).status_code == 503
        assert http.post("/v1/completions", json={"model": "other", "prompt": "x"}).status_code == 404
        chat = {"model": "nothing", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}
        response = http.post("/v1/chat/completions", json=chat)
        assert response.status_code == 400 and response.json()["error"]["param"] == "top_logprobs"
        response = http.post("/v1/completions", json={"model": "nothing", "prompt": "x", "logprobs": 3})
        assert response.status_code == 400 and response.json()["error"]["param"] == "logprobs"
        assert http.get("/v2/health/ready").status_code == 503
        scrape = http.get("/metrics")
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scrape.text)
        for s in family.samples
    }
    completions = "/v1/completions"
    assert samples[("hpc_serve_gateway_requests_total", (("route", completions), ("status", "503")))] == 1
    assert samples[("hpc_serve_gateway_requests_total", (("route", completions), ("status", "400")))] == 1
    assert samples[("hpc_serve_gateway_errors_total", (("kind", "no_replica"),))] == 1
    assert samples[("hpc_serve_gateway_errors_total", (("kind", "bad_request"),))] == 2
    assert samples[("hpc_serve_gateway_request_duration_seconds_count", (("route", completions),))] == 3
    assert samples[("hpc_serve_gateway_requests_total", (("route", "/v2/health/ready"), ("status", "503")))] == 1
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "hpc_serve.gateway.access"]
    assert [(line["route"], line["status"]) for line in lines] == [
        (completions, 503),
        (completions, 404),
        ("/v1/chat/completions", 400),
        (completions, 400),
    ], "probes and scrapes are not logged"
    assert lines[0]["model"] == "nothing" and lines[0]["latency_ms"] > 0 and lines[0]["replica"] is None


def test_a_parameter_the_images_model_lacks_is_a_400_naming_it_and_nothing_is_sent():
    """A replica serving NVIDIA's model.py (spec model.llmapi_model: image): a stop string, which its helpers hand
    to the tokenizer as bytes (a 500 on a GPU), or one of hpc-serve's own inputs, is the client's 400 naming the
    field and the fix, before any connection to the replica (port 1: nothing listens)."""
    import asyncio

    from hpc.gateway.accesslog import RequestRecord
    from hpc.gateway.choices import answer_error
    from hpc.serving.model_io import GenerateParams
    from hpc.serving.triton import InputRefused, TritonEngine
    from launcher.contracts.llmapi import IMAGE_MODEL, LLMAPI

    async def send(params: GenerateParams) -> None:
        async for _ in TritonEngine().stream("127.0.0.1:1", params, None, LLMAPI, True, IMAGE_MODEL):
            pass

    for field, value in (("stop", ("END",)), ("ignore_eos", True)):
        with pytest.raises(InputRefused) as refused:
            asyncio.run(send(GenerateParams("x", 4, **{field: value})))
        error = answer_error(refused.value, chat=False, record=RequestRecord("POST", "/v1/completions"))
        assert (error.status, error.param, error.type) == (400, field, "invalid_request_error")
        assert "model.llmapi_model: hpc-serve" in error.message
