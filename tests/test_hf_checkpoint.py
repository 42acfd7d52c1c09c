"""A checkpoint as `transformers` saves it (`save_pretrained` of a model and of a fast tokenizer: the folder a user
of NVIDIA's llmapi path already has) loads in the CPU engine, and its greedy tokens equal transformers' own
`generate(do_sample=False)`; the llmapi model's tokenizer (backend/models/tokenizer.py) encodes as AutoTokenizer.

Unlike tests/test_cpu_engine.py, whose checkpoints init_model writes, nothing here is written by hpc-serve.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend.cpu_engine.engine import Engine
from backend.cpu_engine.init_model import train_tokenizer
from backend.cpu_engine.scheduler import GenerationRequest
from backend.models.tokenizer import load_tokenizer
from tests.e2e import transformers_greedy

pytestmark = pytest.mark.slow  # imports torch and transformers
VOCAB = 320
TEXTS = ["The current time is", "Born in north-east France, Soyer trained as a", "A"]
NEW_TOKENS = 12


def _model(family: str):
    import transformers

    common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if family == "gpt2":
        config = transformers.GPT2Config(n_positions=128, n_embd=64, n_layer=2, n_head=4, **common)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=128,
        tie_word_embeddings=False,
        **common,
    )
    return transformers.LlamaForCausalLM(config)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def saved(request, tmp_path_factory):
    """(folder, model, tokenizer): a random model with weights large enough that greedy tokens vary, and a BPE
    tokenizer, both saved by transformers."""
    torch = pytest.importorskip("torch")
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(7)
    model = _model(request.param).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name and "ln_" not in name:
                param.normal_(0.0, 0.3)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer("gpt2", VOCAB), eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    folder = tmp_path_factory.mktemp("hf") / request.param
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder), model, tokenizer


def test_greedy_tokens_equal_transformers_generate(saved):

    folder, model, tokenizer = saved
    engine = Engine(str(folder), max_batch_size=len(TEXTS))
    requests = [
        GenerationRequest(input_ids=tokenizer(t)["input_ids"], max_new_tokens=NEW_TOKENS, end_id=None) for t in TEXTS
    ]
    for req in requests:
        engine.submit(req)
    engine.run_until_idle()
    outputs = []
    for text, req in zip(TEXTS, requests, strict=True):
        prompt = tokenizer(text)["input_ids"]
        expected = transformers_greedy(model, prompt, NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
        assert req.output_ids == expected, (text, req.output_ids, expected)
        outputs.append(expected)
    assert len({tuple(o) for o in outputs}) > 1 and any(len(set(o)) > 2 for o in outputs)  # not a constant


def test_tokenizer_encodes_as_autotokenizer(saved):
    from transformers import AutoTokenizer

    folder, _model_, _tokenizer = saved
    ours, theirs = load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert ours.encode(text) == ids
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.end_id == theirs.eos_token_id
    assert np.asarray(ours.encode(TEXTS[0])).max() < VOCAB
