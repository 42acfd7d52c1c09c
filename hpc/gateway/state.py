"""What every route shares: the deployment, its replicas, the engine, the tokenizer; and the one routine that
sends a generation to a replica, retrying on another when the chosen one fails before its first piece.

Why the retry lives here and nowhere else: only before the first piece reached the client can a request be
sent again without the client seeing text twice; after that a failure is the client's to see.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from hpc.gateway.discovery import Discovery
from hpc.gateway.errors import no_replica
from hpc.gateway.text import ChatTemplate
from hpc.gateway.triton import Chunk, GenerateParams, ReplicaUnavailable, TritonEngine
from hpc.routing.balancer import Balancer, NoReplica, Replica
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

    @property
    def model_name(self) -> str:
        """What `/v1/models` lists and requests must name: the spec's `name`."""
        return self.target.name

    def prompt_tokens(self, prompt: str) -> int:
        """As preprocessing counts them: the deployment's tokenizer, special tokens included."""
        return len(self.tokenizer.encode(prompt, add_special_tokens=True))

    def pick(self, tried: list[str]) -> Replica:
        try:
            replica = self.balancer.pick(exclude=tried)
        except NoReplica:
            raise no_replica() from None
        tried.append(replica.key)
        return replica

    async def generate(self, params: GenerateParams) -> AsyncIterator[Chunk]:
        """Text pieces from the least busy replica; a replica unreachable before its first piece is benched and
        the request goes to the next one (APIError 503 when none is left)."""
        tried: list[str] = []
        while True:
            replica = self.pick(tried)
            started = False
            with self.balancer.track(replica):
                try:
                    async for chunk in self.engine.stream(replica.grpc_url, params):
                        started = True
                        yield chunk
                    return
                except ReplicaUnavailable as exc:
                    if started:
                        raise
                    self.balancer.mark_failed(replica)
                    log.warning("replica %s failed before its first byte (%s); retried on another", replica.key, exc)
