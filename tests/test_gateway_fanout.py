"""Several choices a request (hpc/gateway/fanout.py): a list of prompts, prompts as token ids, n > 1, echo, as
lm-evaluation-harness's local-completions and batch clients send them. Through the whole app (fast path and
FastAPI's routes) on a replica whose engine answers with what it was asked (its prompt and seed), so the order
and shape of the answer can be checked choice by choice. Against a real replica: tests/test_gateway_llmapi_cluster.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from hpc.gateway.bodies import MAX_CHOICES
from tests.test_gateway import FakeEngine, app_on

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


class Answering(FakeEngine):
    """Answers `<prompt>|<seed>` then `.`, two tokens; a prompt with "bad" in it fails in the model after its
    first piece; it keeps which generations were closed before their end."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    async def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        from hpc.serving.model_io import Chunk
        from hpc.serving.triton import ModelError

        try:
            yield Chunk(f"{params.prompt}|{params.seed}", 1)
            if "bad" in params.prompt:
                raise ModelError("the model refused it")
            if "slow" in params.prompt:
                await asyncio.sleep(30)
            yield Chunk(".", 1)
        except (GeneratorExit, asyncio.CancelledError):  # closed, or its task cancelled, before its end
            self.closed += 1
            raise


@pytest.fixture(scope="module")
def tokenizer(tiny_gpt2):
    from backend.models.tokenizer import load_tokenizer

    return load_tokenizer(tiny_gpt2)


@pytest.fixture(params=[True, False], ids=["fast_path", "fastapi"])
def app(request, tiny_gpt2, tokenizer):
    return app_on(Answering(), tiny_gpt2, tokenizer, request.param, "a", "b")


def _post(app, path: str, body: dict) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            return await http.post(path, json={"model": "m", "max_tokens": 2, **body})

    return asyncio.run(go())


def _events(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_a_list_of_prompts_with_n_is_answered_in_openais_order_with_seeds_per_choice(app, tokenizer):
    answer = _post(app, COMPLETIONS, {"prompt": ["one", "two", "three"], "n": 2, "seed": 10})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    texts = [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]]
    expected = [(i * 2 + j, f"{p}|{10 + j}.", "length") for i, p in enumerate(["one", "two", "three"]) for j in (0, 1)]
    assert texts == expected
    prompt_tokens = sum(len(tokenizer.encode(p)) for p in ("one", "two", "three"))
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 12,
        "total_tokens": prompt_tokens + 12,
    }


def test_n_without_a_seed_samples_each_choice_with_its_own(app):
    seeds = [c["text"].split("|")[1] for c in _post(app, COMPLETIONS, {"prompt": "x", "n": 3}).json()["choices"]]
    assert len(set(seeds)) == 3 and [int(s[:-1]) for s in seeds] == sorted(int(s[:-1]) for s in seeds)


def test_n_choices_from_the_largest_seed_wrap_round_to_zero(app):
    choices = _post(app, COMPLETIONS, {"prompt": "x", "n": 2, "seed": 2**64 - 1}).json()["choices"]
    assert [int(c["text"].split("|")[1][:-1]) for c in choices] == [2**64 - 1, 0], choices


def test_prompts_as_token_ids_reach_the_model_as_their_text(app, tokenizer):
    ids = tokenizer.encode("Once upon a time", add_special_tokens=False)
    one = _post(app, COMPLETIONS, {"prompt": ids}).json()["choices"]
    assert [c["text"] for c in one] == ["Once upon a time|None."]
    two = _post(app, COMPLETIONS, {"prompt": [ids, ids[:2]]}).json()["choices"]
    assert [c["text"].split("|")[0] for c in two] == ["Once upon a time", tokenizer.decode(ids[:2])]
    size = tokenizer.vocab_size
    for bad, words in (([size], f"token id {size} is outside"), ([-1], "not negative"), ([], "an empty list")):
        error = _post(app, COMPLETIONS, {"prompt": bad}).json()["error"]
        assert error["param"] == "prompt" and words in error["message"], error


@pytest.mark.parametrize(
    ("prompt", "words"),
    [
        ([[1, 2, 3], "hello"], "not a mix of them"),
        ([1, "a"], "not a mix of them"),
        (5, "not a number"),
        ({"text": "hi"}, "not an object"),
        (None, "not null"),
        ([1.5], "whole token ids"),
        ([[1, True]], "whole token ids"),
    ],
)
def test_a_prompt_of_no_shape_openai_allows_is_a_400_naming_the_four_shapes(app, prompt, words):
    """Not pydantic's word for the union's first member (`prompt.str: Input should be a valid string`)."""
    error = _post(app, COMPLETIONS, {"prompt": prompt}).json()["error"]
    assert error["param"] == "prompt", error
    assert "a string, a list of strings, a list of token ids, or a list of lists of token ids" in error["message"]
    assert words in error["message"], error


def test_echo_puts_the_prompt_first_and_prompt_logprobs_are_a_400_that_says_why(app):
    assert _post(app, COMPLETIONS, {"prompt": "Hi", "echo": True}).json()["choices"][0]["text"] == "HiHi|None."
    streamed = _events(_post(app, COMPLETIONS, {"prompt": "Hi", "echo": True, "stream": True}))
    assert "".join(e["choices"][0]["text"] for e in streamed) == "HiHi|None."
    error = _post(app, COMPLETIONS, {"prompt": "Hi", "echo": True, "logprobs": 0}).json()["error"]
    assert error["param"] == "echo" and "prompt's log probabilities" in error["message"]
    error = _post(app, COMPLETIONS, {"prompt": ["a", "b"], "logprobs": 0}).json()["error"]
    assert error["param"] == "logprobs" and "several choices" in error["message"]


def test_more_choices_than_served_is_a_400_naming_the_prompt(app):
    error = _post(app, COMPLETIONS, {"prompt": ["x"] * 2, "n": MAX_CHOICES // 2 + 1}).json()["error"]
    assert error["param"] == "prompt" and str(MAX_CHOICES) in error["message"]
    assert _post(app, CHAT, {"messages": [{"role": "user", "content": "x"}], "n": MAX_CHOICES + 1}).status_code == 400


def test_several_choices_streamed_name_their_index_and_each_ends_with_its_finish(app):
    events = _events(
        _post(
            app,
            COMPLETIONS,
            {"prompt": ["a", "b"], "n": 2, "seed": 1, "stream": True, "stream_options": {"include_usage": True}},
        )
    )
    by_index: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for event in events[:-1]:
        (choice,) = event["choices"]
        by_index[choice["index"]] = by_index.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert by_index == {0: "a|1.", 1: "a|2.", 2: "b|1.", 3: "b|2."}
    assert finishes == dict.fromkeys(range(4), "length")
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 8


def test_chat_with_n_answers_n_messages_whole_and_streamed(app):
    messages = [{"role": "user", "content": "Hi"}]
    whole = _post(app, CHAT, {"messages": messages, "n": 2, "seed": 5}).json()
    assert [(c["index"], c["message"]["role"]) for c in whole["choices"]] == [(0, "assistant"), (1, "assistant")]
    assert [c["message"]["content"].split("|")[1] for c in whole["choices"]] == ["5.", "6."]
    events = _events(_post(app, CHAT, {"messages": messages, "n": 2, "stream": True}))
    roles = [e["choices"][0]["index"] for e in events if e["choices"][0]["delta"].get("role") == "assistant"]
    assert roles == [0, 1]


def test_one_choice_failing_fails_the_request_and_stops_the_others(app):
    gw = app.state.gateway
    answer = _post(app, COMPLETIONS, {"prompt": ["slow", "bad"]})
    assert answer.status_code == 500 and "the model refused it" in answer.json()["error"]["message"]
    assert gw.engine.closed >= 1, "the slow choice's generation was closed, not left to run"


def test_an_answer_of_several_choices_names_every_replica_that_made_it(app):
    """x-hpc-serve-replica, as a one-choice answer has it: here each replica that answered a choice, once each,
    whole and streamed (with no load on either, the balancer spreads the choices)."""
    body = {"prompt": [f"prompt {i}" for i in range(8)]}
    for stream in (False, True):
        answer = _post(app, COMPLETIONS, {**body, "stream": stream})
        assert answer.status_code == 200, answer.text
        named = answer.headers["x-hpc-serve-replica"].split(",")
        assert len(named) == len(set(named)) and set(named) <= {"a", "b"} and named, named
