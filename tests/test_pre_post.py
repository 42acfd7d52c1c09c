"""Pre/post-processing and BLS logic with a tokenizer trained here (no network, no Triton)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from backend.models.bls import BlsPipeline, InnerModelError
from backend.models.postprocessing import decode_batches, split_sequences
from backend.models.preprocessing import Preprocessor, words_to_list_format
from backend.models.tokenizer import RELEASE_GIL_CHARS, TextTokenizer, load_tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello Triton! Serving models on Slurm clusters.",
    "TensorRT-LLM engines run on GPUs; the CPU engine runs everywhere.",
    "Stop words end generation early, bad words are never generated.",
] * 20


def build_tokenizer(
    directory: Path, *, add_bos: bool = True, pad: bool = False, generation_only_eos: bool = False
) -> Path:
    """Train a small byte-level BPE and save it like a Hugging Face model folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>"] + (["<pad>"] if pad else [])
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(directory / "tokenizer.json"))
    config: dict[str, object] = {
        "bos_token": "<s>",
        "add_bos_token": add_bos,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if generation_only_eos:
        (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))
    else:
        config["eos_token"] = {"content": "</s>", "special": True}
    if pad:
        config["pad_token"] = "<pad>"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(tok_dir) -> TextTokenizer:
    return load_tokenizer(tok_dir)


def strings(*items: str) -> np.ndarray:
    return np.array([[s.encode()] for s in items], dtype=object)


# ------------------------------------------------------------------------------------------------ tokenizer
def test_tokenizer_special_ids(tok):
    assert tok.bos_id == 0 and tok.end_id == 1
    assert tok.pad_id == tok.end_id  # no pad token → pad := eos (upstream)
    ids = tok.encode("Hello world")
    assert ids[0] == tok.bos_id and tok.bos_id not in tok.encode("Hello world", add_special_tokens=False)


def test_tokenizer_pad_and_generation_config(tmp_path):
    t = load_tokenizer(build_tokenizer(tmp_path / "a", pad=True, add_bos=False))
    assert t.pad_id == 2 and t.end_id == 1
    assert t.encode("Hello")[0] != 0
    t = load_tokenizer(build_tokenizer(tmp_path / "b", generation_only_eos=True))
    assert t.end_id == 1  # first of generation_config's eos list


def test_tokenizer_without_eos_is_an_error(tmp_path):
    d = build_tokenizer(tmp_path / "c")
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(ValueError, match="eos"):
        load_tokenizer(d)


@pytest.mark.slow
def test_a_long_text_is_encoded_alike_and_with_the_gil_released(tok):
    """From RELEASE_GIL_CHARS on, encoding goes through `encode_batch`: the same ids as `encode` gives, and other
    threads run meanwhile (the gateway counts a long prompt on a worker thread while its event loop relays
    streams). Measured as the longest pause of a thread ticking every millisecond beside the encoding: with the
    GIL held it is the whole encoding, released a few milliseconds (docs/decisions.md "The gateway's own time")."""
    text = "Hello world, hello Triton! The lazy dog. " * 20_000  # 820 000 characters
    assert len(text) >= RELEASE_GIL_CHARS
    assert tok.encode(text) == tok.encode(text[: RELEASE_GIL_CHARS - 1] + text[RELEASE_GIL_CHARS - 1 :])
    assert tok.encode(text, add_special_tokens=False) == list(
        tok.backend.tok.encode(text, add_special_tokens=False).ids
    )
    pauses: list[float] = []
    done = threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            pauses.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.perf_counter()
    try:
        tok.encode(text)
    finally:
        took = time.perf_counter() - started
        done.set()
        ticker.join()
    assert max(pauses) < took / 2, (
        f"the longest pause beside {took * 1e3:.0f} ms of encoding: {max(pauses) * 1e3:.0f} ms"
    )


# --------------------------------------------------------------------------------------------- preprocessing
def test_round_trip_text_ids_text(tok):
    texts = ["Hello world, hello Triton!", "The lazy dog.", "ünïcødé ✓ text"]
    pre = Preprocessor(tok)({"QUERY": strings(*texts), "REQUEST_OUTPUT_LEN": np.array([[8], [8], [8]], dtype=np.int32)})
    ids, lens = pre["INPUT_ID"], pre["REQUEST_INPUT_LEN"]
    assert ids.dtype == np.int32 and lens.shape == (3, 1)
    assert ids.shape == (3, int(lens.max()))
    for row, n in zip(ids, lens[:, 0], strict=True):
        assert (row[n:] == tok.pad_id).all()  # right padded
    out = decode_batches(tok, [(ids[:, None, :], lens)])[0]
    assert out.shape == (3,)  # upstream's layout: one flat element per beam of every row
    assert [o.decode() for o in out] == texts  # BOS skipped as a special token


def test_preprocessing_outputs(tok):
    inputs = {"QUERY": strings("Hello world"), "REQUEST_OUTPUT_LEN": np.array([[5]], dtype=np.int32)}
    out = Preprocessor(tok)(inputs)
    assert out["DECODER_INPUT_ID"].tolist() == [[tok.pad_id]]
    assert out["REQUEST_DECODER_INPUT_LEN"].tolist() == [[1]]
    assert out["BAD_WORDS_IDS"].shape == (1, 2, 0) and out["STOP_WORDS_IDS"].dtype == np.int32
    assert out["EMBEDDING_BIAS"].shape == (1, 0) and out["EMBEDDING_BIAS"].dtype == np.float32
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[5]]
    assert out["OUT_END_ID"].tolist() == [[1]] and out["OUT_PAD_ID"].tolist() == [[1]]
    assert "OUT_PROMPT_TABLE_EXTRA_IDS" not in out
    out = Preprocessor(tok, add_special_tokens=False)(
        {
            **inputs,
            "END_ID": np.array([[7]], dtype=np.int32),
            "PAD_ID": np.array([[9]], dtype=np.int32),
            "DECODER_QUERY": strings("Hello"),
            "PROMPT_TABLE_EXTRA_ID": np.array([[42]], dtype=np.uint64),
        }
    )
    assert out["OUT_END_ID"].tolist() == [[7]] and out["OUT_PAD_ID"].tolist() == [[9]]
    assert out["INPUT_ID"][0, 0] != tok.bos_id
    assert out["DECODER_INPUT_ID"].tolist() == [tok.encode("Hello", add_special_tokens=False)]
    extra = out["OUT_PROMPT_TABLE_EXTRA_IDS"]
    assert extra.dtype == np.uint64 and extra.shape == out["INPUT_ID"].shape and (extra == 42).all()


def test_stop_words_format(tok):
    words = np.array([[b"lazy dog", b"Hello", b""], [b"fox", b"", b""]], dtype=object)
    got = words_to_list_format(tok, words, 2)
    a = tok.encode("lazy dog", add_special_tokens=False)
    b = tok.encode("Hello", add_special_tokens=False)
    c = tok.encode("fox", add_special_tokens=False)
    width = len(a) + len(b)
    assert got.shape == (2, 2, width) and got.dtype == np.int32
    assert got[0, 0].tolist() == a + b
    assert got[0, 1].tolist() == [len(a), len(a) + len(b)] + [-1] * (width - 2)
    assert got[1, 0].tolist() == c + [0] * (width - len(c))
    assert got[1, 1].tolist() == [len(c)] + [-1] * (width - 1)
    assert tok.bos_id not in a + b + c  # words are tokenized without special tokens
    assert words_to_list_format(tok, None, 3).shape == (3, 2, 0)
    assert words_to_list_format(tok, np.array([[b""]], dtype=object), 1).tolist() == [[[0], [-1]]]


def test_embedding_bias(tok):
    words = np.array([[b"fox", b"dog"]], dtype=object)
    weights = np.array([[1.5, -2.0]], dtype=np.float32)
    out = Preprocessor(tok)(
        {
            "QUERY": strings("x"),
            "REQUEST_OUTPUT_LEN": np.array([[1]], dtype=np.int32),
            "EMBEDDING_BIAS_WORDS": words,
            "EMBEDDING_BIAS_WEIGHTS": weights,
        }
    )
    bias = out["EMBEDDING_BIAS"]
    assert bias.shape == (1, tok.vocab_size)
    expected = np.zeros(tok.vocab_size, dtype=np.float32)
    for word, weight in (("fox", 1.5), ("dog", -2.0)):
        for tid in tok.encode(word, add_special_tokens=False):
            expected[tid] += weight
    assert np.array_equal(bias[0], expected) and expected.any()
    with pytest.raises(ValueError, match="together"):
        Preprocessor(tok)(
            {
                "QUERY": strings("x"),
                "REQUEST_OUTPUT_LEN": np.array([[1]], dtype=np.int32),
                "EMBEDDING_BIAS_WORDS": words,
            }
        )


@pytest.mark.parametrize("name", ["IMAGE_BYTES", "IMAGE_URL", "VIDEO_BYTES"])
def test_multimodal_inputs_rejected(tok, name):
    with pytest.raises(ValueError, match=f"multimodal.*{name}"):
        Preprocessor(tok)(
            {
                "QUERY": strings("x"),
                "REQUEST_OUTPUT_LEN": np.array([[1]], dtype=np.int32),
                name: np.zeros((1, 1), dtype=object),
            }
        )


# -------------------------------------------------------------------------------------------- postprocessing
def test_postprocessing_beams_and_lengths(tok):
    a = tok.encode("Hello world", add_special_tokens=False)
    b = tok.encode("lazy dog", add_special_tokens=False)
    width = max(len(a), len(b)) + 3
    tokens = np.full((1, 2, width), tok.end_id, dtype=np.int32)
    tokens[0, 0, : len(a)] = a
    tokens[0, 1, : len(b)] = b
    lengths = np.array([[len(a), len(b)]], dtype=np.int32)
    assert split_sequences(tokens, lengths) == [a, b]
    out1, out2 = decode_batches(tok, [(tokens, lengths), (tokens[:, :1], lengths[:, :1])])
    assert out1.tolist() == [b"Hello world", b"lazy dog"]
    assert out2.tolist() == [b"Hello world"]
    bos_text = decode_batches(tok, [(np.array([[[0] + a]]), np.array([[len(a) + 1]]))], skip_special_tokens=False)
    assert bos_text[0][0].decode().startswith("<s>")


# ---------------------------------------------------------------------------------------------- BLS pipeline
class FakeServer:
    """preprocessing / postprocessing with the real logic, tensorrt_llm echoes input_ids (optionally in
    chunks, like a streaming engine), plus a final empty response when called decoupled."""

    def __init__(self, tok: TextTokenizer, chunk: int | None = None, fail: str | None = None) -> None:
        self.pre = Preprocessor(tok)
        self.tok = tok
        self.chunk = chunk
        self.fail = fail
        self.calls: list[tuple[str, set[str], bool]] = []
        self.request_ids: list[str] = []

    def __call__(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], decoupled: bool, request_id: str
    ) -> Iterator[dict[str, np.ndarray]]:
        self.calls.append((model, set(inputs), decoupled))
        self.request_ids.append(request_id)
        if model == self.fail:
            raise InnerModelError(f"{model}: boom")
        if model == "preprocessing":
            yield {k: v for k, v in self.pre(inputs).items() if k in outputs}
        elif model == "postprocessing":
            yield {"OUTPUT": decode_batches(self.tok, [(inputs["TOKENS_BATCH"], inputs["SEQUENCE_LENGTH"])])[0]}
        else:
            ids, n = inputs["input_ids"], int(inputs["input_lengths"][0, 0])
            step = self.chunk or n
            for start in range(0, n, step):
                part = ids[:, None, start : start + step]
                yield {
                    "output_ids": part,
                    "sequence_length": np.array([[part.shape[2]]], dtype=np.int32),
                    "batch_index": np.array([[0]], dtype=np.int32),
                }
            if decoupled:
                yield {}


def bls_inputs(text: str, **extra: object) -> dict[str, np.ndarray]:
    out = {"text_input": strings(text), "max_tokens": np.array([[8]], dtype=np.int32)}
    out.update({k: np.array([[v]]) for k, v in extra.items()})
    return out


def test_bls_gives_its_request_id_to_the_engine_request_only(tok):
    """As the ensemble does: a stop by the client's request id (the gateway's for a client that left) reaches the
    generation; the tokenizer models' calls carry none."""
    server = FakeServer(tok)
    list(BlsPipeline(server, decoupled=True).run(bls_inputs("Hello world", stream=True), "client-7"))
    assert list(zip((c[0] for c in server.calls), server.request_ids, strict=True))[:2] == [
        ("preprocessing", ""),
        ("tensorrt_llm", "client-7"),
    ]
    assert {
        rid for (model, *_), rid in zip(server.calls, server.request_ids, strict=True) if model == "postprocessing"
    } == {""}


def test_bls_non_streaming(tok):
    server = FakeServer(tok)
    outs = list(BlsPipeline(server, decoupled=False).run(bls_inputs("Hello world", top_k=1, stream=False)))
    assert len(outs) == 1 and outs[0]["text_output"].tolist() == [b"Hello world"]
    assert outs[0]["text_output"][0].decode("utf-8") == "Hello world"  # how upstream's clients read it
    assert outs[0]["batch_index"].tolist() == [[0]]
    llm_call = server.calls[1]
    assert llm_call[0] == "tensorrt_llm" and llm_call[2] is False
    assert {
        "input_ids",
        "input_lengths",
        "request_output_len",
        "end_id",
        "pad_id",
        "runtime_top_k",
        "streaming",
        "stop_words_list",
        "bad_words_list",
        "embedding_bias",
    } <= llm_call[1]


def test_bls_streaming_chunks_and_accumulate(tok):
    text = "Hello world, hello Triton! ünïcødé ✓"
    pieces = [
        o["text_output"][0].decode()
        for o in BlsPipeline(FakeServer(tok, chunk=2), decoupled=True).run(bls_inputs(text, stream=True))
    ]
    assert len(pieces) > 1 and "".join(pieces) == text
    acc = [
        o["text_output"][0].decode()
        for o in BlsPipeline(FakeServer(tok, chunk=2), decoupled=True, accumulate_tokens=True).run(
            bls_inputs(text, stream=True)
        )
    ]
    assert acc[-1] == text and all(text.startswith(a) for a in acc if "\ufffd" not in a)
    # one byte-level token per chunk: a multi-byte character split across chunks arrives whole
    chunks = list(BlsPipeline(FakeServer(tok, chunk=1), decoupled=True).run(bls_inputs("a✓é", stream=True)))
    pieces = [c["text_output"][0].decode() for c in chunks]
    assert "".join(pieces) == "a✓é" and "✓" in pieces and not any("\ufffd" in p for p in pieces)


def test_bls_errors(tok):
    with pytest.raises(ValueError, match="decoupled"):
        list(BlsPipeline(FakeServer(tok), decoupled=False).run(bls_inputs("x", stream=True)))
    with pytest.raises(InnerModelError, match="tensorrt_llm: boom"):
        list(BlsPipeline(FakeServer(tok, fail="tensorrt_llm"), decoupled=False).run(bls_inputs("x")))
    with pytest.raises(ValueError, match="draft"):
        list(BlsPipeline(FakeServer(tok), decoupled=False).run(bls_inputs("x", num_draft_tokens=3)))
    with pytest.raises(ValueError, match="multimodal"):
        list(
            BlsPipeline(FakeServer(tok), decoupled=False).run(
                {**bls_inputs("x"), "image_url_input": strings("http://x")}
            )
        )


@pytest.mark.parametrize(
    "inputs,message",
    [
        ({"QUERY": np.array([[b"ok \xff\xfe"]], dtype=object)}, "input QUERY is not valid UTF-8 \\(byte 3"),
        ({"QUERY": np.array([[b""]], dtype=object)}, "QUERY \\(text_input\\) is empty"),
        (
            {"REQUEST_OUTPUT_LEN": np.array([[0]], dtype=np.int32)},
            "REQUEST_OUTPUT_LEN \\(max_tokens\\) must be at least 1",
        ),
        ({"STOP_WORDS_DICT": np.array([[b"\xc3"]], dtype=object)}, "input STOP_WORDS_DICT is not valid UTF-8"),
    ],
)
def test_text_level_mistakes_are_named(tok, inputs, message):
    base = {"QUERY": strings("Hello"), "REQUEST_OUTPUT_LEN": np.array([[4]], dtype=np.int32)}
    with pytest.raises(ValueError, match=message):  # no BOS: an empty text really is no tokens
        Preprocessor(tok, add_special_tokens=False)({**base, **inputs})
