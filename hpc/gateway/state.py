"""What every route shares: the deployment, its replicas, the engine, the tokenizer; and how a request goes to
a replica: `routed` runs the one retry rule (hpc/serving/retry.py, which the Python client runs too), `generate`
sends a generation over it.

Why the retry rule is not written here: the gateway and the client must balance and retry alike, and one
function cannot drift from itself. What is the gateway's own hangs on its hooks: the access log's replica and
retries (`on_pick`), the log line and the retries metric (`on_retry`), and the answers when no replica is left
(429 with Retry-After when those ready are full or refused the request, their queue full; 503 when none is).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from backend.models.tokenizer import RELEASE_GIL_CHARS
from hpc.gateway.accesslog import RequestRecord
from hpc.gateway.errors import no_replica, saturated
from hpc.gateway.metrics import Metrics
from hpc.jobs.autoscale import capacity
from hpc.serving.balancer import Balancer, HeldTooLong, NoReplica, Replica, Saturated
from hpc.serving.deployment import Target
from hpc.serving.discovery import Discovery
from hpc.serving.model_io import Chunk, GenerateParams
from hpc.serving.resume import continuation, resumable
from hpc.serving.retry import stream_with_retry, taken_whole
from hpc.serving.routing import PrefixChars, RoutingMode
from hpc.serving.text import ChatTemplate
from hpc.serving.triton import ReplicaBusy, ReplicaStopping, ReplicaUnavailable, TritonEngine, failed_internally
from hpc.spec.files import context_length
from hpc.spec.limits import PREFIX_CHARS

T = TypeVar("T")

#: how often a held request looks whether discovery found a replica (`Gateway._held`): a look at this process's
#: balancer, nothing sent
HOLD_POLL_S = 0.25

log = logging.getLogger("hpc_serve.gateway")
#: prompts whose token ids are kept (`Gateway.token_ids`): the requests in flight whose usage is yet to count;
#: only those up to TOKENIZED_KEPT_CHARS (a few MB at most in all: a longer one is encoded twice)
TOKENIZED_KEPT, TOKENIZED_KEPT_CHARS = 256, 16384


@dataclass
class Gateway:
    target: Target
    balancer: Balancer
    discovery: Discovery
    engine: TritonEngine
    http: httpx.AsyncClient
    tokenizer: Any  # backend.models.tokenizer.TextTokenizer
    chat_template: ChatTemplate
    prefix_chars: int = PREFIX_CHARS  # the prefix affinity key's length (0: no affinity), for `prefix` routing
    metrics: Metrics | None = None
    #: how a replica is chosen (hpc/serving/routing.py); None: `prefix` routing on `prefix_chars`
    routing: RoutingMode | None = None

    def __post_init__(self) -> None:
        if self.routing is None:
            self.routing = PrefixChars(self.prefix_chars)
        self._kept_ids: Callable[[str], tuple[int, ...]] = functools.lru_cache(maxsize=TOKENIZED_KEPT)(self._encode)

    @property
    def hold_s(self) -> float:
        """How long a request that finds no replica waits for one (the spec's `autoscale.hold_s`; 0: 503 at once).
        Set on the Target only where a controller runs (hpc/gateway/serve.py: a gateway job)."""
        return getattr(self.target, "hold_s", 0.0)  # a Gateway made in a test may have no Target

    def token_ids(self, prompt: str) -> tuple[int, ...]:
        """A prompt's token ids, kept for the last few prompts up to TOKENIZED_KEPT_CHARS: cache-aware routing
        matches them and the answer's usage counts them, so each is tokenized once (thread-safe: a long one is
        encoded on a thread)."""
        return self._kept_ids(prompt) if len(prompt) <= TOKENIZED_KEPT_CHARS else self._encode(prompt)

    def _encode(self, prompt: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(prompt, add_special_tokens=True))

    @property
    def model_name(self) -> str:
        """What `/v1/models` lists and requests must name: the spec's `name`."""
        return self.target.name

    @functools.cached_property
    def context_length(self) -> int | None:
        """The model's longest sequence (hpc/spec/files.py `context_length`), read at the first answer's end: by
        then a replica has served, so its engine or checkpoint exists (`model.init` makes one when the job starts)."""
        model = self.target.model
        return context_length(model, self.target.max_seq_len) if model is not None else None

    def new_tokens_allowed(self, max_tokens: int, prompt_tokens: int) -> int:
        """The most new tokens the engine makes for a prompt: `max_tokens` cut to the room the prompt leaves in
        the context, as TensorRT-LLM's executor cuts it (tensorrt_llm/executor/base_worker.py `_deduce_max_tokens`:
        "using default_max_tokens instead", a warning) and the CPU engine does too."""
        context = self.context_length
        return max_tokens if context is None else max(1, min(max_tokens, context - prompt_tokens))

    def prompt_tokens(self, prompt: str) -> int:
        """As preprocessing counts them: the deployment's tokenizer, special tokens included."""
        return len(self.token_ids(prompt))

    def completion_tokens(self, text: str) -> int:
        """A generation's tokens counted from its text, for a model that counts none (llmapi): the deployment's
        tokenizer, without special tokens (re-encoding the text gives the generated tokens' count but for
        the rare text a tokenizer encodes otherwise than it was generated)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def count_prompt(self, prompt: str) -> asyncio.Future[int]:
        """`prompt_tokens`, started now and awaited when the answer's usage is due. A long prompt is counted on a
        worker thread, where the tokenizer releases the GIL (backend/models/tokenizer.py): counted on the event
        loop, a prompt of 1.4 MB stalled every stream the gateway relayed for 1.5 s. A short one is counted here
        (a thread's hop would cost more than its count)."""
        if len(prompt) >= RELEASE_GIL_CHARS:
            return asyncio.ensure_future(asyncio.to_thread(self.prompt_tokens, prompt))
        counted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        counted.set_result(self.prompt_tokens(prompt))
        return counted

    def retried(self, replica: Replica, exc: BaseException) -> None:
        """The retry rule's `on_retry`: a log line and the retries metric (the rule benched the replica when it
        was unreachable or stopping, not when it refused the request, its queue full: `ReplicaBusy`)."""
        if isinstance(exc, ReplicaBusy | ReplicaStopping):
            reason, why = ("busy", "its queue full") if isinstance(exc, ReplicaBusy) else ("stopping", "it is stopping")
            log.info("replica %s refused a request, %s (%s); tried on another", replica.key, why, exc)
        elif failed_internally(exc):
            reason = "model_error"
            log.warning(
                "replica %s failed a request before its first byte (%s); tried once on another", replica.key, exc
            )
        else:
            reason = "unavailable"
            log.warning("replica %s failed before its first byte (%s); retried on another", replica.key, exc)
        if self.metrics is not None:
            self.metrics.retries.labels(reason).inc()

    def routed(
        self,
        attempt: Callable[[Replica], AsyncIterator[T]],
        prompt: str | None,
        record: RequestRecord,
        on_first: Callable[[], None] | None = None,
        exclude: tuple[str, ...] = (),
    ) -> AsyncGenerator[T, None]:
        """What `attempt(replica)` yields from the replica the balancer picks (prefix affinity on `prompt`), by
        the retry rule (`routing` scores the replicas for `prompt`): an attempt that raises ReplicaUnavailable or ReplicaBusy before its first item is sent to
        the next replica. `record` learns the replica and the replicas tried before it. Take the first item with
        `first` (the answers when no replica is left). Why the rule's own generator, not one around it: every
        streamed token passes through each generator layer, a few microseconds each."""

        retried = record.retried  # a continuation's picks add to those of the stream it continues

        def picked(replica: Replica, tried: int) -> None:
            record.replica, record.retried = replica.key, retried + tried

        mode = self.routing
        assert mode is not None  # __post_init__

        def stream() -> AsyncGenerator[T, None]:
            return stream_with_retry(
                self.balancer,
                attempt,
                ReplicaUnavailable,
                ReplicaBusy,
                mode.prefix_key(prompt),
                on_retry=self.retried,
                on_pick=picked,
                on_first=on_first,
                failed=failed_internally,
                route=mode.route(prompt),
                exclude=exclude,
            )

        # nothing serves: held while a job starts; not a continuation, whose client has waited for its text since
        # its replica failed (it ends with that failure instead: Gateway.resumed)
        if self.hold_s > 0 and not exclude and not self.balancer.takers():
            return self._held(stream)
        return stream()

    async def _held(self, stream: Callable[[], AsyncGenerator[T, None]]) -> AsyncGenerator[T, None]:
        """A request that found no replica under `autoscale:` (`hold_s`): the controller is told at once (it
        submits a job at its next look), and the request waits, up to `hold_s`, for discovery to find a replica
        READY; then it is routed as any other, else NoReplica (the 503, with Retry-After). A layer of its own
        only on this path: every streamed token passes through each generator layer."""
        self.balancer.nothing_serving()  # what the controller counts: it submits a job at its next look
        deadline = time.monotonic() + self.hold_s
        while not self.balancer.takers():
            if time.monotonic() >= deadline:
                raise HeldTooLong(f"no replica became ready within autoscale.hold_s {self.hold_s:g} s")
            await asyncio.sleep(HOLD_POLL_S)  # discovery's refresh adds it: the balancer is this process's
        async for item in stream():
            yield item

    async def first(self, items: AsyncIterator[T]) -> T | None:
        """The first item of a `routed` stream (None if it has none); APIError 429 with Retry-After when the
        replicas left are full or refused it, 503 when none is ready (only a pick, before the first item, finds
        none left)."""
        try:
            return await anext(items, None)
        except Saturated:
            raise saturated(self.balancer.max_outstanding) from None
        except HeldTooLong:  # Retry-After: when the controller expects its job to serve (its record, off the loop)
            raise no_replica(self.hold_s, await asyncio.to_thread(capacity, self.target)) from None
        except NoReplica:  # none ready, or every one tried failed: not held, no job on its way to promise
            raise no_replica() from None

    def generate(
        self,
        params: GenerateParams,
        record: RequestRecord | None = None,
        whole: bool = False,
        exclude: tuple[str, ...] = (),
    ) -> AsyncGenerator[Chunk, None]:
        """Text pieces from the replica the balancer picks, by `routed`'s rule (take the first with `first`);
        TokenRefused (the replica refused its job's token) and the model's errors are the caller's. `whole`: each
        replica's answer is taken whole before its first piece is yielded, for a request answered in one piece
        (not streamed): nothing of it reaches the client before the end, so a replica lost half-way is one more
        to retry on another, not a failed request. `exclude`: replicas not to pick (a continuation's, `resumed`)."""
        record = record if record is not None else RequestRecord("POST", "")
        token_for = self.discovery.token_for

        def attempt(replica: Replica) -> AsyncIterator[Chunk]:
            chunks = self.engine.stream(
                replica.grpc_url,
                params,
                token_for(replica),
                replica.workflow,
                replica.decoupled,
                replica.llmapi_model,
            )
            return taken_whole(chunks, record.first_token) if whole else chunks

        return self.routed(attempt, params.prompt, record, on_first=record.first_token, exclude=exclude)

    async def resumed(
        self, params: GenerateParams, sent: str, tokens: int | None, record: RequestRecord, exc: BaseException
    ) -> tuple[Chunk | None, AsyncGenerator[Chunk, None]] | None:
        """A stream whose replica failed it after its first piece (`exc`), continued on another replica by the rule
        of hpc/serving/resume.py: after the text `sent` so far (`tokens` made; None: the tokenizer counts `sent`).
        Returns the continuation's first piece and the rest, or None where it does not go on (not resumable, or no
        replica taking it): then `exc` is the caller's to report."""
        if not resumable(exc, record.resumed):
            return None
        made = tokens if tokens is not None else self.completion_tokens(sent)
        failed = record.replica
        record.resumed += 1
        if failed:
            record.failed_replicas += (failed,)
        log.warning(
            "replica %s failed a stream after %d token(s) (%s); it goes on on another replica", failed, made, exc
        )
        if self.metrics is not None:
            self.metrics.retries.labels("resumed").inc()
        more = continuation(params, sent, made)
        if more is None:  # it had made every token asked for: only its end was lost
            return Chunk("", 0, finish_reason="length"), _nothing()
        pieces = self.generate(more, record, exclude=record.failed_replicas)
        try:
            return await anext(pieces, None), pieces
        except Exception as again:  # noqa: BLE001 - none left, or it failed too: the first failure is the answer
            await pieces.aclose()
            log.warning("the stream failed on %s could not go on (%s)", failed, again)
            return None


async def _nothing() -> AsyncGenerator[Chunk, None]:
    """A stream with no more pieces."""
    return
    yield
