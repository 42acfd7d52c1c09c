"""What `hpc-serve bench` sends: a list of requests (prompt, its length in tokens, max_tokens), made from a seed.

Why prompts are cut to a token length with the deployment's own tokenizer: a request's cost is its token
count, not its characters, and "input 512 tokens" must mean 512 of the model's tokens; text is made from a fixed
word list, encoded, cut to the length and decoded again (re-encoding the decoded text can differ by a token or
two at the cut, which is why the length sent is counted again). Without a tokenizer (a bare gateway URL and no
`--tokenizer`), one word counts as one token: approximate, and said so in the report.

Why everything comes from one `random.Random(seed)`: the same command sends the same requests in the same
order, so two runs (two deployments, two configurations) are compared on the same work.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

KINDS = ("token-norm-dist", "fixed", "dataset", "shared-prefix")

#: common English words: text a tokenizer splits into ordinary tokens (random ids would decode to noise whose
#: re-encoded length drifts far from the length asked for)
WORDS = (
    "the of and to in is was for on that with as by at from his her an which or were are be this had not but "
    "they have one their all first new after who two time year city world people state school house river music "
    "family water company under between during later small early while until north south part many where these"
).split()


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class WordTokenizer:
    """One whitespace-separated word = one token: the stand-in when the model's tokenizer is not at hand."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [hash(w) & 0xFFFF for w in text.split()]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(WORDS[i % len(WORDS)] for i in ids)


@dataclass(frozen=True)
class BenchRequest:
    """One request: its prompt, the prompt's length in tokens, and how many tokens to ask for."""

    prompt: str
    input_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload as the command line gives it (see `hpc-serve bench --help`)."""

    kind: str = "token-norm-dist"
    input_mean: int = 128
    input_stdev: int = 0
    output_mean: int = 64
    output_stdev: int = 0
    dataset: Path | None = None
    prefix_tokens: int = 256
    num_prefixes: int = 4

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"--workload {self.kind!r}: one of {', '.join(KINDS)}")
        if self.kind == "dataset" and self.dataset is None:
            raise ValueError("--workload dataset needs --dataset FILE.jsonl (one JSON object per line)")
        if self.input_mean < 1 or self.output_mean < 1:
            raise ValueError("--input-tokens and --output-tokens must be at least 1")
        if self.input_stdev < 0 or self.output_stdev < 0:
            raise ValueError("--input-stdev and --output-stdev must be 0 or more")


def _length(rng: random.Random, mean: int, stdev: int) -> int:
    """A length from N(mean, stdev), at least 1 (stdev 0: always `mean`)."""
    return max(1, round(rng.gauss(mean, stdev))) if stdev else mean


def text_of_length(tokenizer: Tokenizer, rng: random.Random, tokens: int) -> tuple[str, int]:
    """Text of about `tokens` tokens and its measured length (random words, cut with the tokenizer)."""
    words = " ".join(rng.choice(WORDS) for _ in range(tokens + 8))
    ids = tokenizer.encode(words, add_special_tokens=False)[:tokens]
    text = tokenizer.decode(ids) if not isinstance(tokenizer, WordTokenizer) else " ".join(words.split()[:tokens])
    return text, len(tokenizer.encode(text, add_special_tokens=False))


def _dataset_prompts(path: Path) -> list[tuple[str, int | None]]:
    """(prompt, output length or None) of each line of a JSONL file: `prompt` (or `text`, or ShareGPT's
    `conversations`/`messages` first human turn) and an optional `output_tokens`/`max_tokens`."""
    found: list[tuple[str, int | None]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}:{number}: not JSON ({exc.msg}); --dataset wants one JSON object per line"
            ) from None
        prompt = row.get("prompt") or row.get("text") if isinstance(row, dict) else None
        turns = row.get("conversations") or row.get("messages") if isinstance(row, dict) else None
        if prompt is None and isinstance(turns, list) and turns:
            first = turns[0]
            prompt = first.get("value") or first.get("content") if isinstance(first, dict) else None
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(
                f"{path}:{number}: no prompt: give `prompt` (or `text`, or ShareGPT `conversations` / `messages`)"
            )
        out = row.get("output_tokens") or row.get("max_tokens")
        found.append((prompt, int(out) if out else None))
    if not found:
        raise ValueError(f"{path}: no prompts (--dataset wants one JSON object per line)")
    return found


def make_requests(spec: WorkloadSpec, count: int, tokenizer: Tokenizer, seed: int) -> list[BenchRequest]:
    """`count` requests of the workload, the same for the same seed."""
    rng = random.Random(seed)
    requests: list[BenchRequest] = []
    if spec.kind == "dataset":
        assert spec.dataset is not None
        rows = _dataset_prompts(spec.dataset)
        for _ in range(count):
            prompt, out = rows[rng.randrange(len(rows))]
            length = len(tokenizer.encode(prompt, add_special_tokens=False))
            requests.append(BenchRequest(prompt, length, out or _length(rng, spec.output_mean, spec.output_stdev)))
        return requests
    prefixes = [text_of_length(tokenizer, rng, spec.prefix_tokens) for _ in range(spec.num_prefixes)]
    for _ in range(count):
        if spec.kind == "fixed":
            prompt, length = text_of_length(tokenizer, rng, spec.input_mean)
            requests.append(BenchRequest(prompt, length, spec.output_mean))
            continue
        prompt, length = text_of_length(tokenizer, rng, _length(rng, spec.input_mean, spec.input_stdev))
        if spec.kind == "shared-prefix":  # a document (system prompt) shared by many requests, then a question
            prefix, prefix_length = prefixes[rng.randrange(len(prefixes))]
            prompt, length = f"{prefix} {prompt}", prefix_length + length
        requests.append(BenchRequest(prompt, length, _length(rng, spec.output_mean, spec.output_stdev)))
    return requests
