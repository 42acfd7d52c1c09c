"""`EventStream`: a streamed answer (SSE or a relayed Triton stream) that stops the moment its client goes away,
without Starlette's per-response anyio task group.

Why: uvicorn (0.54) speaks ASGI spec 2.3, where a send to a closed connection is silently dropped, so Starlette's
`StreamingResponse` runs every response in a task group with a second task listening for `http.disconnect`. That
group is created and torn down for each request of a gateway that answers thousands of short streams: the
largest single cost of the HTTP side after the socket writes (docs/decisions.md "The gateway's own time").
Here one plain asyncio task awaits `receive()`; when it brings `http.disconnect`, the response's own task is
cancelled (so an upstream that has not produced its next token yet is abandoned at once, as before: the body
iterator's `finally` ends the replica's stream), and the cancellation is absorbed. Servers speaking spec 2.4
(a send raises OSError after a disconnect) take Starlette's own path.

The watch starts before the answer does: hpc/gateway/fastpath.py has a `Watch` started as soon as the request has
left for the replica (hpc/serving/idle.py: while the replica works, not on the way to it), and the stream takes it
over (`WATCH` in the scope's state). Why: a client that leaves before its first token
(or before a whole answer that is not streamed) was otherwise seen only once the first piece came, so its request
waited in the replica's queue, was prefilled and made its first token for nobody, counted as outstanding all that
while, and was logged as a 200 (docs/decisions.md "Clients gone before their answer"). Now its task is cancelled
where it waits (the replica's stream ends by its id, hpc/serving/abandon.py, which stops a request still queued in
the engine), nothing is sent, and the access log records 499.
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

#: the key of a request's `Watch` in its scope's state (set by hpc/gateway/fastpath.py, taken over by EventStream)
WATCH = "hpc.watch"


async def disconnected(receive: Receive) -> bool:
    """True once the client is gone (the request body, all read by then, brings nothing else)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return True


class Watch:
    """One task awaiting the client's `http.disconnect` for the rest of a request whose body was read; when it
    comes, the request's task (the one that made the Watch) is cancelled where it waits. That task then catches
    CancelledError, and if `gone`, takes it back with `absorb()` and ends quietly; `stop()` once the request ends
    (no await between its end and `stop()`, so the cancel cannot come after it)."""

    def __init__(self, receive: Receive, task: asyncio.Task | None = None) -> None:
        task = task or asyncio.current_task()
        assert task is not None
        self._task = task
        self.gone = False
        self._watcher = asyncio.ensure_future(disconnected(receive))
        self._watcher.add_done_callback(self._client_left)

    def _client_left(self, watcher: asyncio.Future[bool]) -> None:
        if not watcher.cancelled() and watcher.exception() is None:
            self.gone = True
            self._task.cancel()  # delivered at the await the request is at: it is suspended while this runs

    def absorb(self) -> None:
        """Take back the cancellation the watcher asked for (3.11+ counts them; 3.10 has nothing to take back)."""
        uncancel = getattr(self._task, "uncancel", None)
        if uncancel is not None:
            uncancel()

    def stop(self) -> None:
        self._watcher.remove_done_callback(self._client_left)
        self._watcher.cancel()


def watching(scope: Scope, receive: Receive, task: asyncio.Task | None = None) -> Watch | None:
    """A Watch for this request (`task`: the one to cancel, default the current one), kept in its scope's state for
    the EventStream that answers it; None where the server speaks ASGI spec 2.4 (a send raises there, and
    Starlette's own listener must get the disconnect)."""
    if scope["type"] != "http" or _spec(scope) >= (2, 4):
        return None
    watch = Watch(receive, task)
    scope.setdefault("state", {})[WATCH] = watch
    return watch


def _spec(scope: Scope) -> tuple[int, ...]:
    return tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))


class EventStream(StreamingResponse):
    """StreamingResponse with one watcher task instead of a task group (see the module docstring)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _spec(scope) >= (2, 4):
            await super().__call__(scope, receive, send)
            return
        watch = scope.get("state", {}).get(WATCH)
        if not isinstance(watch, Watch):  # no watch yet (a route FastPath did not serve): one now
            watch = Watch(receive)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            watch.absorb()
        finally:
            watch.stop()  # no await between the stream's end and this line, so the cancel cannot come after it
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:  # a generator left at a yield: run its `finally` (ends the replica's stream)
                await aclose()
        if self.background is not None and not watch.gone:
            await self.background()
