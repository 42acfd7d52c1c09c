"""The one retry rule for a streamed request over a deployment's replicas: pick with the Balancer, count the
request while it runs, and when the chosen replica fails (or refuses: its queue is full) before its first piece,
send the request to another one.

Why only before the first piece: until then nothing reached the caller, so sending the request again cannot
show text twice; after that a failure is the caller's to see. Why a function of its own: the gateway
(hpc/gateway/state.py `Gateway.generate`, and its Triton passthrough) and the Python client (hpc/client/) all
call it, so they balance and retry the same way; what each keeps for itself (the access log, metrics, log
lines) hangs on its hooks.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

from hpc.serving.balancer import Balancer, NoReplica, Replica, Route, Saturated

T = TypeVar("T")


async def stream_with_retry(
    balancer: Balancer,
    attempt: Callable[[Replica], AsyncIterator[T]],
    unavailable: type[BaseException] | tuple[type[BaseException], ...],
    refused: type[BaseException] | tuple[type[BaseException], ...] = (),
    prefix_key: str | None = None,
    on_retry: Callable[[Replica, BaseException], None] | None = None,
    on_pick: Callable[[Replica, int], None] | None = None,
    on_first: Callable[[], None] | None = None,
    failed: Callable[[BaseException], bool] = lambda _exc: False,
    route: Callable[[], Awaitable[Route | None]] | None = None,
    exclude: tuple[str, ...] = (),
) -> AsyncGenerator[T, None]:
    """What `attempt(replica)` yields, from the replica the balancer picks (`prefix_key`: its affinity key; or
    `route`, awaited once before the first pick: the prompt as cache-aware routing scores it, whose prefill
    counts as queued on its replica until the first item).
    Before the first item, a replica that raises `unavailable` is benched (`mark_failed`) and one that raises
    `refused` (its queue is full: healthy, not benched, `mark_refused`) is skipped, and the next one is tried;
    `on_retry(replica, error)` follows either. `on_pick(replica, tried)` is called as a replica is chosen
    (`tried`: how many this request was sent to before), `on_first()` as the first item comes. Raises the balancer's NoReplica when none is left
    (Saturated when every ready one is full, or one refused), and any other error of the attempt, or its error
    once an item was yielded, as it is. An error for which `failed(error)` holds (the model failed the request
    before its first item: an engine that died takes requests until its launcher sees it) is tried once more on
    another replica, without benching the first; a second one, or none left to try, raises it. `exclude`: keys of
    replicas not to pick (a stream's continuation leaves out the replica that failed it)."""
    tried: list[str] = list(exclude)
    refusals = 0
    failure: BaseException | None = None
    scored = await route() if route is not None else None
    while True:
        try:
            replica = balancer.pick(exclude=tried, prefix_key=prefix_key, route=scored)
        except NoReplica:
            if failure is not None:
                raise failure from None
            if refusals:
                raise Saturated(f"{refusals} replica(s) refused the request: their queues are full") from None
            raise
        if on_pick is not None:
            on_pick(replica, len(tried) - len(exclude))
        tried.append(replica.key)
        started = False
        with balancer.track(replica, scored.prefill if scored is not None else 0) as first_token:
            items = attempt(replica)
            try:
                async for item in items:
                    if not started:
                        started = True
                        first_token()
                        if on_first is not None:
                            on_first()
                    yield item
                return
            except refused as exc:
                if started:
                    raise
                balancer.mark_refused(replica)
                refusals += 1
                if on_retry is not None:
                    on_retry(replica, exc)
            except unavailable as exc:
                if started:
                    raise
                balancer.mark_failed(replica)
                if on_retry is not None:
                    on_retry(replica, exc)
            except Exception as exc:
                if started or failure is not None or not failed(exc):
                    raise
                failure = exc
                if on_retry is not None:
                    on_retry(replica, exc)
            finally:
                if isinstance(items, AsyncGenerator):  # a caller that stopped early ends the request now
                    await items.aclose()


async def taken_whole(items: AsyncIterator[T], on_item: Callable[[], None] | None = None) -> AsyncGenerator[T, None]:
    """Every item of `items`, yielded only once the last one came (`on_item` is called as each arrives). For an
    answer that is not streamed: nothing of it reaches the caller before the end anyway, so wrapped around an
    attempt of `stream_with_retry` it turns a replica lost half-way into one that failed before its first item,
    which is retried on another instead of failing the request. The gateway and the client both use it."""
    got = []
    async with aclosing(items):  # type: ignore[type-var]  # an async generator (TritonEngine.stream)
        async for item in items:
            if on_item is not None:
                on_item()
            got.append(item)
    for item in got:
        yield item
