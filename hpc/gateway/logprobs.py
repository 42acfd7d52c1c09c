"""Log probabilities in the OpenAI shapes, lined up with the text the client is sent.

The ensemble returns, with each streamed response, the text that response added (`text_output`) and the log
probability of each token it generated (`output_log_probs`, when asked with `return_log_probs`); it returns no
alternatives, so only the chosen tokens' log probabilities are served (completions `logprobs: 0`, chat
`logprobs: true` with `top_logprobs` 0). A token's text is the text its response added: a character whose
bytes span several tokens belongs to the token that completed it (the ones before have ""), which keeps the
invariant clients rely on, that the tokens' texts joined are the completion's text. When the text is cut at a
stop sequence, the tokens are cut with it (the last one trimmed to the cut).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpc.serving.model_io import Chunk


@dataclass(frozen=True)
class Token:
    text: str
    logprob: float
    offset: int  # characters of the completion before this token


class TokenTrail:
    """The tokens of a completion as they arrive, handed out once the text they cover has been sent."""

    def __init__(self) -> None:
        self.tokens: list[Token] = []
        self.length = 0  # characters covered by the tokens so far
        self._given = 0

    def add(self, chunk: Chunk) -> None:
        """One response's tokens; a response with text but no log probability (a character's last bytes at
        the end of the stream) adds its text to the last token."""
        if not chunk.logprobs:
            if chunk.text and self.tokens:
                last = self.tokens[-1]
                self.tokens[-1] = Token(last.text + chunk.text, last.logprob, last.offset)
                self.length += len(chunk.text)
            return
        texts = [""] * (len(chunk.logprobs) - 1) + [chunk.text]
        for text, logprob in zip(texts, chunk.logprobs, strict=True):
            self.tokens.append(Token(text, logprob, self.length))
            self.length += len(text)

    def sent(self, chars: int) -> list[Token]:
        """Tokens not handed out yet whose whole text lies within the first `chars` characters."""
        out = []
        while self._given < len(self.tokens):
            token = self.tokens[self._given]
            if token.offset + len(token.text) > chars:
                break
            out.append(token)
            self._given += 1
        return out

    def finish(self, chars: int) -> list[Token]:
        """The tokens left, cut to a completion of `chars` characters (shorter than the tokens' text when a
        stop sequence cut it): tokens that start at or after the cut are dropped, one across it trimmed."""
        rest = self.tokens[self._given :]
        self._given = len(self.tokens)
        if chars >= self.length:
            return rest
        return [Token(t.text[: chars - t.offset], t.logprob, t.offset) for t in rest if t.offset < chars]


def completion_logprobs(tokens: list[Token]) -> dict[str, Any]:
    """`/v1/completions` `choices[].logprobs` (`logprobs: 0`: each position's top list holds the chosen
    token alone, as OpenAI's "up to logprobs + 1 entries" has it)."""
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{t.text: t.logprob} for t in tokens],
        "text_offset": [t.offset for t in tokens],
    }


def chat_logprobs(tokens: list[Token]) -> dict[str, Any]:
    """`/v1/chat/completions` `choices[].logprobs` (`top_logprobs` empty: no alternatives are returned)."""
    content = [
        {"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode()), "top_logprobs": []} for t in tokens
    ]
    return {"content": content, "refusal": None}
