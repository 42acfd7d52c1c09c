"""Prompt and output text rules of the OpenAI API: the chat template, and `stop` sequences.

Chat: the tokenizer folder's `tokenizer_config.json` `chat_template` (Hugging Face's convention), rendered with
jinja2 the way transformers does (`messages`, `add_generation_prompt`, the special tokens). A folder without
one (e.g. a plain GPT-2) gets FALLBACK_TEMPLATE: `role: content` lines and a trailing `assistant:`, documented
in docs/gateway.md, so chat works on any model, if not as well as with its own template.

Stop: the engine is asked to stop at the sequences too, but the OpenAI API leaves the stop sequence out of the
text and TensorRT-LLM does not, and a stop string can span several tokens; so the gateway cuts the text itself
and, while streaming, holds back only the tail that could still be the start of a stop sequence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox

FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


class ChatTemplate:
    """The chat template of a tokenizer folder (or the fallback), compiled once."""

    def __init__(self, source: str | None, special_tokens: dict[str, str] | None = None) -> None:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.source = source or FALLBACK_TEMPLATE
        self.is_fallback = source is None
        self._template = env.from_string(self.source)
        self._special = special_tokens or {}

    @classmethod
    def from_tokenizer_dir(cls, folder: Path) -> ChatTemplate:
        try:
            config = json.loads((folder / "tokenizer_config.json").read_text())
        except (OSError, ValueError):
            config = {}
        source = config.get("chat_template")
        if isinstance(source, list):  # several named templates: the "default" one
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
        return cls(source if isinstance(source, str) else None, special)

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return self._template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **self._special
        )


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """`text` up to the first stop sequence (excluded), and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


class StopStream:
    """Streaming `cut_at_stop`: feed pieces, get what is safe to send now."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = [s for s in stop if s]
        self.pending = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        if not self.stop:  # the common case, once per streamed token: nothing to look for
            return piece
        if self.stopped:
            return ""
        text, self.stopped = cut_at_stop(self.pending + piece, self.stop)
        if self.stopped:
            self.pending = ""
            return text
        keep = max((_overlap(text, s) for s in self.stop), default=0)
        self.pending = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        rest, self.pending = ("" if self.stopped else self.pending), ""
        return rest


def _overlap(text: str, stop: str) -> int:
    """The longest end of `text` that is a proper start of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
