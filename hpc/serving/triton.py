"""The thin engine interface: one generation request streamed to a replica's model over Triton's gRPC
bidirectional streaming API (tritonclient's asyncio client), yielding text pieces.

Why always the streaming API, even for a non-streaming OpenAI request: the deployments serve a decoupled
model (one request, many responses: the ensemble, or the llmapi `tensorrt_llm`; hpc/serving/model_io.py), which only the streaming RPC can call, and one code path means one
set of failure modes. Why not a thread per request (tritonclient's sync stream): the gateway holds hundreds
of requests open; one event loop does. The request id has hpc-serve's stream prefix
(backend/models/detokenize.py) so the ensemble's postprocessing never splits a character across responses.

tritonclient's asyncio `stream_infer` refuses the reserved `triton_enable_empty_final_response` parameter,
without which the end of a decoupled response stream cannot be told; so the request is built with
tritonclient's own builder and sent on the client's stub (`_client_stub`), the one private name used here.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc
from tritonclient.utils import InferenceServerException

from hpc.serving.abandon import Reader, abandon, stop_generation, stream_request
from hpc.serving.auth import grpc_headers
from hpc.serving.idle import run_deferred
from hpc.serving.model_io import Chunk, GenerateParams, ModelIO, NotTaken, model_io
from launcher.contracts.llmapi import ENGINE
from launcher.contracts.model_names import STREAM_REQUEST_PREFIX
from launcher.contracts.refusals import BUSY_MARKERS, CONTEXT_MARKERS, STOPPING_MARKERS

#: how long a finished stream is given to end by itself before it is cancelled (see `_end`)
STREAM_END_S = 2.0
#: how long the token check after a stream's lost status may take (`TritonEngine._refuses`)
PROBE_TIMEOUT_S = 5.0


class ReplicaUnavailable(RuntimeError):
    """The replica could not be reached or broke the stream: retry elsewhere if nothing was sent yet."""


class TokenRefused(RuntimeError):
    """The replica refused the access token sent with the request (missing or not its job's): the replica is
    fine, so it is neither benched nor is the request tried elsewhere; the caller's answer names the token."""


#: how tritonserver refuses a gRPC call without the restricted protocol's header (status UNAVAILABLE), lower case
RESTRICTED_MARKER = "protocol is restricted"


def is_auth_refusal(exc: BaseException) -> bool:
    """tritonserver's "This protocol is restricted" answer: the token is missing or wrong, the replica is fine
    (it answers UNAVAILABLE, as an unreachable replica would)."""
    return RESTRICTED_MARKER in str(exc).lower()


#: what grpc's asyncio client reads instead of the server's status when the server ended a bidirectional call
#: while the client was still sending on it (grpc's `set_internal_error`)
LOST_STATUS = "Internal error from Core"


def lost_status(exc: grpc.aio.AioRpcError) -> bool:
    """Whether the call's real status was lost (see `LOST_STATUS`). tritonserver refuses a call without the right
    token as soon as it reads the call's headers, so a refused stream often ends this way (docs/decisions.md
    "Access control through a preloaded shim")."""
    return exc.code() == grpc.StatusCode.INTERNAL and exc.details() == LOST_STATUS


class ModelError(RuntimeError):
    """The model refused or failed the request (its own words): the client's answer. A plain one (not busy, the
    context, an input) before the first byte is tried once more on another replica (`failed_internally`)."""


def failed_internally(exc: BaseException) -> bool:
    """A model's failure that another replica may not share: a plain ModelError (a 500), not a refusal of what the
    request asked. An engine whose own process died fails what its model takes until the launcher ends the
    replica (measured: docs/decisions.md "Replica restarts")."""
    return type(exc) is ModelError


class ReplicaBusy(ModelError):
    """The replica refused the request because its queue is full (Triton's "Exceeds maximum queue size",
    TensorRT-LLM's "Maximum queue size ... reached"): another replica may take it; it is not a failure."""


class ContextTooLong(ModelError):
    """The model refused the request because its prompt leaves no room in the model's context (more new tokens than
    fit are cut, not refused): the client's to fix, an OpenAI 400 `context_length_exceeded`."""


class InputRefused(ModelError):
    """The replica's model takes no input for a parameter the request set (model_io.NotTaken): the client's to
    change, a 400 naming `param`; nothing was sent."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class ReplicaStopping(ReplicaUnavailable):
    """The replica refused the request because it is stopping (its engine drains, or tritonserver unloads its
    models): nothing was generated, so the request goes to another replica, as for one unreachable."""


def model_error(message: str) -> ModelError | ReplicaStopping:
    """The error for a refusal in the stream: ReplicaBusy for a full queue, ReplicaStopping for a replica whose
    stop has begun, ContextTooLong for a request longer than the model's context (launcher/contracts/refusals.py),
    ModelError otherwise."""
    lowered = message.lower()
    if any(m in lowered for m in BUSY_MARKERS):
        return ReplicaBusy(message)
    if any(m in lowered for m in STOPPING_MARKERS):
        return ReplicaStopping(message)
    return (ContextTooLong if any(m in lowered for m in CONTEXT_MARKERS) else ModelError)(message)


_KEEPALIVE = grpcclient.KeepAliveOptions()
#: tritonclient's own channel defaults, and no proxy: gRPC, like urllib, sends a channel through `$http_proxy`
#: (or `$grpc_proxy`) unless told not to, and replicas are cluster nodes a user's proxy cannot reach
#: (launcher/contracts/urls.py)
CHANNEL_ARGS: tuple[tuple[str, int], ...] = (
    ("grpc.enable_http_proxy", 0),
    ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
    ("grpc.keepalive_time_ms", _KEEPALIVE.keepalive_time_ms),
    ("grpc.keepalive_timeout_ms", _KEEPALIVE.keepalive_timeout_ms),
    ("grpc.keepalive_permit_without_calls", _KEEPALIVE.keepalive_permit_without_calls),
    ("grpc.http2.max_pings_without_data", _KEEPALIVE.http2_max_pings_without_data),
)


class TritonEngine:
    """One asyncio gRPC client per replica, reused across requests (a channel is costly to open), on channels
    made with `channel_args` (default: never through a proxy)."""

    def __init__(self, model: str | None = None, channel_args: Sequence[tuple[str, Any]] = CHANNEL_ARGS) -> None:
        self.model = model  # None: each replica's generation model (its workflow's); else this one (the BLS model)
        self.channel_args = list(channel_args)
        self._clients: dict[str, aiogrpc.InferenceServerClient] = {}
        self._in_flight: dict[str, int] = {}

    def _client(self, grpc_url: str) -> aiogrpc.InferenceServerClient:
        if grpc_url not in self._clients:
            self._clients[grpc_url] = aiogrpc.InferenceServerClient(grpc_url, channel_args=self.channel_args)
        return self._clients[grpc_url]

    async def retain(self, grpc_urls: set[str]) -> None:
        """Close the channels of replicas discovery no longer lists (a long-lived gateway sees many jobs come
        and go); one with a stream still open is closed at a later call."""
        for url in [u for u in self._clients if u not in grpc_urls and not self._in_flight.get(u)]:
            await self._clients.pop(url).close()

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    def _io(self, workflow: str, decoupled: bool, llmapi_model: str = "") -> tuple[ModelIO, str]:
        """The workflow's model IO (hpc/serving/model_io.py) and the model to send to."""
        io = model_io(workflow, decoupled, llmapi_model)
        return io, self.model or io.model

    async def stream(
        self,
        grpc_url: str,
        params: GenerateParams,
        token: str | None = None,
        workflow: str = ENGINE,
        decoupled: bool = True,
        llmapi_model: str = "",
    ) -> AsyncIterator[Chunk]:
        """Text pieces as the replica (serving `workflow`'s model, `decoupled` or not) produces them, with their
        token counts: one piece, the whole text, from a model that is not decoupled. ReplicaUnavailable for
        transport trouble, TokenRefused for a missing or wrong token, ModelError for the model's own refusal."""
        io, model = self._io(workflow, decoupled, llmapi_model)
        request_id = f"{STREAM_REQUEST_PREFIX}{uuid.uuid4()}"
        try:
            tensors = io.tensors(params)
        except NotTaken as exc:
            raise InputRefused(str(exc), exc.param) from None
        request = stream_request(model, tensors, request_id)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        finished = asyncio.Event()

        async def requests():
            yield request
            run_deferred()  # the request was written: what could wait for that runs while the replica works
            await finished.wait()  # half-close only once the last response arrived

        decoder = io.decoder(params)
        metadata = tuple(grpc_headers(token).items())  # the replica's access token (auth: token)
        client = self._client(grpc_url)
        call = client._client_stub.ModelStreamInfer(requests(), metadata=metadata)
        # read on a task of its own: a client gone does not cancel the call (hpc/serving/abandon.py)
        reader = Reader(call, call.cancel)
        self._in_flight[grpc_url] = self._in_flight.get(grpc_url, 0) + 1
        ended = False
        try:
            while (response := await reader.next()) is not None:
                # the responses that came meanwhile go out with it, as one chunk (`_taken`)
                responses, ended, refusal = _taken(response, reader.ready())
                if responses:
                    if len(responses) == 1:
                        chunk = decoder.feed(responses[0].infer_response, ended)
                    else:
                        chunk = decoder.feed_many([r.infer_response for r in responses], ended)
                    if chunk is not None:
                        yield chunk
                if refusal is not None:
                    raise model_error(refusal)
                if ended:
                    return
            raise ReplicaUnavailable(f"{grpc_url}: the stream ended before the final response")
        except grpc.aio.AioRpcError as exc:
            refused = is_auth_refusal(exc) or (lost_status(exc) and await self._refuses(client, model, metadata))
            error = TokenRefused if refused else ReplicaUnavailable
            raise error(f"{grpc_url}: {exc.code().name}: {exc.details()}") from None
        finally:
            self._in_flight[grpc_url] -= 1
            finished.set()  # half-close: the server ends the stream once its last response is out
            if ended:
                await _end(call, ended)
            else:  # left mid-way: stop the generation by its id, never cancel the call (tritonserver would leak it)
                stop = functools.partial(stop_generation, client, request_id, metadata, io.stop_tensors())
                abandon(reader, stop)

    async def stop(self, grpc_url: str, request_id: str, token: str | None = None, workflow: str = ENGINE) -> None:
        """Stop the generation of `request_id` on the replica at `grpc_url` (hpc/serving/abandon.py: a stream
        whose client left is ended so, never cut off: the Triton passthrough's too)."""
        inputs = model_io(workflow).stop_tensors()
        await stop_generation(self._client(grpc_url), request_id, tuple(grpc_headers(token).items()), inputs)

    async def _refuses(
        self, client: aiogrpc.InferenceServerClient, model: str, metadata: tuple[tuple[str, str], ...]
    ) -> bool:
        """Whether the replica refuses `metadata`'s token, asked with a one-message call (the model's config, a
        restricted API) that cannot lose its status the way a stream does: a stream that ended with its status
        lost (`lost_status`) is told apart from a replica in trouble before it is benched for it."""
        try:
            await client.get_model_config(model, headers=dict(metadata), client_timeout=PROBE_TIMEOUT_S)
        except InferenceServerException as exc:
            return is_auth_refusal(exc)
        return False


def _taken(first: Any, more: Sequence[Any]) -> tuple[list[Any], bool, str | None]:
    """Responses read together (`first`, then those already waiting): those to relay (up to the final one, or
    to a refusal), whether the final one is among them, and the refusal's words. Why together: when the gateway
    falls behind its replicas (several streams' tokens come in one step of each), one SSE event and one socket
    write per stream and wake-up, not per token, is what lets it catch up (docs/decisions.md "The gateway's cost
    per relayed token"); the OpenAI stream contract lets a chunk carry several tokens' text."""
    out: list[Any] = []
    for response in (first, *more):
        if response.error_message:
            return out, False, response.error_message
        out.append(response)
        final = response.infer_response.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            return out, True, None
    return out, False, None


async def _end(call: Any, ended: bool) -> None:
    """A stream whose final response came is let end by the server (half-closed, then awaited briefly); only one
    left mid-way (the client went away) is cancelled. Why: tritonserver (2.51) keeps a reference to the ensemble
    of a stream cancelled right after its final response, so its ordered stop later waits for that model to
    unload until the exit timeout and exits 1 (a renewed job's predecessor would end FAILED, not COMPLETED)."""
    if ended:
        try:
            await asyncio.wait_for(call.code(), STREAM_END_S)
            return
        except (asyncio.TimeoutError, grpc.aio.AioRpcError):
            pass
    call.cancel()
