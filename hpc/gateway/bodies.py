"""The bodies of the OpenAI routes as pydantic models: what a request may say, with OpenAI's ranges, so that a
field out of range (or one this gateway does not serve, set to anything but its default) is a 400 naming it.

Every key of a body, and of its parts (a message, a content part, `stream_options`), is one of: served; refused
unless empty or at its default (`_unserved`, a part's `UNSERVED`: `tools`, `logit_bias`, a message's
`tool_calls`, ...); or one of the part's `IGNORED`, keys that clients commonly send and that change nothing this
gateway does (`user`, `metadata`, ...), accepted and ignored. Any other key is a 400 naming it, with the nearest
known one ("temprature": did you mean 'temperature'?), as OpenAI answers an argument it does not know: ignored,
a typo would be answered with the default instead. Nothing that would change the answer is ignored.

Why a module of its own: the routes (hpc/gateway/openai_api.py) and the fast path that validates a body from its
bytes (hpc/gateway/fastpath.py) share these models, and the API's contract reads best in one place.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from hpc.spec.limits import SAMPLING_BOUNDS
from launcher.contracts.model_names import INT32_MAX, UINT64_MAX

#: the error type (and OpenAI's error code) of a key that is neither served nor ignored
UNKNOWN = "unknown_parameter"
#: the error type of a key of a part that is not served, set
UNSERVED = "unserved"

#: keys of a request that clients commonly send and that change nothing this gateway does: accepted and ignored
#: (docs/gateway.md "What it serves" lists them), each with why nothing depends on it
IGNORED_FIELDS: Mapping[str, str] = {
    "user": "an end user's id, for OpenAI's abuse monitoring",
    "safety_identifier": "the same, `user`'s successor",
    "metadata": "tags for OpenAI's stored completions; nothing is stored here",
    "store": "whether OpenAI stores the completion; nothing is stored here",
    "service_tier": "OpenAI's processing tier; there is one here",
    "prompt_cache_key": "a hint for OpenAI's prompt cache; the gateway routes by the prompt's prefix itself",
    "prompt_cache_retention": "how long OpenAI keeps cached prefixes; the engine's KV cache decides here",
    "prompt_cache_options": "OpenAI's cache breakpoints and lifetime; the engine's KV cache decides here",
}
#: chat's too: without tools (refused) there is nothing to run in parallel
CHAT_IGNORED: Mapping[str, str] = {"parallel_tool_calls": "whether tool calls may run in parallel; no tools here"}
#: keys of `stream_options`
STREAM_IGNORED: Mapping[str, str] = {"include_obfuscation": "OpenAI's padding of stream events; none is added here"}
#: keys of a message: what an earlier answer carried, which a client may send back with it
MESSAGE_IGNORED: Mapping[str, str] = {"annotations": "citations of an earlier answer (web search); its text is kept"}
#: keys of a text part of a message's content
PART_IGNORED: Mapping[str, str] = {"prompt_cache_breakpoint": "a prompt cache breakpoint, as `prompt_cache_options`"}

_NO_TOOLS = "no tool calls: the answer is the model's text"
_TEXT = "the model answers with text (content)"


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` is most likely a typo of, or None: difflib's ratio 0.75 or more (0.6, its default,
    offers response_format for reasoning_effort, stream_options for web_search_options)."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return close[0] if close else None


def _error(kind: str, message: str, at: list[str | int]) -> PydanticCustomError:
    """A refusal raised by the body's check (`Sampling._known_keys`): its context's `at`, the path from the body to
    the key, is what errors.py adds to the error's location, which is the body's."""
    return PydanticCustomError(kind, "{message}", {"message": message, "at": at})


def unknown(name: str, known: Iterable[str], what: str, at: list[str | int]) -> PydanticCustomError:
    """The error of a key `name` (at `at`) that is none of `known`, the keys of its part, with the nearest one."""
    close = nearest(name, known)
    hint = (
        f"did you mean {close!r}?"
        if close
        else "this gateway neither serves nor ignores it (docs/gateway.md: What it serves)"
    )
    return _error(UNKNOWN, f"unknown {what}; {hint}", at)


class Part(BaseModel):
    """A body or a part of one. Its keys that are no field are kept (`extra="allow"`) for `check_keys`, which the
    body's one check calls. Why not `extra="forbid"`: its error says only "Extra inputs are not permitted", and
    why not a validator on each part: a Python call per message (a request may have 4096)."""

    model_config = ConfigDict(extra="allow")
    #: keys accepted and ignored (name → why)
    IGNORED: ClassVar[Mapping[str, str]] = {}
    #: keys refused when set, accepted empty (name → why): not fields, so that a message does not carry each
    UNSERVED: ClassVar[Mapping[str, str]] = {}
    #: what a key of this part is called in the error
    WHAT: ClassVar[str] = "parameter"

    def check_keys(self, at: list[str | int]) -> None:
        """Raise for this part's first key (at `at` in the body) that is neither a field nor ignored, or that is
        not served and set. A key set to null is accepted whatever its name (clients that write out every field
        of a typed request send nulls), since it asks for nothing."""
        for name, value in (self.__pydantic_extra__ or {}).items():
            if name in self.IGNORED or value is None:  # null asks for nothing, whatever the key
                continue
            if name not in self.UNSERVED:
                raise unknown(name, [*type(self).model_fields, *self.IGNORED, *self.UNSERVED], self.WHAT, [*at, name])
            if value:
                raise _error(UNSERVED, f"not served by this gateway: {self.UNSERVED[name]}", [*at, name])


class StreamOptions(Part):
    IGNORED = STREAM_IGNORED
    UNSERVED = {"continuous_usage_stats": "usage comes once, in the last event (include_usage)"}
    WHAT = "key of stream_options"

    include_usage: bool = False


#: messages a chat request may give: each is validated on the gateway's event loop, which stalls every stream
#: meanwhile; this many take milliseconds (docs/decisions.md "The gateway's own time")
MAX_MESSAGES = 4096
#: stop sequences a request may give (OpenAI takes 4; each is looked for in every streamed piece)
MAX_STOPS = 64
#: the most choices one request may ask for (prompts × n): each is an engine request of its own
#: (hpc/gateway/fanout.py), and a client that wants more sends more requests, which the balancer spreads
MAX_CHOICES = 128


def _unserved(value: Any, why: str) -> Any:
    """A field of OpenAI's API this gateway does not serve: refused (400 naming it) when set to anything but its
    default, instead of answering as if it had been honoured."""
    if value:
        raise ValueError(f"not served by this gateway: {why}")
    return value


class Sampling(Part):
    """Fields shared by completions and chat."""

    IGNORED = IGNORED_FIELDS

    model: str
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    stop: str | list[str] | None = None
    temperature: float | None = SAMPLING_BOUNDS["temperature"].field()
    top_p: float | None = SAMPLING_BOUNDS["top_p"].field()
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    seed: int | None = Field(default=None, ge=0, le=UINT64_MAX)
    presence_penalty: float | None = SAMPLING_BOUNDS["presence_penalty"].field()
    frequency_penalty: float | None = SAMPLING_BOUNDS["frequency_penalty"].field()
    # the engines' extensions of OpenAI's bodies that vLLM, aiperf and genai-perf send (TensorRT-LLM's
    # SamplingParams of these names): served on the llmapi workflow by hpc-serve's model and by the ensemble;
    # the image's llmapi model lacks them (hpc/serving/model_io.py IMAGE_MODEL_LACKS: a 400 naming the field)
    ignore_eos: bool = False
    min_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX)
    repetition_penalty: float | None = SAMPLING_BOUNDS["repetition_penalty"].field()
    #: beam search's length penalty: accepted as TensorRT-LLM takes it, no effect on the one beam served here
    length_penalty: float | None = SAMPLING_BOUNDS["length_penalty"].field()
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None

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

    @model_validator(mode="after")
    def _known_keys(self) -> Sampling:
        """The body's one check of its keys and its parts' (once every field is valid)."""
        if self.__pydantic_extra__:
            self.check_keys([])
        if self.stream_options is not None and self.stream_options.__pydantic_extra__:
            self.stream_options.check_keys(["stream_options"])
        self._check_parts()
        return self

    def _check_parts(self) -> None:
        """The keys of the body's other parts (chat: its messages)."""


class CompletionRequest(Sampling):
    #: one prompt or several (hpc/gateway/fanout.py), as text or as token ids of the deployment's tokenizer
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    best_of: Literal[1] | None = None
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Any) -> Any:
        return _unserved(value, "the model writes after the prompt, not into a gap before a suffix")

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_of_openais_shapes(cls, prompt: Any) -> Any:
        """Before pydantic tries the union's four members: its own error names the first member it tried
        (`prompt.str: Input should be a valid string` for a list that mixes text and token ids)."""
        if isinstance(prompt, str) or (isinstance(prompt, list) and not prompt):
            return prompt  # an empty list: _some_prompts says what to send
        kinds = {_prompt_kind(p) for p in prompt} if isinstance(prompt, list) else {"other"}
        if len(kinds) == 1 and "other" not in kinds:
            return prompt
        raise ValueError(
            "a string, a list of strings, a list of token ids, or a list of lists of token ids; "
            + (
                "not a mix of them"
                if isinstance(prompt, list) and "other" not in kinds
                else f"not {_json_kind(prompt)}"
            )
        )

    @field_validator("prompt")
    @classmethod
    def _some_prompts(cls, prompt: Any, info: ValidationInfo) -> Any:
        if isinstance(prompt, list):
            if not prompt or any(isinstance(p, list) and not p for p in prompt):
                raise ValueError("an empty list: send a prompt (text, or token ids), or a list of them")
            ids = [i for p in prompt for i in (p if isinstance(p, list) else [p]) if isinstance(i, int)]
            if any(i < 0 for i in ids):
                raise ValueError("token ids are not negative")
        count = len(prompt) if isinstance(prompt, list) and not isinstance(prompt[0], int) else 1
        if count * info.data.get("n", 1) > MAX_CHOICES:
            raise ValueError(f"{count} prompts × n {info.data.get('n', 1)}: at most {MAX_CHOICES} choices a request")
        return prompt

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request: text, or token ids."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]
        return list(self.prompt)  # type: ignore[arg-type]


def _prompt_kind(part: Any) -> str:
    """What one element of a list `prompt` is: text, a token id, token ids, or something no shape allows."""
    if isinstance(part, str):
        return "text"
    if isinstance(part, int) and not isinstance(part, bool):
        return "id"
    if isinstance(part, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in part):
        return "ids"
    return "other"


def _json_kind(value: Any) -> str:
    """A value as JSON would name it, for an error message (`a number`, `an object`)."""
    if isinstance(value, list):
        return "a list with other values in it (numbers must be whole token ids)"
    names = {bool: "true or false", dict: "an object", type(None): "null", int: "a number", float: "a number"}
    return names.get(type(value), "that")


#: the keys of a text part of a message's content
TEXT_PART_KEYS = ("type", "text")


def _check_text_part(part: dict[str, Any], at: list[str | int]) -> None:
    """A content part (at `at` in the body) that is text, or the error naming what is wrong with it: an image, audio
    or file part would be left out of the prompt, and the answer made without it."""
    kind = part.get("type")
    if kind != "text":
        raise _error(
            UNSERVED, f"a part of type {kind!r} is not served: the model reads text (type 'text')", [*at, "type"]
        )
    for key in part:
        if key not in TEXT_PART_KEYS and key not in PART_IGNORED and part[key] is not None:
            raise unknown(key, [*TEXT_PART_KEYS, *PART_IGNORED], "key of a text part", [*at, key])
    if not isinstance(part.get("text"), str):
        raise _error("string_type", "a text part's 'text' must be a string", [*at, "text"])


#: the roles of a chat message served (OpenAI's, but those of tool calls)
ROLES = ("system", "developer", "user", "assistant")
#: OpenAI's roles of a tool's (or a function's) answer: refused, as tools are
TOOL_ROLES = ("tool", "function")


class ChatMessage(Part):
    IGNORED = MESSAGE_IGNORED
    # what an assistant message of a tool call, of audio or of a refusal carries, and a tool's answer: refused when
    # set (no tools, no audio here), accepted empty (a client sending an earlier answer of ours back, dumped whole)
    UNSERVED = {
        "tool_calls": _NO_TOOLS,
        "function_call": _NO_TOOLS,
        "tool_call_id": _NO_TOOLS,
        "refusal": _TEXT,
        "audio": _TEXT,
    }
    WHAT = "key of a message"

    role: str
    content: str | list[dict[str, Any]] | None = None
    #: a participant's name, passed to the chat template as transformers does (most templates leave it out)
    name: str | None = None

    @field_validator("role")
    @classmethod
    def _openais_roles(cls, role: str) -> str:
        """OpenAI's roles, as OpenAI checks them (it answers 400 to any other); a tool's answer needs tool calls."""
        if role in TOOL_ROLES:
            raise ValueError(f"a message of role {role!r} is not served: {_NO_TOOLS}")
        if role not in ROLES:
            raise ValueError(f"{role!r} is no role: one of {', '.join(ROLES)}")
        return role

    def check_parts(self, at: list[str | int]) -> None:
        """This message's keys and content parts (at `at` in the body)."""
        if self.__pydantic_extra__:
            self.check_keys(at)
        if isinstance(self.content, list):
            for index, part in enumerate(self.content):
                _check_text_part(part, [*at, "content", index])

    def text(self) -> str:
        """The content as text: its parts (text, checked) joined."""
        if isinstance(self.content, list):
            return "".join(part["text"] for part in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it (transformers' message dict). `developer` is OpenAI's newer
        name for `system`, which is the one a checkpoint's template knows."""
        role = "system" if self.role == "developer" else self.role
        if self.name is None:
            return {"role": role, "content": self.text()}
        return {"role": role, "content": self.text(), "name": self.name}


#: what `tool_choice` and `function_call` may say without tools: nothing to call, so nothing changes
NO_CALL = ("none", "auto")


class ChatRequest(Sampling):
    IGNORED = {**IGNORED_FIELDS, **CHAT_IGNORED}

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    functions: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None

    def _check_parts(self) -> None:
        for index, message in enumerate(self.messages):
            if message.__pydantic_extra__ or type(message.content) is list:
                message.check_parts(["messages", index])

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value: Any) -> Any:
        return _unserved(value, _NO_TOOLS)

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _no_call_asked(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        """ "none" and "auto" ask for nothing without tools; "required" or a named function asks for a call."""
        asked = value if value not in NO_CALL else None
        return _unserved(asked, f"{value!r}: {_NO_TOOLS}") or value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        kind = (value or {}).get("type", "text")
        return _unserved(value if kind != "text" else None, f"{kind!r} (no constrained decoding: text only)") or value

    @field_validator("modalities")
    @classmethod
    def _text_out(cls, value: list[str] | None) -> list[str] | None:
        other = [m for m in value or [] if m != "text"]
        return _unserved(other, f"{other}: {_TEXT}") or value
