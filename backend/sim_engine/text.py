"""The simulated engine's answers: the shipped English corpus (backend/data/corpus.txt) in the checkpoint's own
tokens, read on from a place chosen by the request's seed and prompt. So an answer is real text that decodes
cleanly, the same request gives the same answer, and another prompt or seed reads from elsewhere.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from backend.cpu_engine.init_model import corpus_text


class CorpusText:
    """The corpus as token ids of the tokenizer in `checkpoint` (tokenizer.json)."""

    def __init__(self, checkpoint: str | None = None, ids: np.ndarray | None = None) -> None:
        """`ids` in place of a checkpoint's tokenizer: any token sequence (calibrate.py, tests)."""
        if ids is not None:
            self.ids = np.asarray(ids, np.int64)
            self.vocab_size = int(self.ids.max()) + 1
            return
        assert checkpoint is not None
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(os.path.join(checkpoint, "tokenizer.json"))
        # whole lines, so that the text reads on across the wrap-around too
        tokens = tokenizer.encode(" ".join(corpus_text().split()), add_special_tokens=False).ids
        if not tokens:
            raise ValueError(f"the tokenizer of {checkpoint} makes no tokens of the corpus")
        self.ids = np.asarray(tokens, np.int64)
        self.vocab_size = tokenizer.get_vocab_size()

    def start(self, seed: int, prompt: np.ndarray) -> int:
        """Where a request's answer starts in the corpus."""
        key = hashlib.blake2b(int(seed & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little"), digest_size=8)
        key.update(np.asarray(prompt, np.int64).tobytes())
        return int.from_bytes(key.digest(), "little") % len(self.ids)

    def token(self, start: int, index: int) -> int:
        """The answer's token at `index` (0: the first new token)."""
        return int(self.ids[(start + index) % len(self.ids)])
