"""`AsyncClient`: text from a deployment, through its gateway when one answers, else straight from its replicas
with the gateway's own balancing: the longest cached prefix against load (hpc/serving/routing.py, on the prompts
this client sent to each replica), and a replica that fails before its first piece is benched and the request
retried on another.

Why the gateway first: it sees every client's requests, so its balancing (and prefix affinity) is better
informed than one client's, and it is the one address that outlives jobs. Why a fallback at all: a deployment
without a gateway (or with one that died) still serves, and its replicas' addresses are in the records. Why
look again every `refresh_s`: jobs, replicas and gateways come and go while a client lives (a notebook, a
service); one look per `refresh_s`, made by the request that finds it stale, costs nothing in between.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx

from hpc.client.discovery import job_replica, newest_token, resolve
from hpc.client.errors import AuthError, Busy, NotReady, RequestError, ServerError
from hpc.client.transport import GatewayUnavailable, Sampling, gateway_stream, generate_params
from hpc.compat import Self, Unpack, timeout
from hpc.scheduler.index import JobRef
from hpc.serving.balancer import Balancer, NoReplica, Replica, Saturated
from hpc.serving.deployment import Target, as_replica
from hpc.serving.discovery import Discovery
from hpc.serving.engine_timing import timestamps
from hpc.serving.gateway_record import live_gateway
from hpc.serving.model_io import Chunk, GenerateParams
from hpc.serving.resume import continuation, resumable
from hpc.serving.retry import stream_with_retry, taken_whole
from hpc.serving.routing import CachedPrefix
from hpc.serving.text import StopStream
from hpc.serving.triton import (
    ModelError,
    ReplicaBusy,
    ReplicaUnavailable,
    TokenRefused,
    TritonEngine,
    failed_internally,
)
from launcher.contracts.config import DISCOVERY_REFRESH_S
from launcher.contracts.records import EndpointRecord, GatewayRecord

log = logging.getLogger("hpc_serve.client")

DEFAULT_MAX_TOKENS = 64
DEFAULT_CONCURRENCY = 8

#: what a client can be made from: a deployment (spec file, job id or folder, deployment folder or name, a
#: JobRef or Target), or one replica (its endpoint record, or a Replica) for a client pinned to it
TargetLike = str | Path | JobRef | Target | EndpointRecord | Replica


class AsyncClient:
    """Generate text from a deployment, on the caller's event loop. Use as `async with AsyncClient(TARGET) as
    c:`, or call `aclose()`; everything loop-bound (HTTP and gRPC connections) is made on first use.

    `gateway`: None (default) uses the gateway when its record exists and it answers, False never, True only
    (NotReady without one). `token`: sent as `Authorization: Bearer` (HTTP) / `authorization` (gRPC metadata);
    default the deployment's own (`hpc-serve token`). `model`: None (default) sends to each replica's
    generation model (its endpoint record's workflow: `ensemble` on the engine workflow, `tensorrt_llm` on
    llmapi; hpc/serving/model_io.py), or `tensorrt_llm_bls` (the engine workflow's BLS model; replicas only)."""

    def __init__(
        self,
        target: TargetLike,
        *,
        model: str | None = None,
        token: str | None = None,
        gateway: bool | None = None,
        timeout_s: float = 300.0,
        refresh_s: float = DISCOVERY_REFRESH_S,
    ) -> None:
        self.model, self.timeout_s, self.refresh_s = model, timeout_s, refresh_s
        self._token = token
        self._balancer = Balancer()
        #: the gateway's default rule, the longest cached prefix against load, on the prompts this client sent
        #: to each replica (it follows no replica's KV-cache events: hpc/serving/routing.py)
        self._routing = CachedPrefix(follows_events=False)
        self.target: Target | None = None
        self._tokenizer: Any = None  # the deployment's, loaded to count a stream's tokens only where needed
        if isinstance(target, EndpointRecord | Replica):
            replica = as_replica(target) if isinstance(target, EndpointRecord) else target
            self._balancer.update([replica])  # pinned: no discovery, no gateway
            self._use_gateway: bool | None = False
        else:
            self.target = resolve(target)
            self._use_gateway = False if model is not None else gateway
        if gateway and not self._use_gateway:
            raise ValueError("gateway=True needs a deployment TARGET and no model (the gateway picks each replica's)")
        self._gateway_token: str | None = None
        self._gateway: GatewayRecord | None = None
        self._checked_at = self._skip_gateway_until = -float("inf")
        self._lock: asyncio.Lock | None = None
        self._http: httpx.AsyncClient | None = None
        self._engine: TritonEngine | None = None
        self._discovery: Discovery | None = None

    @classmethod
    def from_job(cls, job: str | JobRef, replica: int | None = None, **options) -> Self:
        """The job's deployment (its gateway, or every replica of its jobs); with `replica`, only that replica
        of this job."""
        if replica is None:
            return cls(job if isinstance(job, JobRef) else str(job), **options)
        pinned, token = job_replica(job, replica)
        options.setdefault("token", token)
        return cls(pinned, **options)

    # -- connections -------------------------------------------------------------------------------------------

    def _connections(self) -> tuple[httpx.AsyncClient, TritonEngine]:
        if self._http is None or self._engine is None:
            # trust_env=False: nodes are never behind the user's $http_proxy (launcher/contracts/urls.py)
            self._http = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(self.timeout_s, connect=10.0))
            self._engine = TritonEngine(self.model)  # its channels never go through $http_proxy
            self._lock = asyncio.Lock()
        return self._http, self._engine

    def _replica_token(self, replica: Replica) -> str | None:
        """What a replica's tritonserver is sent: the token given, else its job folder's (auth: token)."""
        if self._token or self._discovery is None:
            return self._token
        return self._discovery.token_for(replica)

    async def aclose(self) -> None:
        http, engine, self._http, self._engine, self._discovery = self._http, self._engine, None, None, None
        if engine is not None:
            await engine.close()
        if http is not None:
            await http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- where requests go -------------------------------------------------------------------------------------

    async def _route(self, force: bool = False) -> GatewayRecord | None:
        """The gateway to send to, or None: go to the replicas (the balancer holds the ready ones)."""
        http, engine = self._connections()
        assert self._lock is not None
        async with self._lock:
            if not force and time.monotonic() - self._checked_at < self.refresh_s:
                return self._gateway
            if self.target is not None:
                look = self._use_gateway is not False and time.monotonic() >= self._skip_gateway_until
                self._gateway = await asyncio.to_thread(live_gateway, self.target) if look else None
                if self._gateway is None and self._use_gateway is not True:
                    if self._discovery is None:

                        async def retain(ready: list[Replica]) -> None:
                            await engine.retain({r.grpc_url for r in ready})

                        self._discovery = Discovery(self.target, self._balancer, http, on_update=retain)
                    await self._discovery.refresh()
                else:
                    self._gateway_token = await asyncio.to_thread(newest_token, self.target)
            self._checked_at = time.monotonic()
            return self._gateway

    async def ready(self) -> bool:
        """True when a gateway answers or a replica is ready (looked at now)."""
        return await self._route(force=True) is not None or bool(self._balancer.takers())

    # -- generation --------------------------------------------------------------------------------------------

    async def _from_replicas(
        self, params: GenerateParams, whole: bool = False, timing: dict[str, int] | None = None
    ) -> AsyncGenerator[str, None]:
        """Text pieces from the replicas, balanced and retried by the gateway's rule. `whole` (an answer not
        streamed): each replica's answer is taken whole first, so one lost half-way is retried on another.
        `timing`: filled with the engine's timestamps when its last response has them (engine_timing.py)."""
        if not self._balancer.takers():
            await self._route(force=True)  # a job may have become ready since the last look
        if not self._balancer.takers():
            raise NotReady(self._not_ready())
        _, engine = self._connections()

        def attempt_of(asked: GenerateParams) -> Callable[[Replica], AsyncIterator[Chunk]]:
            def attempt(replica: Replica) -> AsyncIterator[Chunk]:
                chunks = engine.stream(
                    replica.grpc_url,
                    asked,
                    self._replica_token(replica),
                    replica.workflow,
                    replica.decoupled,
                    replica.llmapi_model,
                )
                return taken_whole(chunks) if whole else chunks

            return attempt

        def retried(replica: Replica, exc: BaseException) -> None:
            what = "refused (queue full)" if isinstance(exc, ReplicaBusy) else "failed before its first piece"
            log.warning("replica %s %s: %s; retried on another", replica.key, what, exc)

        started = False
        stops = StopStream(params.stop)  # cut as the gateway cuts: the same text either way
        asked, made, uncounted, sent, resumes, picked = params, 0, False, "", 0, [""]
        failed: tuple[str, ...] = ()
        lost: BaseException | None = None  # what failed the stream half-way, the answer if it cannot go on

        def on_pick(replica: Replica, _tried: int) -> None:
            picked[0] = replica.key

        try:
            while True:  # one attempt, and a continuation of it where its replica failed it half-way (resume.py)
                chunks_of = stream_with_retry(
                    self._balancer,
                    attempt_of(asked),
                    ReplicaUnavailable,
                    ReplicaBusy,
                    None,
                    retried,
                    on_pick=on_pick,
                    failed=failed_internally,
                    route=self._routing.route(asked.prompt),
                    exclude=failed,
                )
                came = False
                try:
                    async with aclosing(chunks_of) as chunks:
                        async for chunk in chunks:
                            came = True
                            if chunk.tokens is None:
                                uncounted = True
                            else:
                                made += chunk.tokens
                            sent += chunk.text
                            if timing is not None and (stamps := timestamps(chunk.perf)):
                                timing.update(stamps)
                            if text := stops.feed(chunk.text):
                                started = True
                                yield text
                            if stops.stopped:
                                return
                    break
                except (ModelError, ReplicaUnavailable, NoReplica, Saturated) as exc:
                    if lost is not None and not came:  # the continuation found no replica, or failed at once
                        raise lost from None
                    if not came or whole or self.target is None or not resumable(exc, resumes):
                        raise
                    counted = await self._tokens_of(sent) if uncounted else made
                    if counted is None:
                        raise
                    more = continuation(params, sent, counted)
                    log.warning("replica %s failed the stream half-way: %s; it goes on on another", picked[0], exc)
                    if more is None:  # every token asked for was made: only its end was lost
                        break
                    asked, resumes, failed, lost = more, resumes + 1, (*failed, picked[0]), exc
            if rest := stops.flush():
                yield rest
        except Saturated as exc:
            raise Busy(f"every ready replica is busy: {exc}; try again later") from None
        except NoReplica:
            raise NotReady(f"every ready replica failed this request before its first piece; {self._hint()}") from None
        except TokenRefused as exc:  # the replica is fine, the token is not: not retried, not benched
            raise AuthError(
                f"a replica refused the access token: {exc}; `hpc-serve token TARGET` prints it", 401
            ) from None
        except ModelError as exc:
            if started:
                raise ServerError(f"{self.model or 'the model'}: {exc}") from None
            raise RequestError(f"{self.model or 'the model'}: {exc}") from None
        except ReplicaUnavailable as exc:
            raise ServerError(f"the replica broke off the stream: {exc}") from None

    async def _tokens_of(self, text: str) -> int | None:
        """The tokens of a generation's `text` by the deployment's tokenizer, for a model that counts none (llmapi);
        loaded at the first need (a stream to continue), None where it cannot be."""
        if self._tokenizer is None and self.target is not None:
            from backend.models.tokenizer import load_tokenizer

            try:
                self._tokenizer = await asyncio.to_thread(load_tokenizer, self.target.tokenizer_dir)
            except Exception as exc:  # noqa: BLE001 - no tokenizer: the stream is not continued, its error stands
                log.warning("the deployment's tokenizer could not be loaded: %s", exc)
                return None
        return len(self._tokenizer.encode(text, add_special_tokens=False)) if self._tokenizer is not None else None

    def _hint(self) -> str:
        return f"see `hpc-serve status`{f' for {self.target.name}' if self.target else ''}"

    def _not_ready(self) -> str:
        if self.target is None:
            return f"the replica is not ready; {self._hint()}"
        where = f"no gateway answers and no replica of {self.target.name} in {self.target.workdir} is ready"
        return f"{where}; {self._hint()}"

    async def _pieces(
        self, params: GenerateParams, stream: bool, timing: dict[str, int] | None = None
    ) -> AsyncGenerator[str, None]:
        gateway = await self._route()
        if gateway is not None:
            http, _ = self._connections()
            assert self.target is not None
            try:
                async with aclosing(
                    gateway_stream(
                        http, gateway.url, self.target.name, params, self._token or self._gateway_token, stream, timing
                    )
                ) as pieces:
                    async for piece in pieces:
                        yield piece
                return
            except GatewayUnavailable as exc:
                if self._use_gateway:
                    raise NotReady(f"the gateway does not answer: {exc}") from None
                log.warning("gateway %s failed before its first piece (%s); going to the replicas", gateway.url, exc)
                self._skip_gateway_until = time.monotonic() + self.refresh_s
                await self._route(force=True)
        elif self._use_gateway:
            raise NotReady(f"no gateway of {self.target.name if self.target else '?'} answers; `hpc-serve status`")
        async with aclosing(self._from_replicas(params, whole=not stream, timing=timing)) as pieces:
            async for piece in pieces:
                yield piece

    async def _timed(
        self, params: GenerateParams, stream: bool, timing: dict[str, int] | None = None
    ) -> AsyncGenerator[str, None]:
        """`_pieces`, each within `timeout_s` of the one before (a replica that hangs must not hang the caller:
        the gRPC stream has no deadline of its own)."""
        async with aclosing(self._pieces(params, stream, timing)) as pieces:
            while True:
                try:
                    async with timeout(self.timeout_s):
                        piece = await anext(pieces)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise ServerError(f"no text came for {self.timeout_s:g} s (timeout_s)") from None
                yield piece

    async def stream(
        self,
        prompt: str,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timing: dict[str, int] | None = None,
        **sampling: Unpack[Sampling],
    ) -> AsyncGenerator[str, None]:
        """Text pieces as they are generated. `timing`, when given, is filled with the engine's timestamps of the
        request once its last piece came, where the engine reports them (the llmapi workflow; engine_timing.py)."""
        params = generate_params(prompt, max_tokens, sampling)
        async with aclosing(self._timed(params, stream=True, timing=timing)) as pieces:
            async for piece in pieces:
                yield piece

    async def generate(self, prompt: str, max_tokens: int = DEFAULT_MAX_TOKENS, **sampling: Unpack[Sampling]) -> str:
        """The whole completion (without the prompt, and cut before a `stop` sequence)."""
        params = generate_params(prompt, max_tokens, sampling)
        async with aclosing(self._timed(params, stream=False)) as pieces:
            return "".join([piece async for piece in pieces])

    async def generate_batch(
        self,
        prompts: Sequence[str],
        max_tokens: int = DEFAULT_MAX_TOKENS,
        concurrency: int = DEFAULT_CONCURRENCY,
        **sampling: Unpack[Sampling],
    ) -> list[str]:
        """Completions of `prompts`, in their order, at most `concurrency` in flight (the first error ends the
        batch and is raised)."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        gate = asyncio.Semaphore(concurrency)

        async def one(prompt: str) -> str:
            async with gate:
                return await self.generate(prompt, max_tokens, **sampling)

        tasks = [asyncio.ensure_future(one(p)) for p in prompts]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:  # the first error (or a cancel) ends the others too
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
