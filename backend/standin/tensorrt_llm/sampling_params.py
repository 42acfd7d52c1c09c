"""`tensorrt_llm.SamplingParams` as upstream defines it (tensorrt_llm/sampling_params.py, 1.x): keyword-only fields
with upstream's defaults, `_validate` at construction with upstream's words, and `_setup(tokenizer)` that takes
end_id/pad_id from the tokenizer and tokenizes `stop` and `bad` with it, so a stop word that is not `str` fails
as it fails upstream (the tokenizer refuses it). Fields without a CPU meaning (beam search, logits processors,
guided decoding, LoRA) are accepted as upstream accepts them; the engine refuses the values it cannot honour.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


def _encode(tokenizer: Any, text: Any, add_special_tokens: bool) -> list[int]:
    """upstream's `_encode`: the tokenizer's own encode, whatever it is given (tiktoken's takes no keyword)."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except TypeError:
        return list(tokenizer.encode(text))


@dataclass(kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    embedding_bias: Any = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    top_p_min: float | None = None
    top_p_reset_ids: int | None = None
    top_p_decay: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    no_repeat_ngram_size: int | None = None
    min_p: float | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: list[str] | None = None
    lookahead_config: Any = None
    guided_decoding: Any = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    _stop_word_ids: list[list[int]] | None = field(default=None, init=False, repr=False)
    _bad_word_ids: list[list[int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._validate()

    def _validate(self) -> None:
        """upstream's checks, with its messages (the 1.1-and-later form: the ranges first)."""
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")
        if self.best_of is not None:
            if self.best_of < self.n:
                raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
            if self.best_of > 1 and self._greedy_decoding and not os.environ.get("TLLM_ALLOW_N_GREEDY_DECODING"):
                raise ValueError(
                    "Greedy decoding in the LLM API does not allow multiple returns. Please set to best_of=1, "
                    f"got best_of={self.best_of}. Please set to best_of=1 or set an environment variable "
                    "TLLM_ALLOW_N_GREEDY_DECODING=1 to allow best_of > 1 under the greedy decoding."
                )
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}")
        # upstream: "correct types as users might pass in logprob=True for Top-1 logprobs"
        self.logprobs = self.logprobs and int(self.logprobs)
        self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)

    @property
    def _greedy_decoding(self) -> bool:
        return (
            not self.use_beam_search
            and (self.top_k is None or self.top_k == 1)
            and (self.top_p is None or self.top_p == 0.0)
        )

    def _setup(self, tokenizer: Any, add_special_tokens: bool = False) -> SamplingParams:
        """What the LLM does before a request goes to the engine: the end and pad ids from the tokenizer, and
        `bad`/`stop` tokenized (upstream: `[_encode(tokenizer, s, add_special_tokens) for s in strs]`)."""
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id
            if self.pad_id is None:
                self.pad_id = self.end_id
        if self.bad is not None:
            strs = [self.bad] if isinstance(self.bad, str) else self.bad
            self._bad_word_ids = [_encode(tokenizer, s, add_special_tokens) for s in strs]
        if self.stop is not None:
            strs = [self.stop] if isinstance(self.stop, str) else self.stop
            self._stop_word_ids = [_encode(tokenizer, s, add_special_tokens) for s in strs]
        return self

    @property
    def _stop_words(self) -> list[list[int]]:
        """Stop words as token ids: the strings' (after `_setup`) and each of `stop_token_ids` alone."""
        words = list(self._stop_word_ids or [])
        words += [[t] for t in self.stop_token_ids or []]
        return words
