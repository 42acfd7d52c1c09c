"""The OpenAI API: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`, with SSE streaming.

Why the request models refuse what the deployment cannot do (top log probabilities, the prompt's, out-of-range
sampling values) instead of ignoring it: a client that asked for two choices and silently got one is worse off
than one told which field is wrong (OpenAI's 400 with `param`). So is one with a field it does not know (a typo
would be answered with the default): 400 `unknown_parameter` naming it and the nearest known one; the few that
clients commonly send and that change nothing here are accepted and ignored (hpc/gateway/bodies.py). `top_k` is
an extension (vLLM's name). Log probabilities of the chosen tokens are served (hpc/gateway/logprobs.py); the
model returns no alternatives. Several choices (a list of prompts, token ids, n > 1) are hpc/gateway/fanout.py's;
one is answered here. Each answer names the replica that served it in `x-hpc-serve-replica`
(`job_id/replica`), for debugging and the prefix-affinity benchmark.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic.json_schema import models_json_schema

from hpc.gateway import fanout
from hpc.gateway.accesslog import RequestRecord, record_of
from hpc.gateway.answers import (
    Answer,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    ModelCard,
    ModelList,
)
from hpc.gateway.auth import authorized
from hpc.gateway.bodies import ChatRequest, CompletionRequest, Sampling
from hpc.gateway.choices import DONE, Events, Tally, answer_error, finish_of, replica_header, usage_of
from hpc.gateway.errors import ERRORS, APIError, bad_request, unauthorized
from hpc.gateway.logprobs import TokenTrail, chat_logprobs, completion_logprobs
from hpc.gateway.state import Gateway
from hpc.gateway.streaming import EventStream
from hpc.serving import idle
from hpc.serving.engine_timing import TIMING_FIELD, timestamps
from hpc.serving.model_io import Chunk, GenerateParams
from hpc.serving.text import StopStream, cut_at_stop
from hpc.serving.triton import ModelError, ReplicaUnavailable, TokenRefused

#: the response header that names the replica which served the request


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway


async def require_token(request: Request) -> None:
    """401 unless the request carries one of the deployment's tokens (none needed when it has none). `async`:
    FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request for a dictionary look-up."""
    if not authorized(request.headers.get("authorization"), gateway_of(request).discovery.tokens):
        raise unauthorized()


router = APIRouter(dependencies=[Depends(require_token)])


DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
DEFAULT_CHAT_MAX_TOKENS = 256  # chat has "up to the context"; a bound keeps a forgotten max_tokens cheap


@router.get("/v1/models", response_model=ModelList, responses=ERRORS)
async def list_models(request: Request) -> ModelList:
    return ModelList(data=[ModelCard(id=gateway_of(request).model_name, created=0, owned_by="hpc-serve")])


def _check_model(gw: Gateway, model: str) -> None:
    if model != gw.model_name:
        raise APIError(
            404,
            f"model {model!r} does not exist; this gateway serves {gw.model_name!r}",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


def _params(req: Sampling, prompt: str, max_tokens: int, logprobs: bool) -> GenerateParams:
    return GenerateParams(
        prompt=prompt,
        max_tokens=max_tokens,
        stop=req.stops(),
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        length_penalty=req.length_penalty,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
    )


#: what a request for the prompt's log probabilities (echo with logprobs, as lm-evaluation-harness's loglikelihood
#: tasks send) is told
NO_PROMPT_LOGPROBS = (
    "the prompt's log probabilities are not served: neither workflow's model returns them (both return the "
    "generated tokens' only)"
)
NO_SEVERAL_LOGPROBS = "not served with several choices (n > 1 or a list of prompts): ask for one choice a request"
NO_TOP = "the model returns the chosen tokens' log probabilities, not the most likely alternatives"


#: the two generation routes' paths (hpc/gateway/fastpath.py serves them without FastAPI's routing too)
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


#: the answers streamed as SSE events, which `/openapi.json` describes by `describe_streams`
STREAMED: tuple[type[Answer], ...] = (CompletionChunk, ChatCompletionChunk)
_SCHEMAS = "#/components/schemas/"


def _answers(whole: type[Answer], chunk: type[Answer]) -> dict[int | str, dict[str, Any]]:
    """What `/openapi.json` says a generation route answers: `whole` as JSON; with `stream`, SSE events, each
    `data: ` and a `chunk` (the last `data: [DONE]`); or an error."""
    said = f"With `stream`: SSE events, each `data: ` and a {chunk.__name__}, the last `data: [DONE]`."
    events = {"text/event-stream": {"schema": {"$ref": _SCHEMAS + chunk.__name__}}}
    return {200: {"model": whole, "description": said, "content": events}} | ERRORS


def describe_streams(openapi: dict[str, Any]) -> dict[str, Any]:
    """`openapi` (FastAPI's) with the STREAMED models' schemas, which `_answers` refers to and FastAPI does not
    make (it makes those of a response's `model` only)."""
    _, found = models_json_schema([(m, "serialization") for m in STREAMED], ref_template=_SCHEMAS + "{model}")
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in found.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    return openapi


@router.post(COMPLETIONS_PATH, response_model=Completion, responses=_answers(Completion, CompletionChunk))
async def completions(body: CompletionRequest, request: Request) -> Any:
    return await complete(gateway_of(request), body, record_of(request))


@router.post(CHAT_PATH, response_model=ChatCompletion, responses=_answers(ChatCompletion, ChatCompletionChunk))
async def chat_completions(body: ChatRequest, request: Request) -> Any:
    return await chat_complete(gateway_of(request), body, record_of(request))


async def complete(gw: Gateway, body: CompletionRequest, record: RequestRecord) -> Any:
    """`POST /v1/completions` once its body is a CompletionRequest: the answer (JSON or an SSE stream), or
    APIError."""
    _check_model(gw, body.model)
    prompts = [p if isinstance(p, str) else _decoded(gw, p) for p in body.prompts()]
    if "" in prompts and gw.prompt_tokens("") == 0:
        raise bad_request(
            "prompt: an empty prompt is no token for this model (its tokenizer adds none): send text", "prompt"
        )
    if body.logprobs:
        raise bad_request(f"logprobs: only 0 is served: {NO_TOP}", "logprobs")
    if body.echo and body.logprobs is not None:
        raise bad_request(f"echo with logprobs: {NO_PROMPT_LOGPROBS}", "echo")
    max_tokens = body.max_tokens or DEFAULT_MAX_TOKENS
    if len(prompts) == 1 and body.n == 1 and not body.echo:
        return await _answer(gw, body, _params(body, prompts[0], max_tokens, body.logprobs is not None), False, record)
    if body.logprobs is not None:
        raise bad_request(f"logprobs: {NO_SEVERAL_LOGPROBS}", "logprobs")
    several = [_params(body, prompt, max_tokens, False) for prompt in prompts]
    usage = bool(body.stream_options and body.stream_options.include_usage)
    return await fanout.answer(gw, several, body.n, False, record, body.stream, usage, echo=body.echo)


def _decoded(gw: Gateway, ids: list[int]) -> str:
    """A prompt sent as token ids, as text for the model (which takes text and tokenizes it again, with the same
    tokenizer: the ids of a text encode back to themselves but for the rare sequence a tokenizer would not
    make); 400 naming `prompt` for an id outside the vocabulary."""
    size = gw.tokenizer.vocab_size
    if bad := [i for i in ids if i >= size]:
        raise bad_request(f"prompt: token id {bad[0]} is outside the model's vocabulary (0..{size - 1})", "prompt")
    return gw.tokenizer.decode(ids, skip_special_tokens=False)


async def chat_complete(gw: Gateway, body: ChatRequest, record: RequestRecord) -> Any:
    """`POST /v1/chat/completions` once its body is a ChatRequest (see `complete`)."""
    _check_model(gw, body.model)
    if body.top_logprobs:
        raise bad_request(f"top_logprobs: only 0 is served: {NO_TOP}", "top_logprobs")
    messages = [m.for_template() for m in body.messages]
    try:
        prompt = gw.chat_template.render(messages)
    except Exception as exc:  # noqa: BLE001 - a template's raise_exception names what it refuses
        raise bad_request(f"messages: the chat template refused them: {exc}", "messages") from None
    max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_CHAT_MAX_TOKENS
    params = _params(body, prompt, max_tokens, bool(body.logprobs))
    if body.n == 1:
        return await _answer(gw, body, params, chat=True, record=record)
    if body.logprobs:
        raise bad_request(f"logprobs: {NO_SEVERAL_LOGPROBS}", "logprobs")
    usage = bool(body.stream_options and body.stream_options.include_usage)
    return await fanout.answer(gw, [params], body.n, True, record, body.stream, usage)


async def _answer(gw: Gateway, body: Sampling, params: GenerateParams, chat: bool, record: RequestRecord) -> Any:
    record.model, record.stream = gw.model_name, body.stream
    # what the answer needs that the replica's first piece does not decide is made while the replica works on the
    # request (idle.py): neither before it leaves nor after its first piece came, where it adds to the first token
    rid = idle.Later(lambda: f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}")
    events = idle.Later(lambda: Events(rid.get(), int(time.time()), gw.model_name, chat)) if body.stream else None
    pieces = gw.generate(params, record, whole=not body.stream)  # not streamed: a replica lost half-way is retried
    try:
        first = await gw.first(pieces)  # errors before the first piece are HTTP errors, not stream events
        if params.logprobs and first is not None and not first.logprobs:
            raise bad_request("logprobs: this deployment's model returns no log probabilities", "logprobs")
    except APIError:
        await pieces.aclose()
        raise
    except (ModelError, ReplicaUnavailable, TokenRefused) as exc:
        raise answer_error(exc, chat, record) from None
    headers = replica_header([record.replica])
    if events is not None:
        stream = _sse(gw, body, params, chat, events.get(), first, pieces, record)
        return EventStream(stream, media_type="text/event-stream", headers=headers)
    trail, tally = TokenTrail(), Tally()
    counted = gw.count_prompt(params.prompt)
    try:
        chunk = first
        while chunk is not None:
            tally.add(chunk)
            trail.add(chunk)
            chunk = await anext(pieces, None)
        prompt_tokens = await counted
    except (ModelError, ReplicaUnavailable) as exc:
        raise APIError(500, f"the request failed while generating: {exc}", "server_error") from None
    finally:
        counted.cancel()  # left early (an error, a client gone): its count is not needed
    text, stopped = cut_at_stop(tally.text, params.stop)
    usage = usage_of(prompt_tokens, tally.completion_tokens(gw, params.max_tokens, prompt_tokens), record)
    record.kv_blocks(tally.perf)
    logprobs = _logprobs(chat, trail.finish(len(text))) if params.logprobs else None
    finish = finish_of(stopped, usage, params, gw.context_length, tally.finish)
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    whole = ChatCompletion if chat else Completion
    out = {"id": rid.get(), "created": int(time.time()), "model": gw.model_name, "choices": [choice], "usage": usage}
    return JSONResponse(whole.model_validate(out | _timing(record, tally)).wire(), headers=headers)


def _timing(record: RequestRecord, tally: Tally) -> dict[str, Any]:
    """The engine's timestamps as the answer's extra field, for a client that asked (engine_timing.py)."""
    stamps = timestamps(tally.perf) if record.timing_asked else None
    return {TIMING_FIELD: stamps} if stamps else {}


def _logprobs(chat: bool, tokens: list) -> dict[str, Any]:
    return chat_logprobs(tokens) if chat else completion_logprobs(tokens)


async def _sse(
    gw: Gateway,
    body: Sampling,
    params: GenerateParams,
    chat: bool,
    events: Events,
    first: Chunk | None,
    pieces: AsyncGenerator[Chunk, None],
    record: RequestRecord,
) -> AsyncIterator[bytes]:
    trail, sent = TokenTrail(), 0

    def delta(text: str | None, finish: str | None = None, final: bool = False) -> dict[str, Any]:
        """One choice of an event; with logprobs, those of the tokens the text sent so far completed."""
        nonlocal sent
        sent += len(text or "")
        logprobs = None
        if params.logprobs:
            logprobs = _logprobs(chat, trail.finish(sent) if final else trail.sent(sent))
        return events.choice(0, text, finish, logprobs)

    def piece(text: str) -> bytes:
        return events.event([delta(text)]) if params.logprobs else events.piece(text)

    # Events due together leave in one write (one packet, one wake-up of the client): chat's opening event with the
    # first text, and the last text with the finish, the usage and [DONE]
    pending = b""
    if chat:
        pending = events.event([events.opening(0)])
    stops, tally, counted = StopStream(params.stop), Tally(), None
    try:
        chunk = first  # taken already, to tell errors from answers; then the rest (no generator around them)
        while chunk is not None:
            tally.add(chunk)
            trail.add(chunk)
            if text := stops.feed(chunk.text):
                yield pending + piece(text)
                pending = b""
            if stops.stopped:
                break
            if counted is None:  # counted while the replica makes the next token, not after the last one
                counted = gw.count_prompt(params.prompt)
            try:
                chunk = await anext(pieces, None)
            except (ModelError, ReplicaUnavailable) as exc:  # its replica lost half-way: on another, if one takes it
                again = await gw.resumed(params, tally.text, None if tally.uncounted else tally.tokens, record, exc)
                if again is None:
                    raise
                await pieces.aclose()
                chunk, pieces = again
        if counted is None:  # stopped at the first piece
            counted = gw.count_prompt(params.prompt)
        prompt_tokens = await counted
        usage = usage_of(prompt_tokens, tally.completion_tokens(gw, params.max_tokens, prompt_tokens), record)
        record.kv_blocks(tally.perf)
    except (ModelError, ReplicaUnavailable) as exc:
        record.error = "stream_failed"
        yield pending + APIError(500, str(exc), "server_error").event()
        return
    finally:
        if counted is not None:
            counted.cancel()  # left early (an error, a client gone): its count is not needed
        await pieces.aclose()
    if rest := stops.flush():
        pending += piece(rest)
    finish = finish_of(stops.stopped, usage, params, gw.context_length, tally.finish)
    pending += events.event([delta(None, finish, final=True)], **_timing(record, tally))
    if body.stream_options and body.stream_options.include_usage:
        pending += events.event([], usage=usage)
    yield pending + DONE
