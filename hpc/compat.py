"""What Python 3.11 added that `hpc/` uses, for Python 3.10 (pyproject's `requires-python`).

Why a module of its own: one place to import these from, so that a 3.11-only name does not creep back into a
module (mypy also runs at 3.10: scripts/test.sh), and one file to delete when 3.10 is dropped. `hpc/` only:
`launcher/` and `backend/` run with the container's python3, where `typing_extensions` may be missing, and
use what 3.10 has instead (a TypeVar bound to the class, not `Self`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator


@contextlib.asynccontextmanager
async def timeout_310(delay: float) -> AsyncIterator[None]:
    """`asyncio.timeout(delay)` for 3.10: cancel this task after `delay` seconds, and raise TimeoutError.

    In this task, as 3.11's is, rather than `asyncio.wait_for`'s task of its own: an async generator advanced
    inside it keeps running in the task that iterates it. 3.10 has no `Task.uncancel`, so a cancel from
    outside that comes in the same instant as the deadline reads as the timeout."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("timeout() must be used inside a task")
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    handle = asyncio.get_running_loop().call_later(delay, expire)
    try:
        yield
    except asyncio.CancelledError:
        if expired:
            raise TimeoutError from None
        raise
    finally:
        handle.cancel()


if sys.version_info >= (3, 11):
    from asyncio import timeout
    from typing import Self, Unpack
else:  # typing_extensions is a dependency for python < 3.11 (pyproject.toml)
    from typing_extensions import Self, Unpack

    timeout = timeout_310

#: what a timed-out await raises: 3.11 made asyncio.TimeoutError the builtin TimeoutError; in 3.10 they differ
TIMEOUT_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, asyncio.TimeoutError)

__all__ = ["TIMEOUT_ERRORS", "Self", "Unpack", "timeout", "timeout_310"]
