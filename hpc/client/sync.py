"""`Client`: the blocking API, `AsyncClient` run on a private event loop in a thread of its own.

Why a loop in its own thread and not `asyncio.run` per call: the HTTP and gRPC connections are bound to the
loop that made them and are kept across requests; and a caller that already runs a loop (a notebook, an async
program calling a library) cannot run another in its own thread. Why one loop for every Client of the process,
made on first use and never closed: gRPC's asyncio layer binds to each loop that used it and keeps notifying
it, so a loop closed while gRPC lives prints "Event loop is closed" errors; one loop, one thread, however many
clients come and go. No thread is started per request: a batch is concurrent on that loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from hpc.client.aio import DEFAULT_CONCURRENCY, DEFAULT_MAX_TOKENS, AsyncClient, TargetLike
from hpc.client.transport import Sampling
from hpc.compat import Self, Unpack
from hpc.scheduler.index import JobRef
from hpc.serving.deployment import Target

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _client_loop() -> asyncio.AbstractEventLoop:
    """The event loop every Client runs on (a daemon thread, started on first use)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="hpc-serve-client", daemon=True).start()
        return _loop


class Client:
    """Generate text from a deployment: through its gateway when one answers, else balanced over its ready
    replicas. Same arguments as AsyncClient. Use as `with Client(TARGET) as c:`, or call `close()`."""

    def __init__(self, target: TargetLike | AsyncClient, **options: Any) -> None:
        self._aio = target if isinstance(target, AsyncClient) else AsyncClient(target, **options)

    @classmethod
    def from_job(cls, job: str | JobRef, replica: int | None = None, **options: Any) -> Self:
        """The job's deployment; with `replica`, only that replica of this job (see AsyncClient.from_job)."""
        return cls(AsyncClient.from_job(job, replica, **options))

    @property
    def target(self) -> Target | None:
        """The deployment (None for a client pinned to one replica)."""
        return self._aio.target

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, _client_loop())
        try:
            return future.result()
        except BaseException:  # KeyboardInterrupt in the caller: the request must not go on alone
            future.cancel()
            raise

    def generate(self, prompt: str, max_tokens: int = DEFAULT_MAX_TOKENS, **sampling: Unpack[Sampling]) -> str:
        """The whole completion (without the prompt, and cut before a `stop` sequence)."""
        return self._run(self._aio.generate(prompt, max_tokens, **sampling))

    def stream(self, prompt: str, max_tokens: int = DEFAULT_MAX_TOKENS, **sampling: Unpack[Sampling]) -> Iterator[str]:
        """Text pieces as they are generated; leaving the loop early ends the request on the server."""
        pieces = self._aio.stream(prompt, max_tokens, **sampling)

        async def step(awaitable: Awaitable[str]) -> str:
            return await awaitable

        try:
            while True:
                try:
                    piece = self._run(step(pieces.__anext__()))
                except StopAsyncIteration:
                    return
                yield piece
        finally:
            self._run(pieces.aclose())

    def generate_batch(
        self,
        prompts: Sequence[str],
        max_tokens: int = DEFAULT_MAX_TOKENS,
        concurrency: int = DEFAULT_CONCURRENCY,
        **sampling: Unpack[Sampling],
    ) -> list[str]:
        """Completions of `prompts` in their order, `concurrency` at a time on the client's one loop."""
        return self._run(self._aio.generate_batch(prompts, max_tokens, concurrency, **sampling))

    def ready(self) -> bool:
        """True when a gateway answers or a replica of the deployment is ready."""
        return self._run(self._aio.ready())

    def close(self) -> None:
        """Close the client's connections (a later request opens them again)."""
        self._run(self._aio.aclose())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
