"""hpc/compat.py: 3.10's stand-in for `asyncio.timeout`, here and under a real 3.10 interpreter."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator

import pytest

from hpc import compat
from tests._pythons import find_python, where_looked


async def _pieces(gate: asyncio.Event, tasks: list[asyncio.Task | None]) -> AsyncIterator[int]:
    for n in range(3):
        tasks.append(asyncio.current_task())
        if n == 1:
            await gate.wait()  # the second piece waits for the gate
        yield n


def test_timeout_310_times_out_the_await_in_this_task() -> None:
    async def main() -> tuple[list[int], list[asyncio.Task | None], asyncio.Task | None]:
        gate, tasks, got = asyncio.Event(), [], []
        pieces = _pieces(gate, tasks)
        with pytest.raises(TimeoutError):
            while True:
                async with compat.timeout_310(0.05):
                    got.append(await anext(pieces))
        await pieces.aclose()
        return got, tasks, asyncio.current_task()

    got, tasks, task = asyncio.run(main())
    assert got == [0]  # the first piece came in time, the second never did
    assert set(tasks) == {task}  # the generator ran in the caller's task, as 3.11's asyncio.timeout has it


def test_timeout_310_passes_what_ends_in_time_and_a_cancel_from_outside() -> None:
    async def main() -> None:
        async with compat.timeout_310(5):
            await asyncio.sleep(0)

        async def waits() -> None:
            async with compat.timeout_310(5):
                await asyncio.Event().wait()

        task = asyncio.ensure_future(waits())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # not turned into a timeout
            await task
        async with compat.timeout_310(0.05):
            pass
        later = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, later.set)  # timers fire in order: the block's would be first
        await later.wait()  # not cancelled on the way: the timer went with the block

    asyncio.run(main())


#: under 3.10 (no typing_extensions there: a stand-in), hpc/compat.py alone, its `timeout` timing out
UNDER_310 = r"""
import asyncio, importlib.util, sys, types
sys.modules["typing_extensions"] = types.SimpleNamespace(Self=object, Unpack=object)
spec = importlib.util.spec_from_file_location("compat", sys.argv[1])
compat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compat)
assert compat.timeout is compat.timeout_310

async def main():
    try:
        async with compat.timeout(0.05):
            await asyncio.sleep(5)
    except TimeoutError:
        print("timed out")

asyncio.run(main())
"""


@pytest.mark.slow
def test_compat_under_310() -> None:
    python = find_python(3, 10)
    if python is None:
        pytest.skip(where_looked(3, 10))
    proc = subprocess.run([python, "-I", "-c", UNDER_310, compat.__file__], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "timed out", proc.stderr
