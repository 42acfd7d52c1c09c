"""The bodies of the OpenAI routes as pydantic models: what a request may say, with OpenAI's ranges, so that a
field out of range (or one this gateway does not serve, set to anything but its default) is a 400 naming it.

Why a module of its own: the routes (hpc/gateway/openai_api.py) and the fast path that validates a body from its
bytes (hpc/gateway/fastpath.py) share these models, and the API's contract reads best in one place.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator


class StreamOptions(BaseModel):
    include_usage: bool = False


#: messages a chat request may give: each costs ~3 us of validation on the gateway's event loop, which stalls every
#: stream meanwhile (400 000 tiny messages in a 14 MB body: 1.5 s); this many are ~12 ms
MAX_MESSAGES = 4096
#: stop sequences a request may give (OpenAI takes 4; each is looked for in every streamed piece)
MAX_STOPS = 64


def _unserved(value: Any, why: str) -> Any:
    """A field of OpenAI's API this gateway does not serve: refused (400 naming it) when set to anything but its
    default, instead of answering as if it had been honoured."""
    if value:
        raise ValueError(f"not served by this gateway: {why}")
    return value


class Sampling(BaseModel):
    """Fields shared by completions and chat."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    logit_bias: dict[str, float] | None = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences, not {len(stop)}")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: Any) -> Any:
        return _unserved(value, "the ensemble takes no logit bias")


class CompletionRequest(Sampling):
    prompt: str | list[str]
    echo: Literal[False] = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    best_of: Literal[1] | None = None
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Any) -> Any:
        return _unserved(value, "the model writes after the prompt, not into a gap before a suffix")


class ChatMessage(BaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """Content parts of type `text`, joined (images are not served)."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    tools: list[dict[str, Any]] | None = None
    functions: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value: Any) -> Any:
        return _unserved(value, "no tool calls: the answer is the model's text")

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        kind = (value or {}).get("type", "text")
        return _unserved(value if kind != "text" else None, f"{kind!r} (no constrained decoding: text only)") or value

    top_logprobs: int | None = Field(default=None, ge=0, le=20)
