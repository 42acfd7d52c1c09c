"""hpc/serving/abandon.py `stop_until` on its own: the stops of a request whose client left, sent until the engine
holds it, without a replica (a stop here is a coroutine the test controls). End to end: tests/test_gateway_abandon.py
and tests/test_gateway_e2e_replicas.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from hpc.compat import timeout
from hpc.serving import abandon
from hpc.serving.abandon import STOPS_IN_FLIGHT, stop_until


class Stops:
    """A stop that records each call and waits for `answer` (a replica that has not answered yet)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.answered = 0
        self.answer = asyncio.Event()
        self.fail = fail

    async def __call__(self) -> None:
        self.calls += 1
        await self.answer.wait()
        self.answered += 1
        if self.fail:
            raise ConnectionError("replica gone")


class Settled(asyncio.Event):
    """The event `stop_until` waits for, counting its waits: each is one turn of its loop, where it may send."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    async def wait(self) -> bool:  # type: ignore[override]
        self.waits += 1
        return await super().wait()


async def until(condition: Callable[[], bool]) -> None:
    """Wait for `condition` (an event of the test's own stops), at most 30 s."""
    async with timeout(30):
        while not condition():
            await asyncio.sleep(0.005)


def test_the_last_stop_goes_out_while_the_earlier_ones_wait_for_their_answers() -> None:
    """Once the engine holds the request (`settled`), the stop that counts goes at once, not after every earlier
    stop's answer (each may take hundreds of ms under load, and a replica may answer none)."""

    async def scenario() -> None:
        stops, settled = Stops(), asyncio.Event()
        task = asyncio.ensure_future(stop_until(stops, settled, then=lambda: True))
        await until(lambda: stops.calls >= 2)  # sent again: the first has no answer yet
        settled.set()
        before = stops.calls
        await until(lambda: stops.calls == before + 1)
        assert stops.answered == 0 and not task.done()
        stops.answer.set()
        await task
        assert stops.answered == stops.calls

    asyncio.run(scenario())


def test_no_more_stops_wait_at_once_than_the_limit_and_none_after_the_end(monkeypatch) -> None:
    monkeypatch.setattr(abandon, "RESTOP_FIRST_S", 0.001)  # a turn every ms: the test waits for turns, not time
    monkeypatch.setattr(abandon, "RESTOP_MAX_S", 0.001)

    async def scenario() -> None:
        stops, settled = Stops(), Settled()
        task = asyncio.ensure_future(stop_until(stops, settled))
        await until(lambda: stops.calls == STOPS_IN_FLIGHT)
        turns = settled.waits
        await until(lambda: settled.waits >= turns + 20)  # 20 more turns, each of which could have sent one
        assert stops.calls == STOPS_IN_FLIGHT
        stops.answer.set()  # answered: sending goes on
        await until(lambda: stops.calls > STOPS_IN_FLIGHT)
        settled.set()
        await task
        calls = stops.calls
        assert calls == stops.answered  # `then` said no: no last stop, and every one sent was answered

    asyncio.run(scenario())


def test_a_stop_that_failed_is_raised_at_the_end_and_the_waiting_ones_are_cancelled() -> None:
    async def scenario() -> None:
        stops, settled = Stops(fail=True), asyncio.Event()
        task = asyncio.ensure_future(stop_until(stops, settled))
        await until(lambda: stops.calls >= 1)
        stops.answer.set()
        settled.set()
        with pytest.raises(ConnectionError):
            await task

    asyncio.run(scenario())


def test_a_reader_behind_its_stream_takes_what_waits_at_once_up_to_the_end_or_the_error() -> None:
    """`Reader.ready`: the items already read, without waiting, never the end (None) or an error, which `next`
    gives after them; hpc/serving/triton.py relays them as one chunk."""

    async def items(error: bool):
        for i in range(3):
            yield i
        if error:
            raise ValueError("lost")

    async def main() -> None:
        for error in (False, True):
            reader = abandon.Reader(items(error), lambda: None)
            assert await reader.next() == 0
            await reader.task  # the rest is read meanwhile
            assert reader.ready() == [1, 2] and reader.ready() == []
            if error:
                with pytest.raises(ValueError, match="lost"):
                    await reader.next()
            else:
                assert await reader.next() is None

    asyncio.run(main())


def test_responses_read_together_stop_at_the_final_one_and_at_a_refusal() -> None:
    from tritonclient.grpc import service_pb2

    from hpc.serving.triton import _taken

    def response(final: bool = False, error: str = ""):
        out = service_pb2.ModelStreamInferResponse(error_message=error)
        if final:
            out.infer_response.parameters["triton_final_response"].bool_param = True
        return out

    a, b, end, refused = response(), response(), response(final=True), response(error="Exceeds maximum queue size")
    assert _taken(a, [b]) == ([a, b], False, None)
    assert _taken(a, [end, b]) == ([a, end], True, None)
    assert _taken(a, [refused, b]) == ([a], False, "Exceeds maximum queue size")
    assert _taken(refused, []) == ([], False, "Exceeds maximum queue size")
