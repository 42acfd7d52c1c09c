"""The answers of the OpenAI routes as pydantic models: `/v1/models`, a completion and a chat completion (whole and
as stream chunks, with their choices, usage and log probabilities), and the error body.

Why: the routes declare them, so `/openapi.json` describes answers as well as requests, and whole answers,
`/v1/models` and errors are made by them on both paths (the fast path runs the same route functions). A stream's
events, one a token, are not (hpc/gateway/choices.py `Events`; docs/decisions.md has the cost): the tests hold
each kind to its model. Names, types and order are OpenAI's as the gateway has always sent them, with its own
key, the engine's timestamps (hpc/serving/engine_timing.py).

Present or absent: OpenAI's shapes tell a null key from a missing one (a chat stream's opening event has no
`logprobs`, a delta no `role` after the first). The rule: a field whose default is None is sent only when given;
every other is always sent, null or not.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic.json_schema import JsonSchemaValue

from hpc.serving.engine_timing import TIMING_FIELD

#: a choice's finish reason: OpenAI's "stop" or "length" (what the engine said, if it said so)
FinishReason = str
#: the engine's timestamps (hpc/serving/engine_timing.py TIMESTAMPS → ns since the epoch)
EngineTiming = dict[str, int]


class Answer(BaseModel):
    """An answer or a part of one; `wire()` is what is sent. Its schema (`/openapi.json`) lists a field with a
    default as required, as it is always sent (`object`), but those `Sparse` leaves out."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    def wire(self) -> dict[str, Any]:
        """The answer as JSON's Python values, its keys as sent (by alias, the absent ones left out)."""
        return self.model_dump(by_alias=True)


class Sparse(Answer):
    """An answer with keys sent only when given (its fields whose default is None; module docstring). Why not
    `exclude_unset` at each dump: FastAPI's own serialization of a `response_model` would not know it."""

    #: (field name, key) of the fields left out unless given
    _OMITTED: ClassVar[tuple[tuple[str, str], ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._OMITTED = tuple(
            (name, field.alias or name)
            for name, field in cls.model_fields.items()
            if not field.is_required() and field.default is None
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler.resolve_ref_schema(handler(core_schema))
        omitted = {key for _, key in cls._OMITTED}
        required = [key for key in schema.pop("required", []) if key not in omitted]
        if required:
            schema["required"] = required
        return schema

    @model_serializer(mode="wrap")
    def _given(self, handler: SerializerFunctionWrapHandler):  # no return type: the schema stays the model's
        out = handler(self)
        given = self.model_fields_set
        for name, key in self._OMITTED:
            if name not in given:
                out.pop(key, None)
        return out


class ModelCard(Answer):
    """One model of `GET /v1/models`."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(Answer):
    """`GET /v1/models`: the deployment's one model."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class Usage(Answer):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(Answer):
    """`/v1/completions` `choices[].logprobs` (hpc/gateway/logprobs.py)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(Answer):
    """One of a token's most likely alternatives (none are returned here: the model gives the chosen tokens')."""

    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(Answer):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Answer):
    """`/v1/chat/completions` `choices[].logprobs` (hpc/gateway/logprobs.py)."""

    content: list[TokenLogprob]
    refusal: list[TokenLogprob] | None


class CompletionChoice(Answer):
    index: int
    finish_reason: FinishReason
    logprobs: CompletionLogprobs | None
    text: str


class AssistantMessage(Answer):
    role: Literal["assistant"]
    content: str


class ChatChoice(Answer):
    index: int
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None
    message: AssistantMessage


class Completion(Sparse):
    """`POST /v1/completions`, not streamed."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    timing: EngineTiming | None = Field(default=None, alias=TIMING_FIELD)


class ChatCompletion(Sparse):
    """`POST /v1/chat/completions`, not streamed."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timing: EngineTiming | None = Field(default=None, alias=TIMING_FIELD)


class CompletionChunkChoice(Answer):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None


class ChatDelta(Sparse):
    """What a chat stream's event adds: the role (the opening event), text, or nothing (the finish)."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(Sparse):
    index: int
    delta: ChatDelta
    finish_reason: FinishReason | None
    logprobs: ChatLogprobs | None = None  # absent in the opening event


class CompletionChunk(Sparse):
    """An SSE event of a streamed `POST /v1/completions`: text, a finish (with the timing, when asked), or the
    usage (`stream_options.include_usage`, no choices)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None
    timing: EngineTiming | None = Field(default=None, alias=TIMING_FIELD)


class ChatCompletionChunk(Sparse):
    """An SSE event of a streamed `POST /v1/chat/completions` (see CompletionChunk)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    timing: EngineTiming | None = Field(default=None, alias=TIMING_FIELD)


class ErrorDetail(Answer):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(Answer):
    """Every error the gateway answers, on every route (hpc/gateway/errors.py)."""

    error: ErrorDetail
