"""`BodyLimit`: a request body larger than the gateway takes (hpc/spec/limits.py) is refused with 413 before it
is read whole.

Why: uvicorn reads whatever body a client sends, and the gateway's routes hold a request's body in memory (and
parse it on the event loop), so without a bound one client could take the gateway's memory, and every stream it
relays with it. The bound is far above any prompt a model's context holds (a million tokens are ~4 MB of text):
a body over it is a mistake or an attack, never a request to serve. A declared `Content-Length` over it is
refused at once, unread; a body sent in chunks is counted as it comes and refused when it passes the bound
(uvicorn stops reading from a connection whose body the app does not read, so nothing more is buffered).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hpc.gateway.errors import APIError


class BodyTooLarge(APIError):
    """413, naming the bound and how to raise it (raised from `receive`, so every route answers it the same)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is larger than this gateway takes ({limit // 2**20} MiB); send a shorter prompt, or"
            " start the gateway with a larger --max-body-mb (the spec's gateway.max_body_mb)",
            "invalid_request_error",
            code="request_too_large",
        )


def declared_length(scope: Scope) -> int | None:
    """The request's `Content-Length`, when it has a valid one."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BodyLimit:
    """ASGI middleware: see the module docstring. `limit`: bytes (None: no bound)."""

    def __init__(self, app: ASGIApp, limit: int | None) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limit
        if scope["type"] != "http" or limit is None:
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await BodyTooLarge(limit).response()(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        try:  # `send` is not wrapped (it carries every streamed event): each route reads its body before it answers
            await self.app(scope, counted, send)
        except BodyTooLarge as exc:  # raised where no route's error handler took it (the fast path's body read)
            await exc.response()(scope, receive, send)
