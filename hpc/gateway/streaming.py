"""`EventStream`: a streamed answer (SSE or a relayed Triton stream) that stops the moment its client goes away,
without Starlette's per-response anyio task group.

Why: uvicorn (0.54) speaks ASGI spec 2.3, where a send to a closed connection is silently dropped, so Starlette's
`StreamingResponse` runs every response in a task group with a second task listening for `http.disconnect`. That
group is created and torn down for each request of a gateway that answers thousands of short streams: in a
cProfile of 320 streamed completions it was the largest single cost of the HTTP side after the socket writes.
Here one plain asyncio task awaits `receive()`; when it brings `http.disconnect`, the response's own task is
cancelled (so an upstream that has not produced its next token yet is abandoned at once, as before: the body
iterator's `finally` ends the replica's stream), and the cancellation is absorbed. Servers speaking spec 2.4
(a send raises OSError after a disconnect) take Starlette's own path.
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


async def _disconnected(receive: Receive) -> bool:
    """True once the client is gone (the request body, all read by then, brings nothing else)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return True


class EventStream(StreamingResponse):
    """StreamingResponse with one watcher task instead of a task group (see the module docstring)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        spec = tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))
        if scope["type"] != "http" or spec >= (2, 4):
            await super().__call__(scope, receive, send)
            return
        me = asyncio.current_task()
        assert me is not None
        watcher = asyncio.ensure_future(_disconnected(receive))
        gone = False

        def client_left(task: asyncio.Future[bool]) -> None:
            nonlocal gone
            if not task.cancelled() and task.exception() is None:
                gone = True
                me.cancel()  # delivered at the await the response is at: it is suspended while this runs

        watcher.add_done_callback(client_left)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone:
                raise
            _uncancel(me)
        finally:
            # No await between the stream's end and this line, so the callback cannot fire after it.
            watcher.remove_done_callback(client_left)
            watcher.cancel()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:  # a generator left at a yield: run its `finally` (ends the replica's stream)
                await aclose()
        if self.background is not None and not gone:
            await self.background()


def _uncancel(task: asyncio.Task) -> None:
    """Take back the cancellation the watcher asked for (3.11+ counts them; 3.10 has nothing to take back)."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()
