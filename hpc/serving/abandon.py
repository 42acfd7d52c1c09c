"""A replica stream whose client went away: stop its generation by request id and let the stream end by itself,
instead of cancelling the gRPC call.

Why: tritonserver 2.51 never releases an ensemble request whose gRPC stream was cancelled while it generated:
it stays "in flight" for good (`Model 'ensemble' has N in-flight inferences` at shutdown), so a server whose
clients ever closed a stream early waits out its exit timeout when it stops, exits 1, and the job reads FAILED (a
renewed job's predecessor, or `hpc-serve cancel`; benchmarks/soak.py: ~55 leaked per replica in a minute of load
with 15 % of streams closed early; RSS grows with them). Sending the cancel any later does not help. What does:
a request to the `tensorrt_llm` model with `stop: true` and the stream's request id (the ensemble passes its id
to its steps; TensorRT-LLM's backend and the CPU engine both stop that request), after which the ensemble ends
with its final response and is released (5 of 5 left nothing in flight, against 5 of 5 leaked by a cancel).

When: the engine stops only a request it holds; a stop whose id matches nothing is answered and dropped
(TensorRT-LLM's backend: a request may have ended already; the CPU engine logs it). A stream left before its first
response may not have reached the engine yet (the ensemble's preprocessing runs first), so its stop is sent again
(`stop_until`: after RESTOP_FIRST_S, doubling up to RESTOP_MAX_S) until the first response shows that the engine
holds the request, and once more then. Why not only at the first response: under load the engine's responses
queue up on their way out while it goes on generating (docs/decisions.md "Abandoned streams": the engine had made
149 of 240 tokens by the time the first one reached the client); a stop
sent again every so often lands within one interval of the request's arrival in the engine, however late its
responses are (tests/test_gateway_abandon.py fails without it).

Reading: gRPC's asyncio call cancels itself when the task awaiting its next message is cancelled (which is how a
client's disconnect reaches the stream), so the stream is read by a task of its own (`Reader`) and the request's
task awaits a queue: cancelling it leaves the call alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc._utils import _get_inference_request

from launcher.contracts import model_names

#: how long an abandoned stream's stop and end may take before its call is cancelled after all
ABANDON_S = 30.0
#: a stop that may have come before its request is sent again after this long, then at doubling intervals
RESTOP_FIRST_S = 0.05
#: ... up to this one (so a request queued for long costs a stop a second, and ABANDON_S ends it)
RESTOP_MAX_S = 1.0
#: stops of one request waiting for their answers at most: no more are sent meanwhile
STOPS_IN_FLIGHT = 4

_tasks: set[asyncio.Future[None]] = set()  # abandoned streams being ended: referenced until done


class Reader:
    """Reads a response stream (a gRPC call's responses, or an HTTP answer's bytes) on a task of its own:
    `next()` gives each item, None at the end of the stream, or raises what ended it; `ready()` the items already
    here, without waiting. `cancel` ends the stream for good (the gRPC call's `cancel`, the HTTP answer's
    `aclose`): what `abandon` does last. Why a deque and one future rather than an asyncio.Queue: an item per
    streamed token passes here, and the queue's getters and putters cost several times more per item."""

    def __init__(self, items: AsyncIterable[Any], cancel: Callable[[], object]) -> None:
        self.items = items
        self.cancel = cancel
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        #: set at the stream's first response (or its end): from then on the engine holds the request, if anyone
        self.responded = asyncio.Event()
        self.task = asyncio.ensure_future(self._read())

    def _put(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _read(self) -> None:
        try:
            read = getattr(self.items, "read", None)
            if read is not None:  # a gRPC call: its `read()`, without the async iterator's generator around it
                while (response := await read()) is not grpc.aio.EOF:
                    self._put(response)
                    if not self.responded.is_set():
                        self.responded.set()
            else:
                async for response in self.items:
                    self._put(response)
                    if not self.responded.is_set():
                        self.responded.set()
            self._put(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the reader of the queue as it is
            self._put(exc)
        finally:
            self.responded.set()

    async def next(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def ready(self) -> list[Any]:
        """The items already here, taken without waiting, up to the stream's end or error (which `next()` gives):
        what a reader that fell behind relays in one piece."""
        items = self._items
        out = []
        while items and items[0] is not None and not isinstance(items[0], BaseException):
            out.append(items.popleft())
        return out


def infer_inputs(arrays: dict[str, tuple[np.ndarray, str]]) -> list[grpcclient.InferInput]:
    """tritonclient's inputs for {name: (array, Triton dtype)}."""
    tensors = []
    for name, (array, dtype) in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def stream_request(model: str, inputs: list[grpcclient.InferInput], request_id: str) -> Any:
    """One request for Triton's streaming RPC, built with tritonclient's own builder (its asyncio `stream_infer`
    refuses the reserved parameters a caller may need to set on it)."""
    return _get_inference_request(
        model_name=model,
        inputs=inputs,
        model_version="",
        request_id=request_id,
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )


async def stop_generation(
    client: Any, request_id: str, metadata: tuple[tuple[str, str], ...], inputs: list[grpcclient.InferInput]
) -> None:
    """Ask the replica's engine model to stop the generation of `request_id` (answered at once; module docstring),
    with the workflow's stop request `inputs` (hpc/serving/model_io.py: both workflows' engine model is
    `tensorrt_llm`, and both take `stop`)."""
    request = stream_request(model_names.TENSORRT_LLM, inputs, request_id)  # the engine model

    async def one():
        yield request

    async for _ in client._client_stub.ModelStreamInfer(one(), metadata=metadata):
        pass  # the engine model answers a stop at once; the stream ends once it did


#: a stop of the abandoned stream's generation (`stop_generation` with its client, id and token)
Stop = Callable[[], Awaitable[None]]


async def stop_until(stop: Stop, settled: asyncio.Event, then: Callable[[], bool] = lambda: False) -> None:
    """Stop now, and again after RESTOP_FIRST_S, doubling up to RESTOP_MAX_S, until `settled` (module docstring:
    the engine may not hold the request yet, and a stop for an id it does not hold is dropped); once `settled`, one
    more stop if `then()` says so (the engine holds the request now, and it goes on). The stops are not awaited
    one by one: one whose answer comes late (seen under load: 330 ms) delays neither the next nor that last one,
    and no more than STOPS_IN_FLIGHT wait for their answers at once (a replica that answers none is not sent
    more). The first error among them is raised at the end (a replica gone: nothing is left to stop). The caller
    bounds the whole (ABANDON_S)."""
    sent = [asyncio.ensure_future(stop())]
    interval = RESTOP_FIRST_S
    try:
        while not settled.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(settled.wait(), interval)
            if not settled.is_set() and sum(not task.done() for task in sent) < STOPS_IN_FLIGHT:
                sent.append(asyncio.ensure_future(stop()))
            interval = min(2 * interval, RESTOP_MAX_S)
        if then():
            sent.append(asyncio.ensure_future(stop()))
        await asyncio.gather(*sent)
    finally:
        for task in sent:
            task.cancel()
        await asyncio.gather(*sent, return_exceptions=True)


async def _stop_until_held(reader: Reader, stop: Stop) -> None:
    """Stop the generation: once, when the engine held the request already (the stream had responded), else
    until the first response shows it does, and once more then if the stream goes on (`stop_until`)."""
    if reader.responded.is_set():
        if not reader.task.done():
            await stop()
        return
    await stop_until(stop, reader.responded, then=lambda: not reader.task.done())


async def _end(reader: Reader, stop: Stop) -> None:
    try:
        await asyncio.wait_for(_stop_until_held(reader, stop), ABANDON_S)
        await asyncio.wait_for(asyncio.shield(reader.task), ABANDON_S)
    except Exception:  # noqa: BLE001, S110 - a replica gone meanwhile: the cancel below is all that is left
        pass
    finally:
        if not reader.task.done():
            reader.task.cancel()
        with contextlib.suppress(BaseException):
            await reader.task
        with contextlib.suppress(Exception):
            ending = reader.cancel()  # after its end: nothing to cancel, but an HTTP answer's connection is let go
            if inspect.isawaitable(ending):
                await ending


def keep(task: asyncio.Future[None]) -> None:
    """Hold a task that ends a request in the background until it is done (the event loop holds tasks weakly)."""
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def abandon(reader: Reader, stop: Stop) -> asyncio.Future[None] | None:
    """End a stream left mid-way in the background (module docstring): stop its generation, read its stream to
    the end, and cancel it only if that takes longer than ABANDON_S. Returns the task doing it (None when the
    stream had ended already: its `cancel` is the caller's); nobody needs to await it."""
    if reader.task.done():  # the stream already ended (an error, the replica gone): nothing to release
        return None
    task = asyncio.ensure_future(_end(reader, stop))
    keep(task)
    return task
