"""upstream's `TransformersTokenizer` surface (tensorrt_llm/llmapi/tokenizer.py) over the CPU engine's tokenizer
(backend/models/tokenizer.py: the same ids as transformers' AutoTokenizer). It refuses what a Hugging Face
tokenizer refuses: `encode` of anything but text raises transformers' ValueError, so a stop word sent as bytes
fails here as it fails on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.models.tokenizer import TextTokenizer, load_tokenizer


class TransformersTokenizer:
    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.end_id

    @property
    def pad_token_id(self) -> int | None:
        return self.tokenizer.pad_id

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def encode(self, text: Any, *args: Any, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(
                f"Input {text!r} is not valid. Should be a string, a list/tuple of strings or a list/tuple of integers."
            )
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int], *args: Any, skip_special_tokens: bool = True, **kwargs: Any) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def __call__(self, text: str, *args: Any, **kwargs: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, **kwargs)}


def tokenizer_factory(obj: Any) -> TransformersTokenizer:
    """A tokenizer from a checkpoint folder (or one already made)."""
    if isinstance(obj, TransformersTokenizer):
        return obj
    return TransformersTokenizer(load_tokenizer(str(obj)))
