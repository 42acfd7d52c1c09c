"""Work a request's answer needs that can wait until the request has left for the replica: done then, while the
replica prefills, instead of before the request leaves (where each microsecond adds to the time to the first
token) or once its first piece came (likewise).

Why: at one stream the gateway finds its caches cold (the other processes ran since its last request), and
then the disconnect watch and the answer's id and envelope cost about 100 us before the request left
(docs/decisions.md "The gateway's own time"). How: `collect()` gives the request's task a list in a context variable;
`Later(make)` puts its `make` there; the engine calls `run_deferred()` once the request was written to the
replica (hpc/serving/triton.py: in the request stream that gRPC's own task consumes, a task created in the
request's context, so it sees the same list). What has not run when it is needed (a request that never left:
no replica took it; or no list: a route FastAPI serves) runs then, at `Later.get()`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger("hpc_serve.gateway")

_PENDING: ContextVar[list[Callable[[], object]] | None] = ContextVar("hpc_serve_gateway_pending", default=None)


def collect() -> None:
    """From now on, in this task (and the tasks it creates), `Later` waits for `run_deferred`."""
    _PENDING.set([])


def run_deferred() -> None:
    """Run what waits (the engine calls it once the request was written); an error is logged, never raised into
    the gRPC task that sends the request."""
    pending = _PENDING.get()
    while pending:
        make = pending.pop(0)
        try:
            make()
        except Exception:  # noqa: BLE001 - the request goes on; `Later.get` raises it again where it is needed
            log.exception("work deferred until the request left failed")


class Later(Generic[T]):
    """A value made while the replica works (see the module docstring), or at `get()` if it is not made by then."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make: Callable[[], T] | None = make
        self._value: T | None = None
        pending = _PENDING.get()
        if pending is not None:
            pending.append(self.get)

    def get(self) -> T:
        if self._make is not None:
            make, self._make = self._make, None
            self._value = make()
        return self._value  # type: ignore[return-value]

    def made(self) -> T | None:
        """The value if it was made, without making it."""
        return self._value if self._make is None else None
