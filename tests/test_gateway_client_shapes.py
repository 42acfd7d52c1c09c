"""The request bodies benchmark clients build, replayed through the gateway's app as each builds them: genai-perf's
chat body, vLLM's benchmark_serving completions and chat bodies, aiperf's streaming chat body. Each is served
(no field refused), each engine extension reaches the model as the TensorRT-LLM sampling parameter of its name
(`ignore_eos`, `min_tokens`, `top_k`, `repetition_penalty`, `length_penalty`, `seed`), and the tensors sent are
ones the replica's model declares; the image's llmapi model, which lacks some, is a 400 naming the field, except
for a value that asks for nothing (vLLM's `repetition_penalty: 1.0`). Against a real replica, with the real
aiperf: tests/test_gateway_aiperf.py.

The bodies, as each tool's source builds them (read at):
- genai-perf: triton-inference-server/perf_analyzer/genai-perf/genai_perf/inputs/converters/
  openai_chat_completions_converter.py@053bdb77 and its base_converter.py (`--extra-inputs` merged into the body
  as given; its documented fixed-length run adds `ignore_eos` and `min_tokens`);
- vLLM: vllm-project/vllm/vllm/benchmarks/lib/endpoint_request_func.py@02cfb534 (`vllm bench serve`: `ignore_eos`
  when set, `extra_body` merged, which its `--top-k`, `--top-p`, `--temperature` fill, temperature 0 unless
  given) and its predecessor vllm-project/vllm/benchmarks/backend_request_func.py@01184130 (`ignore_eos` always
  sent, `temperature` 0);
- aiperf 0.13.0 (PyPI): aiperf/endpoints/openai_chat.py `format_payload` (`max_completion_tokens`,
  `stream_options.include_usage` on every streaming run, `--extra-inputs` merged).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest

from backend.llmapi_repository import config_text
from backend.templates.tables import ENSEMBLE
from hpc.serving.model_io import NotTaken, model_io
from hpc.serving.triton import InputRefused
from launcher.contracts.llmapi import ENGINE, IMAGE_MODEL, LLMAPI, OWN_MODEL
from tests.test_gateway import FakeEngine, app_on

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
PROMPT = "Once upon a time there was a robot"
#: tool → (path, body) as the tool builds it (the module docstring says where); "model" is set per deployment
BENCHMARK_BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "genai-perf chat, --streaming --extra-inputs ignore_eos:true min_tokens:8": (
        CHAT,
        {
            "model": "m",
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
            "max_tokens": 8,
            "ignore_eos": True,
            "min_tokens": 8,
        },
    ),
    "vLLM bench serve openai (completions), --ignore-eos": (
        COMPLETIONS,
        {
            "model": "m",
            "prompt": PROMPT,
            "repetition_penalty": 1.0,
            "max_tokens": 8,
            "logprobs": None,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0.0,
        },
    ),
    "vLLM bench serve openai-chat, --ignore-eos --top-k 5 --temperature 0.8": (
        CHAT,
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
            "max_completion_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "top_k": 5,
            "temperature": 0.8,
        },
    ),
    "vLLM benchmark_serving.py openai-chat (before bench serve: ignore_eos always sent)": (
        CHAT,
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
            "temperature": 0.0,
            "max_completion_tokens": 8,
            "stream": True,
            "ignore_eos": False,
        },
    ),
    "aiperf chat --streaming --osl 8 --extra-inputs ignore_eos:true": (
        CHAT,
        {
            "messages": [{"role": "user", "content": PROMPT}],
            "model": "m",
            "stream": True,
            "max_completion_tokens": 8,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    ),
}
#: every engine extension at once, each asking for something, and the SamplingParams field each becomes
EXTENSIONS = {
    "ignore_eos": True,
    "min_tokens": 3,
    "top_k": 5,
    "repetition_penalty": 1.2,
    "length_penalty": 0.8,
    "seed": 7,
}


class ModelSide(FakeEngine):
    """A replica of one workflow's model: each request's tensors are made as the gateway's TritonEngine makes them
    (hpc/serving/model_io.py), kept, and answered "ab"; a parameter the model lacks is refused as TritonEngine
    refuses it (InputRefused, nothing sent)."""

    def __init__(self, workflow: str, llmapi_model: str = "") -> None:
        super().__init__()
        self.workflow, self.llmapi_model = workflow, llmapi_model
        self.params: list[Any] = []
        self.sent: list[dict[str, str]] = []

    def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        self.params.append(params)
        try:
            tensors = model_io(self.workflow, True, self.llmapi_model).tensors(params)
        except NotTaken as exc:
            raise InputRefused(str(exc), exc.param) from None
        self.sent.append({t.name(): t.datatype() for t in tensors})
        return super().stream(grpc_url, params, token)


@pytest.fixture(scope="module")
def tokenizer(tiny_gpt2):
    from backend.models.tokenizer import load_tokenizer

    return load_tokenizer(tiny_gpt2)


def _post(app, path: str, body: dict) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            return await http.post(path, json=body)

    return asyncio.run(go())


def _events(response: httpx.Response) -> list[Any]:
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines
    return [json.loads(line) for line in lines[:-1]]


TYPES = {"TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_INT32": "INT32", "TYPE_FP32": "FP32"}
TYPES |= {"TYPE_UINT64": "UINT64", "TYPE_INT64": "INT64"}


def _declared(workflow: str, llmapi_model: str) -> dict[str, str]:
    """The inputs (name → Triton type) of the model the gateway asks: the ensemble's, or an llmapi model's."""
    if workflow == ENGINE:
        return {t.name: TYPES.get(t.dtype, t.dtype) for t in ENSEMBLE.inputs}
    config = config_text(own_inputs=llmapi_model != IMAGE_MODEL)
    block = config[config.index("input [") : config.index("output [")]
    return {n: TYPES[k] for n, k in re.findall(r'name: "(\w+)" data_type: (TYPE_\w+)', block)}


MODELS = [(ENGINE, ""), (LLMAPI, OWN_MODEL), (LLMAPI, IMAGE_MODEL)]


@pytest.mark.parametrize(("workflow", "llmapi_model"), MODELS, ids=["ensemble", "llmapi", "llmapi-image"])
@pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "fastapi"])
@pytest.mark.parametrize("tool", list(BENCHMARK_BODIES))
def test_each_benchmark_clients_body_is_served_unchanged(tool, fast_path, workflow, llmapi_model, tiny_gpt2, tokenizer):
    path, body = BENCHMARK_BODIES[tool]
    engine = ModelSide(workflow, llmapi_model)
    app = app_on(engine, tiny_gpt2, tokenizer, fast_path, "a")
    if llmapi_model == IMAGE_MODEL and (body.get("ignore_eos") or body.get("min_tokens")):
        response = _post(app, path, body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        param = "ignore_eos"
        assert error["param"] == param and "llmapi_model: hpc-serve" in error["message"], error
        return
    response = _post(app, path, body)
    assert response.status_code == 200, response.text
    text = "".join(
        (c.get("text") or (c.get("delta") or {}).get("content") or "") for e in _events(response) for c in e["choices"]
    )
    assert text == "ab"
    (params,) = engine.params
    assert params.max_tokens == body.get("max_tokens", body.get("max_completion_tokens"))
    assert params.ignore_eos == bool(body.get("ignore_eos"))
    (sent,) = engine.sent
    declared = _declared(workflow, llmapi_model)
    assert {n: declared.get(n) for n in sent} == sent, "only inputs the model declares, with its types"


@pytest.mark.parametrize(("workflow", "llmapi_model"), MODELS[:2], ids=["ensemble", "llmapi"])
def test_the_engine_extensions_reach_the_model_as_tensorrt_llms_sampling_parameters(
    workflow, llmapi_model, tiny_gpt2, tokenizer
):
    engine = ModelSide(workflow, llmapi_model)
    app = app_on(engine, tiny_gpt2, tokenizer, True, "a")
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **EXTENSIONS}
    assert _post(app, CHAT, body).status_code == 200
    (params,) = engine.params
    assert {name: getattr(params, name) for name in EXTENSIONS} == EXTENSIONS
    (sent,) = engine.sent
    if workflow == ENGINE:  # the ensemble's inputs of these names; ignore_eos: no end token, end_id -1
        expected = {"top_k", "seed", "min_tokens", "repetition_penalty", "length_penalty", "end_id"}
    else:  # hpc-serve's model: sampling_param_<name>, SamplingParams' keyword of that name (llmapi_io.py)
        expected = {f"sampling_param_{name}" for name in EXTENSIONS}
    assert expected <= set(sent), sorted(sent)


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_tokens", 3), ("repetition_penalty", 1.2), ("length_penalty", 0.8), ("ignore_eos", True)],
)
def test_the_images_llmapi_model_refuses_an_extension_it_lacks_naming_it_and_takes_one_that_asks_nothing(
    field, value, tiny_gpt2, tokenizer
):
    engine = ModelSide(LLMAPI, IMAGE_MODEL)
    app = app_on(engine, tiny_gpt2, tokenizer, True, "a")
    body = {"model": "m", "prompt": "Hi", "max_tokens": 4}
    refused = _post(app, COMPLETIONS, {**body, field: value})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == field and f"no {field} input" in error["message"], error
    assert "llmapi_model: hpc-serve" in error["message"]
    neutral = {"min_tokens": 0, "repetition_penalty": 1.0, "length_penalty": 1.0, "ignore_eos": False}[field]
    assert _post(app, COMPLETIONS, {**body, field: neutral}).status_code == 200
    assert not any(name.endswith(field) for name in engine.sent[-1]), "nothing sent the model does not declare"
    # top_k and seed are upstream's inputs (sampling_param_top_k, sampling_param_seed): the image's model takes them
    assert _post(app, COMPLETIONS, {**body, "top_k": 5, "seed": 7}).status_code == 200
    assert {"sampling_param_top_k", "sampling_param_seed"} <= set(engine.sent[-1])


@pytest.mark.parametrize(
    ("field", "value"),
    [("length_penalty", float("nan")), ("length_penalty", 1000.0), ("repetition_penalty", 0.0), ("top_k", -1)],
)
def test_an_extension_out_of_range_is_400_naming_it(field, value, tiny_gpt2, tokenizer):
    app = app_on(ModelSide(ENGINE), tiny_gpt2, tokenizer, True, "a")
    content = json.dumps({"model": "m", "prompt": "Hi", "max_tokens": 4, field: value})
    response = asyncio.run(_raw(app, content))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


async def _raw(app, content: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        return await http.post(COMPLETIONS, content=content, headers={"content-type": "application/json"})


def test_a_truly_unknown_field_stays_a_400_naming_it(tiny_gpt2, tokenizer):
    """min_p (vLLM's, `vllm bench serve --min-p`) is taken by neither workflow's model: unknown here, not dropped."""
    app = app_on(ModelSide(ENGINE), tiny_gpt2, tokenizer, True, "a")
    for field, value in (("min_p", 0.1), ("lenght_penalty", 1.0), ("best_of_n", 2)):
        response = _post(app, COMPLETIONS, {"model": "m", "prompt": "Hi", "max_tokens": 4, field: value})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"]) == (field, "unknown_parameter"), error
    hint = _post(app, COMPLETIONS, {"model": "m", "prompt": "Hi", "lenght_penalty": 1.0}).json()["error"]["message"]
    assert "did you mean 'length_penalty'?" in hint
