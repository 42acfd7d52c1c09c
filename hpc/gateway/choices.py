"""What an OpenAI answer is made of, whatever route and however many choices (hpc/gateway/openai_api.py for one,
hpc/gateway/fanout.py for several): a generation's tally (its text, tokens and finish), the usage and finish
reason OpenAI's way, the HTTP error for what went wrong before an answer started, and the SSE events.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hpc.gateway.accesslog import RequestRecord
from hpc.gateway.answers import ChatCompletionChunk, CompletionChunk
from hpc.gateway.errors import APIError
from hpc.gateway.state import Gateway
from hpc.serving.model_io import Chunk, GenerateParams
from hpc.serving.triton import ContextTooLong, InputRefused, ModelError, ReplicaUnavailable, TokenRefused

#: the response header naming the replica that answered (several, comma-separated, for an answer of several
#: choices spread over replicas): which job served a request, for the user chasing a bad answer
REPLICA_HEADER = "x-hpc-serve-replica"


def replica_header(replicas: Sequence[str | None]) -> dict[str, str]:
    """REPLICA_HEADER for an answer made by `replicas` (each choice's, in order; a repeat is named once)."""
    return {REPLICA_HEADER: ",".join(dict.fromkeys(r for r in replicas if r))}


#: a replica refused the token the gateway sent it: its deployment folder's `access_token` file (hpc/serving/auth.py), which
#: is not what its tritonserver read at start (the file was replaced since, or the job is not auth: token's)
TOKEN_REFUSED = (
    "replica {replica} refused the access token the gateway sent it, its deployment folder's `access_token` "
    "({error}); was that file replaced after the job started? `hpc-serve token JOB` prints it"
)


class Tally:
    """A generation's completion tokens and finish, as its chunks tell them: counted by the engine (the ensemble:
    a response per token), or, when the model counts none (llmapi, hpc/serving/model_io.py), `max_tokens` cut to
    the room the prompt left (`Gateway.new_tokens_allowed`) for a generation the model says ended at its length,
    else the deployment's tokenizer's count of its text (a random-weight model's text may encode to other tokens
    than it was made of; a trained model's rarely does); and the finish the model gave, if it gave one."""

    def __init__(self) -> None:
        self.tokens, self.uncounted = 0, False
        self.pieces: list[str] = []
        self.finish: str | None = None
        self.perf: Mapping[str, float] | None = None

    def add(self, chunk: Chunk) -> None:
        if chunk.tokens is None:
            self.uncounted = True
        else:
            self.tokens += chunk.tokens
        self.pieces.append(chunk.text)
        self.finish = chunk.finish_reason or self.finish
        self.perf = chunk.perf or self.perf

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def completion_tokens(self, gw: Gateway, max_tokens: int, prompt_tokens: int) -> int:
        if not self.uncounted:
            return self.tokens
        if self.finish == "length":
            return gw.new_tokens_allowed(max_tokens, prompt_tokens)
        return gw.completion_tokens(self.text)


def usage_of(prompt: int, completion: int, record: RequestRecord) -> dict[str, int]:
    """Prompt tokens by the deployment's tokenizer (`Gateway.count_prompt`); completion tokens as the engine
    reported them, or the tokenizer counts them (`Tally`)."""
    record.prompt_tokens, record.completion_tokens = prompt, completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_of(
    stopped: bool, usage: dict[str, int], params: GenerateParams, context: int | None, said: str | None
) -> str:
    """OpenAI's "length" for a generation that ended at `max_tokens` or at the model's context (the engine cuts
    `max_tokens` to the room the prompt leaves, hpc/spec/files.py `context_length`), "stop" for one that ended
    at a stop word or the model's end token. The llmapi model says which (`said`); the ensemble does not: its
    counts do."""
    if stopped:
        return "stop"
    if said is not None:
        return said
    full = context is not None and usage["total_tokens"] >= context
    return "length" if usage["completion_tokens"] >= params.max_tokens or full else "stop"


def answer_error(exc: ModelError | ReplicaUnavailable | TokenRefused, chat: bool, record: RequestRecord) -> APIError:
    """The HTTP error for a generation that failed before its answer started: a prompt too long is the client's
    400, the model's refusal a 500, a replica lost or refusing the gateway's token a 502 (neither retried here:
    the retry rule has run)."""
    if isinstance(exc, ContextTooLong):
        field = "messages" if chat else "prompt"
        return APIError(400, f"{field}: {exc}", "invalid_request_error", field, "context_length_exceeded")
    if isinstance(exc, InputRefused):
        return APIError(400, str(exc), "invalid_request_error", exc.param, "unsupported_parameter")
    if isinstance(exc, ModelError):
        return APIError(500, f"the model failed the request: {exc}", "server_error")
    if isinstance(exc, ReplicaUnavailable):
        return APIError(502, f"the replica failed: {exc}", "server_error")
    # the gateway's token for this replica, not the client's: no retry, no bench
    return APIError(502, TOKEN_REFUSED.format(replica=record.replica, error=exc), "server_error")


DONE = b"data: [DONE]\n\n"


class Events:
    """One stream's SSE events, as bytes: chunks of the route's model (hpc/gateway/answers.py `CompletionChunk`,
    `ChatCompletionChunk`), made as dictionaries and encoded by `json.dumps`, not by pydantic: a stream is an event
    per token, and a model per event cost 3 to 6 times the event (docs/decisions.md); tests/test_gateway_answers.py
    checks every kind of event against its model, key for key. Why pre-encoded: only a piece's text changes; the
    envelope (id, object, created, model) and the choice around the text are encoded once, so a text piece costs
    one `json.dumps` of its text, and Starlette sends bytes as they are. The JSON is `json.dumps` of the whole
    event."""

    def __init__(self, rid: str, created: int, model: str, chat: bool) -> None:
        self.chat = chat
        kind = (ChatCompletionChunk if chat else CompletionChunk).model_fields["object"].default
        envelope = json.dumps({"id": rid, "object": kind, "created": created, "model": model})
        self._head = f'data: {envelope[:-1]}, "choices": '.encode()
        self._piece = self._head + (b'[{"index": 0, "delta": {"content": ' if chat else b'[{"index": 0, "text": ')
        self._tail = (b"}, " if chat else b", ") + b'"finish_reason": null, "logprobs": null}]}\n\n'

    def choice(
        self, index: int, text: str | None, finish: str | None = None, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A choice of an event: text (None: the finish's, which adds none), its finish, its log probabilities."""
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}

    @staticmethod
    def opening(index: int) -> dict[str, Any]:
        """A chat stream's first choice of `index`: the role, no text, and no `logprobs` key."""
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}

    def piece(self, text: str) -> bytes:
        """The event of a text piece without log probabilities (the common one)."""
        return self._piece + json.dumps(text).encode() + self._tail

    def event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        """The event of `choices` (`choice`, `opening`); `extra`: the chunk's other keys (`usage`, the timing's)."""
        fields = "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in extra.items())
        return self._head + f"{json.dumps(choices)}{fields}}}\n\n".encode()
