"""A replica that joins (a renewed job's successor, a second job) is sent the hottest shared prefixes before it
takes requests, so that its first requests find them cached (cache-aware routing: hpc/serving/routing.py).

Why: with `routing: cache`, a prefix that more than a replica's share of the traffic holds (a system prompt)
counts as held by every replica; a successor that starts cold would compute it for each request that comes while
it is not cached yet. Each prefix is sent as a request of one token (`max_tokens=1`); the replica counts as
`warming` meanwhile (hpc/serving/balancer.py: no new requests while another replica takes them), and at most
`WARM_TIMEOUT_S` in all: a warm-up is a help, never a gate a replica could be stuck behind. A gateway of several
worker processes warms a replica once, in worker 0: the others read its `warming` count, which the workers share
(hpc/serving/replica_counts.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from hpc.serving.balancer import Balancer, Replica
from hpc.serving.model_io import GenerateParams
from hpc.serving.routing import CachedPrefix
from hpc.serving.triton import TritonEngine

log = logging.getLogger("hpc_serve.gateway.routing")

#: shared prefixes a joining replica is sent: the few hot ones that every replica should hold
WARM_PREFIXES = 8
#: the most a warm-up may take before the replica takes requests anyway (a prefill of a few prompts)
WARM_TIMEOUT_S = 30.0


class Warmer:
    """Warms the replicas that join `balancer` after the first look (discovery's `on_update` calls `joined`)."""

    def __init__(
        self,
        mode: CachedPrefix,
        balancer: Balancer,
        engine: TritonEngine,
        token_for: Callable[[Replica], str | None],
        prefixes: int = WARM_PREFIXES,
    ) -> None:
        self.mode = mode
        self.balancer = balancer
        self.engine = engine
        self.token_for = token_for
        self.prefixes = prefixes
        self._seen: set[str] | None = None  # None: the first look (those replicas are the deployment, not joiners)
        self.tasks: set[asyncio.Task] = set()
        #: prefixes sent, per replica key (what a test waits for)
        self.warmed: dict[str, int] = {}

    def joined(self, ready: list[Replica]) -> None:
        """Discovery's latest view: each replica new since the last one is warmed while another takes requests."""
        keys = {r.key for r in ready}
        new, self._seen = ([] if self._seen is None else [r for r in ready if r.key not in self._seen]), keys
        texts = self.mode.hottest(self.prefixes)
        others = [r for r in self.balancer.available() if r.key not in {n.key for n in new}]
        if not new or not texts or not others:
            return
        for replica in new:
            self.balancer.counts.add(replica, warming=1)
            task = asyncio.create_task(self._warm(replica, texts))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _warm(self, replica: Replica, texts: list[str]) -> None:
        start = time.monotonic()
        sent = [0]

        async def send() -> None:
            for text in texts:
                params = GenerateParams(prompt=text, max_tokens=1)
                token = self.token_for(replica)
                chunks = self.engine.stream(
                    replica.grpc_url, params, token, replica.workflow, replica.decoupled, replica.llmapi_model
                )
                async for _ in chunks:
                    pass
                sent[0] += 1

        try:
            await asyncio.wait_for(send(), WARM_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a warm-up that failed leaves a replica cold, not out
            log.warning(
                "replica %s: warm-up stopped after %d of %d prefixes: %r", replica.key, sent[0], len(texts), exc
            )
        finally:
            self.balancer.counts.add(replica, warming=-1)
            self.warmed[replica.key] = sent[0]
        log.info("replica %s warmed with %d shared prefixes in %.2f s", replica.key, sent[0], time.monotonic() - start)
