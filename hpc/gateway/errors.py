"""OpenAI-shaped errors (`{"error": {"message", "type", "param", "code"}}`) for every route of the gateway.

Why one shape for all routes, the Triton passthrough too: clients of the gateway see a gateway error (no
replica, bad token) the same way whichever API they speak; what a replica answers is passed on as it is.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from hpc.gateway.answers import ErrorBody, ErrorDetail
from hpc.gateway.bodies import UNKNOWN, nearest
from hpc.jobs.autoscale import Capacity


class APIError(Exception):
    """An error answer: HTTP status, OpenAI error type, and the request field it is about (if one)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorBody(error=detail).wire()

    def event(self) -> bytes:
        """The error as a stream's SSE event (a stream that failed after its answer started)."""
        return f"data: {json.dumps(self.body())}\n\n".encode()

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        return JSONResponse(self.body(), status_code=self.status, headers=headers | self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def unauthorized() -> APIError:
    return APIError(
        401,
        "missing or wrong access token: send `Authorization: Bearer <token>` (`hpc-serve token TARGET` prints it)",
        "invalid_request_error",
        code="invalid_api_key",
    )


def no_replica(hold_s: float = 0.0, capacity: Capacity | None = None) -> APIError:
    """503; under `autoscale:` (`hold_s` > 0: the request was held that long while a job starts) with Retry-After
    (the openai package waits as told up to 60 s, beyond that on its own back-off): when the controller expects its
    job to serve (`capacity`, from the queue's estimate), else the hold again."""
    message = "no replica of the deployment is ready; see `hpc-serve status`"
    if hold_s > 0:
        coming = capacity.words() if capacity is not None else "a job is on its way"
        message = f"no replica of the deployment became ready within {hold_s:g} s ({coming}); try again"
    retry = capacity.retry_after_s() if capacity is not None else max(1, math.ceil(hold_s))
    headers = {"Retry-After": str(retry)} if hold_s > 0 else None
    return APIError(503, message, "server_error", code="no_replica_ready", headers=headers)


#: seconds a client told 429 waits before it tries again (`Retry-After`; the openai package honours it)
RETRY_AFTER_S = 1


def saturated(limit: int | None) -> APIError:
    """429: replicas are ready but none takes another request now (each at its limit, or its queue full)."""
    full = f"has {limit} requests in flight (the gateway's --max-outstanding) or " if limit else ""
    return APIError(
        429,
        f"no replica takes another request now: each {full}refused it, its queue full; retry after {RETRY_AFTER_S} s",
        "rate_limit_error",
        code="replicas_busy",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


#: what the metrics and the access log call an error answer, by HTTP status
ERROR_KINDS = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    408: "head_timeout",
    413: "too_large",
    429: "saturated",
    500: "model_error",
    502: "replica_failed",
    503: "no_replica",
}


#: how `/openapi.json` describes the error answers (FastAPI's `responses`)
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": kind} for status, kind in ERROR_KINDS.items()
}


def without_422(openapi: dict[str, Any]) -> dict[str, Any]:
    """`openapi` (FastAPI's) without the 422 FastAPI documents for every route that validates its input: the
    gateway answers those 400 (`validation_error_handler`), which ERRORS describes."""
    for operations in openapi.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    schemas = openapi.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    return openapi


def error_kind(status: int) -> str | None:
    """The error kind of an answer with `status` (None for a success)."""
    return ERROR_KINDS.get(status, f"http_{status}") if status >= 400 else None


class NoAnswer(Response):
    """What a request whose client left before its body was whole gets: nothing, since no one is there to read
    it (the access log records 499, as for a client gone before its answer)."""

    def __init__(self) -> None:
        super().__init__(status_code=499)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return None


async def client_gone_handler(_: Request, exc: Exception) -> Response:
    """Starlette's ClientDisconnect, raised by `request.body()` (the Triton passthrough): no answer, and no
    traceback (uncaught, uvicorn logged "Exception in ASGI application" and a 500)."""
    assert isinstance(exc, ClientDisconnect)
    return NoAnswer()


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Routing's 404 and 405, and FastAPI's other HTTP errors, in the one shape (FastAPI's own is `{"detail": ...}`),
    with OpenAI's words for a path or method it has no route for; no answer where FastAPI wrapped a client gone
    while its body came in (its "error parsing the body", a 400 for no one)."""
    assert isinstance(exc, HTTPException)
    if isinstance(exc.__cause__, ClientDisconnect):
        return NoAnswer()
    where = f"{request.method} {request.url.path}"
    said = {404: f"Invalid URL ({where})", 405: f"Invalid method for URL ({where})"}
    message = said.get(exc.status_code, str(exc.detail))
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return APIError(exc.status_code, message, kind, headers=dict(exc.headers or {})).response()


async def unexpected_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """A bug's answer, in OpenAI's shape (type server_error) rather than Starlette's plain-text "Internal Server
    Error", which an OpenAI client cannot read (a seed of 10^30 got that before the bodies bounded it). Starlette
    logs the traceback after this answer is sent."""
    message = f"the gateway failed on this request ({type(exc).__name__}); its log has the traceback"
    return APIError(500, message, "server_error").response()


async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 → OpenAI's 400, naming the first field that is wrong: an unknown key (bodies.py `unknown`)
    with OpenAI's code `unknown_parameter` and the nearest known key; a missing field with the body's key that is
    likely a typo of it (`"promt"`), since that is what the client has to fix."""
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    ctx = first.get("ctx") or {}
    if first.get("type") == "json_invalid":  # its loc is the character where parsing stopped, not a field
        at = first.get("loc", ("body", "?"))[-1]
        return bad_request(
            f"the request body is not valid JSON: {ctx.get('error', 'invalid')} at offset {at} (0 is its first character)"
        ).response()
    path = [p for p in first.get("loc", ()) if p != "body"]
    if not path and first.get("type") in NOT_AN_OBJECT:  # the body itself: not JSON's object, or not sent as JSON
        return bad_request(_not_an_object(request.headers.get("content-type"))).response()
    path += ctx.get("at", [])  # bodies.py's check of the keys names the path from the body to the key
    loc = [str(p) for p in path]
    param = ".".join(loc) or None
    said = str(first.get("msg", "invalid"))
    if first.get("type") == "value_error" and "error" in ctx:  # a validator's own words, as raised
        said = str(ctx["error"])
    if first.get("type") == "missing" and path and (typo := nearest(str(path[-1]), _keys_at(exc.body, path[:-1]))):
        said += f"; the body has {typo!r}: a typo of {str(path[-1])!r}?"
    message = f"{param}: {said}" if param else said
    code = UNKNOWN if first.get("type") == UNKNOWN else None
    return bad_request(message, param, code).response()


#: pydantic's error types for a body that is no JSON object (a list, a string; or bytes FastAPI did not parse
#: since the request's Content-Type was not JSON's: curl's `-d` without `-H` sends a form's)
NOT_AN_OBJECT = ("model_attributes_type", "dict_type", "model_type")


def _not_an_object(content_type: str | None) -> str:
    """What a body that is no JSON object gets told."""
    said = "the request body must be a JSON object, sent with `Content-Type: application/json`"
    if content_type is None or "json" not in content_type.lower():
        sent = f"this request's is {content_type!r}" if content_type else "this request has none"
        said += f" ({sent}; curl: -H 'Content-Type: application/json')"
    return said


def _keys_at(body: Any, path: list[Any]) -> list[str]:
    """The keys of the object at `path` in a request's body (none where there is no object)."""
    for step in path:
        try:
            body = body[step]
        except (KeyError, IndexError, TypeError):
            return []
    return [k for k in body if isinstance(k, str)] if isinstance(body, dict) else []
