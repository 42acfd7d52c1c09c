"""`FastPath`: `POST /v1/completions` and `POST /v1/chat/completions` served without FastAPI's routing, dependency
solving and request-body machinery, when the request is a well-formed one; every other request, and every
request this path would answer with a validation error, goes to FastAPI unchanged.

Why: at one stream the gateway's added latency is what it does before the first token leaves, and FastAPI's part
of that (route matching over every route, the dependency graph with the token check, parsing the body to Python
objects and validating those, two more middleware layers) was a third of it (docs/decisions.md "The gateway's own
time"). Here the body is validated
from its bytes in one pydantic call (`model_validate_json`) and the same route function runs (openai_api's
`complete` / `chat_complete`), so answers are the same. What stays FastAPI's, byte for byte: a missing or wrong
token (401), a body that does not parse or validate (400 with the field), a content type that is not JSON, and
any other method or path: those requests are handed on with their body replayed, as if this path were not there.
It sits inside the access log (hpc/gateway/accesslog.py), which still records every request; it names the
route as FastAPI would, so the metrics' `route` labels are the same either way. Once the request has left for the
replica (hpc/serving/idle.py), a client that leaves is watched for (hpc/gateway/streaming.py `Watch`): one gone
before its first token ends its request there, not at the first piece.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hpc.gateway.accesslog import RequestRecord
from hpc.gateway.auth import authorized
from hpc.gateway.bodies import ChatRequest, CompletionRequest
from hpc.gateway.errors import APIError
from hpc.gateway.openai_api import CHAT_PATH, COMPLETIONS_PATH, chat_complete, complete
from hpc.gateway.state import Gateway
from hpc.gateway.streaming import watching
from hpc.serving import idle


@dataclass(frozen=True)
class FastRoute:
    """A route this path serves: its body's model and the function that answers it."""

    body: type[BaseModel]
    answer: Callable[[Gateway, Any, RequestRecord], Awaitable[Any]]


#: path → how to serve it; the paths are openai_api's, where FastAPI's routes are declared with them
FAST_ROUTES: Mapping[str, FastRoute] = {
    COMPLETIONS_PATH: FastRoute(CompletionRequest, complete),
    CHAT_PATH: FastRoute(ChatRequest, chat_complete),
}


def header(scope: Scope, name: bytes) -> bytes | None:
    """A request header's value (ASGI gives names in lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def is_json(content_type: bytes | None) -> bool:
    """What FastAPI (strict about content types, its default) parses as JSON: `application/json` or
    `application/<x>+json`; a body without a content type is not."""
    if content_type is None:
        return False
    mime = content_type.split(b";", 1)[0].strip().lower()
    return mime == b"application/json" or (mime.startswith(b"application/") and mime.endswith(b"+json"))


async def read_body(receive: Receive) -> bytes | None:
    """The request's body; None when the client left before it was whole (nothing to answer)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left while sending
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replayed(body: bytes, receive: Receive) -> Receive:
    """`receive` for the app this path hands a request on to: the body already read, then the client's own
    messages (its disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


class FastPath:
    """ASGI middleware: see the module docstring. `routes`: FastAPI's routes of these paths (the access log
    labels a request with its route's path template)."""

    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        by_path = {getattr(route, "path", None): route for route in routes}
        self.labels = {path: by_path[path] for path in FAST_ROUTES}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = FAST_ROUTES.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        gateway: Gateway | None = getattr(scope["app"].state, "gateway", None) if fast is not None else None
        if fast is None or gateway is None or not self._accepts(scope, gateway):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:  # the client left while sending it: no answer (the access log records 499)
            scope["route"] = self.labels[scope["path"]]
            return
        try:
            parsed = fast.body.model_validate_json(body)
        except ValidationError:  # FastAPI's 400, naming the field, as without this path
            await self.app(scope, replayed(body, receive), send)
            return
        scope["route"] = self.labels[scope["path"]]
        record = scope.setdefault("state", {}).get("record")
        if not isinstance(record, RequestRecord):
            record = RequestRecord(scope["method"], scope["path"])
        # a client gone before its answer starts stops it too (streaming.py); watched from when the request has
        # left for the replica (idle.py: not before, where it would add to the time to the first token)
        idle.collect()
        task = asyncio.current_task()
        watch = idle.Later(lambda: watching(scope, receive, task))
        try:
            try:
                response = await fast.answer(gateway, parsed, record)
            except APIError as exc:
                response = exc.response()
            await response(scope, receive, send)
        except asyncio.CancelledError:
            gone = watch.made()
            if gone is None or not gone.gone:
                raise
            gone.absorb()  # nothing was sent: the access log records 499
        finally:
            if (made := watch.made()) is not None:
                made.stop()

    @staticmethod
    def _accepts(scope: Scope, gateway: Gateway) -> bool:
        """The request carries a JSON body and a token the deployment accepts (anything else is FastAPI's
        answer, a 401 or a 400)."""
        authorization = header(scope, b"authorization")
        token = authorization.decode("latin-1") if authorization is not None else None
        return is_json(header(scope, b"content-type")) and authorized(token, gateway.discovery.tokens)
