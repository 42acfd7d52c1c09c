"""Following each replica's KV-cache events, for cache-aware routing (hpc/serving/routing.py `CachedPrefix`).

hpc-serve's llmapi model keeps its engine's latest KV-cache events (TensorRT-LLM's `get_kv_cache_events`, the CPU
engine's and the simulated engine's alike) and answers a request with `kv_cache_events_since` (the last event id
the caller has) with those after it (backend/models/llmapi_io.py). The gateway asks every replica that serves
that model every `EVENTS_PERIOD_S`, as Dynamo's and llm-d's routers follow their engines' events; those that
serve another model (the image's model.py, the engine workflow's ensemble) send none, and the mode says so.

Why ask rather than be told: the model answers on the replica's gRPC port, which the gateway reaches already,
with its token; a push would need a port and an address of the gateway that every replica knows.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc

from hpc.serving.auth import grpc_headers
from hpc.serving.balancer import Balancer, Replica
from hpc.serving.routing import CachedPrefix
from hpc.serving.triton import CHANNEL_ARGS
from launcher.contracts.llmapi import IMAGE_MODEL, KV_EVENTS_OFF, KV_EVENTS_OUTPUT, KV_EVENTS_SINCE, LLMAPI
from launcher.contracts.model_names import TENSORRT_LLM

log = logging.getLogger("hpc_serve.gateway.routing")

#: seconds between two asks of a replica: a conversation's next turn comes after its answer, seconds later at
#: least, so its prompt's blocks are known by then, and what was sent meanwhile counts as held for SENT_TTL_S
#: (prefix_index.py); each ask costs the replica's python model a request (every 0.1 s, the TTFT of a 2-core
#: test machine's simulated replicas rose by 10-20 ms: docs/decisions.md "Routing by the longest cached prefix")
EVENTS_PERIOD_S = 0.5
#: how long an ask may take before the replica counts as failing to send its events
EVENTS_TIMEOUT_S = 5.0


def sends_events(replica: Replica) -> bool:
    """Whether the replica's model hands out KV-cache events: hpc-serve's llmapi model (with them on)."""
    return replica.workflow == LLMAPI and replica.llmapi_model != IMAGE_MODEL


class EventsUnavailable(RuntimeError):
    """The replica's model did not answer with its events (the message says what it answered)."""


class KvEventsFollower:
    """Asks each replica of `balancer` for its new KV-cache events and gives them to `mode`."""

    def __init__(
        self,
        mode: CachedPrefix,
        balancer: Balancer,
        token_for: Callable[[Replica], str | None],
        period_s: float = EVENTS_PERIOD_S,
    ) -> None:
        self.mode = mode
        self.balancer = balancer
        self.token_for = token_for
        self.period_s = period_s
        self._clients: dict[str, aiogrpc.InferenceServerClient] = {}
        #: asks answered, per replica (what a test waits for)
        self.reads: dict[str, int] = {}

    @asynccontextmanager
    async def running(self) -> AsyncIterator[KvEventsFollower]:
        task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            for client in self._clients.values():
                await client.close()

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:  # a bug must not end the following for good: said, and the next look comes
                log.exception("following the replicas' KV-cache events failed; trying again")
            await asyncio.sleep(self.period_s)

    async def poll(self) -> None:
        """Ask every replica once (those without events are marked so)."""
        replicas = self.balancer.replicas
        self.mode.retain(r.key for r in replicas)
        for url in [u for u in self._clients if u not in {r.grpc_url for r in replicas}]:
            await self._clients.pop(url).close()
        await asyncio.gather(*(self._poll(r) for r in replicas))

    async def _poll(self, replica: Replica) -> None:
        if not sends_events(replica):
            self.mode.unfollowed(replica.key, "no_events")
            return
        blocks = self.mode.blocks.get(replica.key)
        since = blocks.last_event_id if blocks is not None else -1
        try:
            events = await asyncio.wait_for(self.events_since(replica, since), EVENTS_TIMEOUT_S)
        except EventsUnavailable as exc:
            off = KV_EVENTS_OFF in str(exc)
            self.mode.unfollowed(replica.key, "events_off" if off else "events_failed", "" if off else str(exc))
            return
        except (asyncio.TimeoutError, grpc.RpcError, grpcclient.InferenceServerException, OSError) as exc:
            why = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else repr(exc)
            self.mode.unfollowed(replica.key, "events_failed", why)
            return
        except (LookupError, TypeError, ValueError) as exc:  # an answer of another shape (json, a tensor, an event)
            self.mode.unfollowed(replica.key, "events_failed", repr(exc))
            return
        try:
            self.mode.follow(replica.key, events)
        except (LookupError, TypeError, ValueError) as exc:  # an event of a shape another engine release sends
            self.mode.unfollowed(replica.key, "events_failed", f"an event it could not read: {exc!r}")
            return
        self.reads[replica.key] = self.reads.get(replica.key, 0) + 1

    async def events_since(self, replica: Replica, since: int) -> list[dict[str, Any]]:
        """The replica's events after event id `since`, oldest first. A decoupled model takes requests only on
        the streaming RPC: one request, its one response, then the stream is closed."""
        client = self._clients.get(replica.grpc_url)
        if client is None:
            client = self._clients[replica.grpc_url] = aiogrpc.InferenceServerClient(
                replica.grpc_url, channel_args=list(CHANNEL_ARGS)
            )
        tensors = []
        for name, array in (
            ("text_input", np.array([b""], dtype=np.object_)),
            (KV_EVENTS_SINCE, np.array([since], dtype=np.int64)),
        ):
            tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT64")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        answered = asyncio.Event()

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": TENSORRT_LLM, "inputs": tensors}
            await answered.wait()  # half-close only once the answer came

        try:
            async for result, error in client.stream_infer(requests(), headers=grpc_headers(self.token_for(replica))):
                answered.set()
                if error is not None:
                    raise EventsUnavailable(str(error))
                raw = result.as_numpy(KV_EVENTS_OUTPUT)
                if raw is None:
                    raise EventsUnavailable(f"no {KV_EVENTS_OUTPUT} in its answer")
                value = raw.reshape(-1)[0]
                return list(json.loads(value.decode() if isinstance(value, bytes) else value))
        finally:
            answered.set()
        raise EventsUnavailable("the stream ended without an answer")
