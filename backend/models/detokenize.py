"""Streaming text from streamed tokens without broken characters.

Why: a multi-byte UTF-8 character (é, 中, an emoji) is often split across byte-level BPE or byte-fallback
tokens, so decoding each streamed chunk on its own prints U+FFFD pieces; SentencePiece tokenizers also drop the
leading space of a chunk decoded alone.  :class:`IncrementalDecoder` decodes a short window of recent tokens
and emits only text that is complete, holding back a trailing incomplete character until a later token
completes it (the method of vLLM's and TGI's incremental detokenizers).

:class:`StreamTable` keeps one decoder per stream for a model that sees one chunk per call (postprocessing in a
streaming ensemble), bounded in size and age so abandoned streams cannot grow it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"

#: tokens → text (a tokenizer's decode with its options bound)
Decode = Callable[[Sequence[int]], str]


class IncrementalDecoder:
    """Text deltas for one sequence of tokens arriving in chunks."""

    def __init__(self, decode: Decode) -> None:
        self.decode = decode
        self.tokens: list[int] = []
        self.prefix = 0  # start of the context window (its text was emitted already)
        self.read = 0  # tokens before this index have been emitted

    def push(self, new_tokens: Sequence[int]) -> str:
        """Add tokens; return the new complete text (may be empty while a character is incomplete)."""
        self.tokens.extend(int(t) for t in new_tokens)
        before = self.decode(self.tokens[self.prefix : self.read])
        now = self.decode(self.tokens[self.prefix :])
        if len(now) <= len(before) or now.endswith(REPLACEMENT):
            return ""
        self.prefix, self.read = self.read, len(self.tokens)
        self._trim()
        return now[len(before) :]

    def flush(self) -> str:
        """The text still held back, as it decodes now (the sequence really ended on a partial character)."""
        before = self.decode(self.tokens[self.prefix : self.read])
        now = self.decode(self.tokens[self.prefix :])
        self.prefix = self.read = len(self.tokens)
        return now[len(before) :] if now.startswith(before) else ""

    def _trim(self) -> None:
        """Forget tokens before the window: memory stays bounded on long streams."""
        if self.prefix > 64:
            del self.tokens[: self.prefix]
            self.read -= self.prefix
            self.prefix = 0


class StreamTable:
    """Per-stream :class:`IncrementalDecoder` objects, least recently used first out, and dropped when idle."""

    def __init__(self, max_streams: int = 4096, idle_s: float = 600.0, clock: Callable[[], float] = time.monotonic):
        self.max_streams = max_streams
        self.idle_s = idle_s
        self.clock = clock
        self._streams: OrderedDict[object, tuple[IncrementalDecoder, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._streams)

    def push(self, key: object, tokens: Sequence[int], decode: Decode) -> str:
        """The new complete text of stream ``key`` after ``tokens``."""
        now = self.clock()
        entry = self._streams.pop(key, None)
        decoder = entry[0] if entry else IncrementalDecoder(decode)
        text = decoder.push(tokens)
        self._streams[key] = (decoder, now)
        self._expire(now)
        return text

    def _expire(self, now: float) -> None:
        while self._streams:
            key, (_, seen) = next(iter(self._streams.items()))
            if len(self._streams) <= self.max_streams and now - seen <= self.idle_s:
                break
            del self._streams[key]
