"""Fast tokenizer loading for the pre/post-processing models, without transformers on the hot path.

Upstream uses `transformers.AutoTokenizer` (heavy import, and pulls torch in some versions). A
Hugging Face model folder already has everything needed: `tokenizer.json` (the `tokenizers` pipeline)
and the special tokens in `tokenizer_config.json` / `special_tokens_map.json` / `generation_config.json`.
`transformers` is imported only when `tokenizer.json` is missing (slow sentencepiece-only folders).

end_id / pad_id follow upstream: end = the eos token, pad = the pad token, or end when there is none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

#: from this many characters `_FastBackend.encode` goes through `encode_batch`, which releases the GIL while it
#: works; `encode` holds it (for seconds on a long text: docs/decisions.md "The gateway's own time"), so another
#: thread, an event loop relaying streams, could not run meanwhile. Below it a text is encoded in about a
#: millisecond or less.
RELEASE_GIL_CHARS = 2048


class _Backend(Protocol):
    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...
    def decode_batch(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]: ...
    def token_to_id(self, token: str) -> int | None: ...
    def vocab_size(self) -> int: ...


class _FastBackend:
    """`tokenizers.Tokenizer` (tokenizer.json)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))
        # Padding/truncation stored in tokenizer.json would silently change lengths; we pad ourselves.
        self.tok.no_padding()
        self.tok.no_truncation()

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) >= RELEASE_GIL_CHARS:  # the same ids, with the GIL released while they are made
            return list(self.tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode_batch(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
        return list(self.tok.decode_batch([list(map(int, s)) for s in ids], skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def vocab_size(self) -> int:
        return int(self.tok.get_vocab_size(with_added_tokens=True))


class _TransformersBackend:
    """Fallback for folders without tokenizer.json (e.g. only tokenizer.model)."""

    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer  # heavy; only here

        self.tok = AutoTokenizer.from_pretrained(str(directory), legacy=False, padding_side="left")

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))

    def decode_batch(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
        return list(self.tok.batch_decode([list(map(int, s)) for s in ids], skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        tid = self.tok.convert_tokens_to_ids(token)
        if not isinstance(tid, int) or (tid == self.tok.unk_token_id and token != self.tok.unk_token):
            return None
        return tid

    def vocab_size(self) -> int:
        return len(self.tok)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def _content(value: object) -> str | None:
    """Special tokens are written as "</s>" or {"content": "</s>", ...} depending on the exporter."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _first_id(value: object) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class TextTokenizer:
    """What pre/post-processing need: encode, batch decode, vocab size and the special ids."""

    backend: _Backend
    end_id: int
    pad_id: int
    bos_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    special_tokens: dict[str, str] = field(default_factory=dict)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; with special tokens, also honours `add_bos_token`/`add_eos_token` of
        tokenizer_config.json when the tokenizer.json post-processor does not add them itself."""
        ids = self.backend.encode(text, add_special_tokens)
        if add_special_tokens:
            if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
                ids.insert(0, self.bos_id)
            if self.add_eos and (not ids or ids[-1] != self.end_id):
                ids.append(self.end_id)
        return ids

    def decode_batch(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return self.backend.decode_batch(ids, skip_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.decode_batch([ids], skip_special_tokens)[0]

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size()


def load_tokenizer(tokenizer_dir: str | Path) -> TextTokenizer:
    """Load the tokenizer of a Hugging Face model folder (see module doc for the file precedence).

    Raises ValueError if no end id can be determined (upstream would fail later, inside the engine).
    """
    directory = Path(tokenizer_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"tokenizer_dir {directory} is not a directory")
    config = _read_json(directory / "tokenizer_config.json")
    special_map = _read_json(directory / "special_tokens_map.json")
    generation = _read_json(directory / "generation_config.json")
    backend: _Backend
    if (directory / "tokenizer.json").is_file():
        backend = _FastBackend(directory / "tokenizer.json")
    else:
        backend = _TransformersBackend(directory)

    special: dict[str, str] = {}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        token = _content(config.get(name)) or _content(special_map.get(name))
        if token is not None:
            special[name] = token

    def token_id(name: str, generation_key: str) -> int | None:
        if name in special:
            tid = backend.token_to_id(special[name])
            if tid is not None:
                return int(tid)
            ids = backend.encode(special[name], False)  # upstream: first id of encode(token)
            if ids:
                return ids[0]
        return _first_id(generation.get(generation_key)) if generation_key else None

    end_id = token_id("eos_token", "eos_token_id")
    if end_id is None:
        raise ValueError(
            f"{directory}: no eos token in tokenizer_config.json, special_tokens_map.json "
            "or generation_config.json; cannot determine end_id"
        )
    pad_id = token_id("pad_token", "pad_token_id")
    bos_id = token_id("bos_token", "bos_token_id")
    return TextTokenizer(
        backend=backend,
        end_id=end_id,
        pad_id=end_id if pad_id is None else pad_id,
        bos_id=bos_id,
        add_bos=bool(config.get("add_bos_token", False)),
        add_eos=bool(config.get("add_eos_token", False)),
        special_tokens=special,
    )


def tokenizer_from_config(model_config: Mapping[str, Any], model: str) -> TextTokenizer:
    """The tokenizer named by a model config's `tokenizer_dir` parameter (pre- and postprocessing)."""
    from backend.models import model_parameter

    tokenizer_dir = model_parameter(model_config, "tokenizer_dir")
    if tokenizer_dir is None:
        raise ValueError(f"{model}: parameter tokenizer_dir is not set")
    return load_tokenizer(tokenizer_dir)
