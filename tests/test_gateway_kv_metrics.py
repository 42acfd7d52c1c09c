"""The KV-cache reuse each replica's engine reports per request (the llmapi model's perf metrics), counted by the
gateway per replica (`/metrics`: hpc_serve_gateway_replica_kv_reused_blocks / _kv_missed_blocks) and written in
the access log: what prefix affinity is judged by. In process, on replicas whose engine reports blocks; against a
real replica (the CPU engine reports the blocks it really copied): tests/test_gateway_llmapi_cluster.py."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from tests.test_gateway import FakeEngine, app_on

#: the engine's timestamps in the perf metrics (as the model sends them: numbers read from strings)
STAMPS = {"arrival_time_ns": 1e18, "first_scheduled_time_ns": 1e18 + 1e6, "first_token_time_ns": 1e18 + 2e6,
          "last_token_time_ns": 1e18 + 9e6}  # fmt: skip


class Reporting(FakeEngine):
    """Answers "ok" with the perf metrics of a prompt whose first 2 blocks were cached and 1 was not."""

    async def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        from hpc.serving.model_io import Chunk

        yield Chunk("o", None)
        yield Chunk(
            "k", None, finish_reason="stop", perf={"kv_cache_reused_block": 2.0, "kv_cache_missed_block": 1.0, **STAMPS}
        )


@pytest.fixture(scope="module")
def tokenizer(tiny_gpt2):
    from backend.models.tokenizer import load_tokenizer

    return load_tokenizer(tiny_gpt2)


def _post(app, body: dict, headers: dict | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            json_body = {"model": "m", "max_tokens": 2, **body}
            response = await http.post("/v1/completions", json=json_body, headers=headers or {})
            metrics = await http.get("/metrics")
            return response, metrics

    return asyncio.run(go())


def _counted(metrics: str, name: str) -> float:
    (value,) = [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(f"{name}_total{{")]
    return value


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "fastapi"])
def test_each_answer_adds_its_kv_blocks_to_the_replica_and_the_access_log(tiny_gpt2, tokenizer, fast_path, caplog):
    app = app_on(Reporting(), tiny_gpt2, tokenizer, fast_path, "a")
    with caplog.at_level(logging.INFO, logger="hpc_serve.gateway.access"):
        _post(app, {"prompt": "x"})
        _post(app, {"prompt": "y", "stream": True})
        answer, metrics = _post(app, {"prompt": ["p", "q"]})  # two choices: two generations' blocks
    assert answer.status_code == 200, answer.text
    reused = _counted(metrics.text, "hpc_serve_gateway_replica_kv_reused_blocks")
    missed = _counted(metrics.text, "hpc_serve_gateway_replica_kv_missed_blocks")
    assert (reused, missed) == (8.0, 4.0)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "hpc_serve.gateway.access"]
    assert [(line["kv_reused_blocks"], line["kv_missed_blocks"]) for line in lines] == [(2, 1), (2, 1), (4, 2)]


def test_a_model_without_perf_metrics_counts_no_blocks(tiny_gpt2, tokenizer):
    app = app_on(FakeEngine(), tiny_gpt2, tokenizer, True, "a")
    answer, metrics = _post(app, {"prompt": "x"})
    assert answer.status_code == 200
    assert _counted(metrics.text, "hpc_serve_gateway_replica_kv_reused_blocks") == 0.0


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "fastapi"])
def test_the_engines_timestamps_go_only_to_a_client_that_asks(tiny_gpt2, tokenizer, fast_path):
    """hpc/serving/engine_timing.py: with the header, the last event (or the JSON answer) carries them as
    integers; without it, the answer is OpenAI's shape only."""
    from hpc.serving.engine_timing import TIMING_FIELD, TIMING_HEADER

    app = app_on(Reporting(), tiny_gpt2, tokenizer, fast_path, "a")
    expected = {name: int(value) for name, value in STAMPS.items()}
    whole, _ = _post(app, {"prompt": "x"}, {TIMING_HEADER: "1"})
    assert whole.json()[TIMING_FIELD] == expected
    streamed, _ = _post(app, {"prompt": "x", "stream": True}, {TIMING_HEADER: "1"})
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert [e.get(TIMING_FIELD) for e in events] == [None] * (len(events) - 1) + [expected]
    assert events[-1]["choices"][0]["finish_reason"] == "stop", "on the finish event"
    plain, _ = _post(app, {"prompt": "x", "stream": True})
    assert TIMING_FIELD not in plain.text and TIMING_FIELD not in _post(app, {"prompt": "x"})[0].text
