"""The two ways a client's request travels: to the deployment's gateway as an OpenAI `/v1/completions` request
(httpx, SSE when streaming), or to one replica's ensemble over Triton's gRPC stream (the gateway's own
`TritonEngine`, so a replica is asked exactly as the gateway asks it).

Why the gateway is spoken to in OpenAI's API and not Triton's passthrough: it is the API the gateway promises
and tests (stop sequences cut, errors with the field named, 503 when no replica is ready), and it is what any
other client of the gateway uses, so the Python client sees what they see.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any, TypedDict

import httpx

from hpc.client.errors import AuthError, Busy, NotReady, RequestError, ServerError
from hpc.serving.engine_timing import TIMING_FIELD, TIMING_HEADER
from hpc.serving.model_io import GenerateParams
from hpc.spec.limits import SAMPLING_BOUNDS


class Sampling(TypedDict, total=False):
    """Sampling parameters, named as in the OpenAI API (`top_k` as vLLM's extension); left out: the model's
    default."""

    stop: str | list[str] | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    presence_penalty: float | None
    frequency_penalty: float | None


def generate_params(prompt: str, max_tokens: int, sampling: Sampling) -> GenerateParams:
    """The request as the replica is asked it; an unknown sampling name is a TypeError naming the known ones, a
    value out of its range a RequestError naming it (`param`), before anything is sent."""
    unknown = set(sampling) - set(Sampling.__annotations__)
    if unknown:
        known = ", ".join(Sampling.__annotations__)
        raise TypeError(f"unknown sampling parameter(s) {', '.join(sorted(unknown))}: use {known}")
    for name, value in sampling.items():
        bound = SAMPLING_BOUNDS.get(name)
        if bound is not None and value is not None and not bound.holds(float(value)):  # type: ignore[arg-type]
            raise RequestError(f"{name} must be {bound.words()}, not {value}", param=name)
    stop = sampling.get("stop")
    fields = {k: v for k, v in sampling.items() if k != "stop"}
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    return GenerateParams(prompt=prompt, max_tokens=max_tokens, stop=tuple(stops), **fields)  # type: ignore[arg-type]


def auth_headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


class GatewayUnavailable(RuntimeError):
    """The gateway could not be reached, or broke off before its first piece: go to the replicas directly."""


def _openai_body(model: str, params: GenerateParams, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": params.prompt, "max_tokens": params.max_tokens}
    if stream:
        body["stream"] = True
    if params.stop:
        body["stop"] = list(params.stop)
    for name in Sampling.__annotations__:
        if name != "stop" and getattr(params, name) is not None:
            body[name] = getattr(params, name)
    return body


def _refusal(response: httpx.Response) -> Exception:
    """The gateway's OpenAI-shaped error as this package's exception, with the gateway's own message."""
    try:
        error = response.json()["error"]
        message, param, code = str(error["message"]), error.get("param"), error.get("code")
    except (ValueError, KeyError, TypeError):
        message, param, code = response.text or response.reason_phrase, None, None
    status = response.status_code
    if status == 401:
        return AuthError(f"gateway: {message}", status, param)
    if status == 503 and code == "no_replica_ready":
        return NotReady(f"gateway: {message}")
    if status == 429:
        return Busy(f"gateway: {message}")
    if 400 <= status < 500:
        return RequestError(f"gateway: {message}", status, param)
    return ServerError(f"gateway: HTTP {status}: {message}")


async def gateway_stream(
    http: httpx.AsyncClient,
    url: str,
    model: str,
    params: GenerateParams,
    token: str | None,
    stream: bool,
    timing: dict[str, int] | None = None,
) -> AsyncGenerator[str, None]:
    """Text from the gateway's `/v1/completions`: piece by piece over SSE (`stream`), or the whole text as one
    piece. GatewayUnavailable while nothing came back yet; this package's errors for the gateway's answers.
    `timing`: asks the gateway for the engine's timestamps (engine_timing.py) and is filled with them."""
    body = _openai_body(model, params, stream)
    headers = auth_headers(token) | ({TIMING_HEADER: "1"} if timing is not None else {})
    started = False
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                raise _refusal(response)
            if not stream:
                await response.aread()
                started = True  # nothing is yielded before the whole answer was read
                answer = response.json()
                if timing is not None:
                    timing.update(answer.get(TIMING_FIELD) or {})
                yield answer["choices"][0]["text"]
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if timing is not None and TIMING_FIELD in event:
                    timing.update(event[TIMING_FIELD] or {})
                if "error" in event:
                    raise ServerError(f"gateway: {event['error'].get('message')}")
                text = event["choices"][0].get("text") if event.get("choices") else None
                if text:
                    started = True
                    yield text
            raise ServerError("gateway: the stream ended without [DONE]")
    except httpx.TransportError as exc:
        if started:
            raise ServerError(f"gateway at {url} broke off the stream: {exc!r}") from None
        raise GatewayUnavailable(f"{url}: {exc!r}") from None
