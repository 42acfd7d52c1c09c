"""Streaming detokenization: token-by-token text equals the whole decode, never with U+FFFD pieces or lost
spaces, for a byte-level BPE (GPT-2 style) and a SentencePiece-style byte-fallback tokenizer (Llama style)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_pre_post import build_tokenizer

from backend.models.detokenize import IncrementalDecoder, StreamTable
from backend.models.postprocessing import StreamingDecoder
from backend.models.tokenizer import TextTokenizer, load_tokenizer

TEXT = "Hello wörld, ünïcødé ✓ 中文字 🙂 end"
CORPUS = ["Hello world, hello Triton!", "The quick brown fox.", "plain ascii text only here"] * 20


def build_byte_fallback_tokenizer(directory: Path) -> Path:
    """A Llama-like tokenizer.json: Metaspace pre-tokenizer, BPE with byte fallback, Llama's decoder chain."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    )
    spec = json.loads(tok.to_str())  # byte tokens are ordinary vocabulary entries in Llama, not special ones
    vocab = spec["model"]["vocab"]
    for i in range(256):
        vocab.setdefault(f"<0x{i:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    (directory / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return directory


@pytest.fixture(scope="module", params=["byte-level", "byte-fallback"])
def tok(request, tmp_path_factory) -> TextTokenizer:
    folder = tmp_path_factory.mktemp(request.param)
    build = build_tokenizer if request.param == "byte-level" else build_byte_fallback_tokenizer
    return load_tokenizer(build(folder))


def test_split_characters_are_held_back_until_complete(tok: TextTokenizer) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert "\ufffd" in "".join(tok.decode([t]) for t in ids), "the text must really split characters"
    decoder = IncrementalDecoder(tok.decode)
    pieces = [decoder.push([t]) for t in ids] + [decoder.flush()]
    assert "".join(pieces) == tok.decode(ids) == TEXT
    assert not any("\ufffd" in p for p in pieces)


def test_a_sequence_that_ends_mid_character_is_flushed_as_it_decodes(tok: TextTokenizer) -> None:
    ids = tok.encode("ab🙂", add_special_tokens=False)
    cut = ids[:-1]  # the emoji's last byte never comes
    decoder = IncrementalDecoder(tok.decode)
    text = "".join(decoder.push([t]) for t in cut)
    assert text == "ab"
    assert text + decoder.flush() == tok.decode(cut)


def test_long_streams_keep_a_bounded_window(tok: TextTokenizer) -> None:
    ids = tok.encode(TEXT * 40, add_special_tokens=False)
    decoder = IncrementalDecoder(tok.decode)
    assert "".join(decoder.push([t]) for t in ids) + decoder.flush() == TEXT * 40
    assert len(decoder.tokens) < 100


def test_streams_interleaved_in_one_model_stay_apart(tok: TextTokenizer) -> None:
    streaming = StreamingDecoder(tok)
    texts = {11: TEXT, 22: "zweiter Strom: äöü ✓✓"}
    ids = {k: tok.encode(v, add_special_tokens=False) for k, v in texts.items()}
    got = {k: b"" for k in texts}
    for i in range(max(len(v) for v in ids.values())):
        for key, seq in ids.items():
            if i < len(seq):
                out = streaming(f"stream-{key}", np.array([[[seq[i]]]], np.int32), np.array([[1]], np.int32))
                assert out.shape == (1,)  # upstream's flat layout
                got[key] += out[0]
    assert {k: v.decode("utf-8") for k, v in got.items()} == texts


def test_stream_table_forgets_idle_and_excess_streams() -> None:
    now = [0.0]
    table = StreamTable(max_streams=2, idle_s=10, clock=lambda: now[0])
    table.push("a", [1], lambda ids: "x" * len(ids))
    table.push("b", [1], lambda ids: "x" * len(ids))
    table.push("c", [1], lambda ids: "x" * len(ids))
    assert len(table) == 2  # "a", the least recently used, made room
    now[0] = 11
    table.push("d", [1], lambda ids: "x" * len(ids))
    assert len(table) == 1  # b and c were idle for longer than 10 s
