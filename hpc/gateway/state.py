"""What every route shares: the deployment, its replicas, the engine, the tokenizer; and the one routine that
sends a generation to a replica, retrying on another when the chosen one fails before its first piece.

Why the retry lives here and nowhere else: only before the first piece reached the client can a request be
sent again without the client seeing text twice; after that a failure is the client's to see. A replica that
refuses a request because its queue is full is asked no more for this request but not benched (it is healthy,
only busy); when every replica left is full or refused, the client gets 429 with Retry-After, not 503.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from hpc.gateway.accesslog import RequestRecord
from hpc.gateway.discovery import Discovery
from hpc.gateway.errors import no_replica, saturated
from hpc.gateway.metrics import Metrics
from hpc.gateway.text import ChatTemplate
from hpc.gateway.triton import Chunk, GenerateParams, ReplicaBusy, ReplicaUnavailable, TritonEngine
from hpc.routing.balancer import PREFIX_CHARS, Balancer, NoReplica, Replica, Saturated, prefix_key
from hpc.routing.deployment import Target

log = logging.getLogger("hpc_serve.gateway")


@dataclass
class Gateway:
    target: Target
    balancer: Balancer
    discovery: Discovery
    engine: TritonEngine
    http: httpx.AsyncClient
    tokenizer: Any  # backend.models.tokenizer.TextTokenizer
    chat_template: ChatTemplate
    prefix_chars: int = PREFIX_CHARS  # the prefix affinity key's length (0: no affinity)
    metrics: Metrics | None = None

    @property
    def model_name(self) -> str:
        """What `/v1/models` lists and requests must name: the spec's `name`."""
        return self.target.name

    def prompt_tokens(self, prompt: str) -> int:
        """As preprocessing counts them: the deployment's tokenizer, special tokens included."""
        return len(self.tokenizer.encode(prompt, add_special_tokens=True))

    def pick(self, tried: list[str], prompt: str | None = None, busy: bool = False) -> Replica:
        """The replica for a request (prefix affinity on `prompt`), added to `tried`. APIError 429 when the
        replicas left are full or `busy` (one refused it, its queue full) and none is left; 503 when none is."""
        key = prefix_key(prompt, self.prefix_chars) if prompt is not None else None
        try:
            replica = self.balancer.pick(exclude=tried, prefix_key=key)
        except Saturated:
            raise saturated(self.balancer.max_outstanding) from None
        except NoReplica:
            raise (saturated(None) if busy else no_replica()) from None
        tried.append(replica.key)
        return replica

    def retried(self, replica: Replica, reason: str, exc: BaseException) -> None:
        """Bookkeeping of a request sent again: `unavailable` benches the replica, `busy` does not."""
        if reason == "busy":
            self.balancer.mark_refused(replica)
            log.info("replica %s refused a request, its queue full (%s); tried on another", replica.key, exc)
        else:
            self.balancer.mark_failed(replica)
            log.warning("replica %s failed before its first byte (%s); retried on another", replica.key, exc)
        if self.metrics is not None:
            self.metrics.retries.labels(reason).inc()

    async def generate(self, params: GenerateParams, record: RequestRecord | None = None) -> AsyncIterator[Chunk]:
        """Text pieces from the replica the balancer picks; one unreachable before its first piece is benched,
        one that refused the request (queue full) is not, and the request goes to the next one (APIError 503
        when none is left, 429 when those left are full)."""
        record = record if record is not None else RequestRecord("POST", "")
        tried: list[str] = []
        busy = False
        while True:
            replica = self.pick(tried, params.prompt, busy)
            record.replica, record.retried = replica.key, len(tried) - 1
            started = False
            with self.balancer.track(replica):
                try:
                    async for chunk in self.engine.stream(replica.grpc_url, params, self.discovery.token_for(replica)):
                        if not started:
                            record.first_token()
                        started = True
                        yield chunk
                    return
                except ReplicaBusy as exc:
                    if started:
                        raise
                    busy = True
                    self.retried(replica, "busy", exc)
                except ReplicaUnavailable as exc:
                    if started:
                        raise
                    self.retried(replica, "unavailable", exc)
