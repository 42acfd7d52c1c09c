"""Write small random-weight Hugging Face checkpoints (+ a trained BPE tokenizer) for tests, demos and benchmarks.

Why: CI, laptops and CPU partitions need a real-format model to serve without downloading anything.  The folder
is loadable by ``transformers`` (``AutoModelForCausalLM`` / ``AutoTokenizer``) so the CPU engine can be checked
token-for-token against the reference implementation, and by the CPU engine itself.

Usage: ``create_checkpoint(out_dir, family="gpt2"|"llama", size="tiny"|"small", seed=0)`` or
``python -m backend.cpu_engine.init_model DIR --family gpt2 --size tiny``.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import numpy as np

FAMILIES = ("gpt2", "llama")

# layers, hidden, heads, kv_heads (llama), intermediate (llama), vocab target, max positions
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=512, positions=256),
    "small": dict(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=768, vocab=1024, positions=512),
}

SPECIAL_TOKENS = {
    "gpt2": {
        "tokens": ["<|endoftext|>"],
        "bos": "<|endoftext|>",
        "eos": "<|endoftext|>",
        "pad": "<|endoftext|>",
        "unk": "<|endoftext|>",
    },
    "llama": {"tokens": ["<unk>", "<s>", "</s>", "<pad>"], "bos": "<s>", "eos": "</s>", "pad": "<pad>", "unk": "<unk>"},
}


def corpus_text() -> str:
    """The English text shipped in ``backend/data/`` that tokenizers are trained on."""
    corpus = resources.files("backend").joinpath("data").joinpath("corpus.txt")  # joinpath takes one name in 3.10
    return corpus.read_text(encoding="utf-8")


def train_tokenizer(family: str, vocab_size: int) -> Any:
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on the shipped corpus (Llama variant prepends ``<s>``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    spec = SPECIAL_TOKENS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(spec["tokens"]),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = corpus_text()
    tok.train_from_iterator([line for line in text.splitlines() if line.strip()], trainer=trainer)
    if family == "llama":
        bos = str(spec["bos"])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _hf_config(family: str, dims: dict[str, int], vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    if family == "gpt2":
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": vocab,
            "n_embd": dims["hidden"],
            "n_layer": dims["layers"],
            "n_head": dims["heads"],
            "n_positions": dims["positions"],
            "n_inner": None,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True,
            "bos_token_id": ids["bos"],
            "eos_token_id": ids["eos"],
            "pad_token_id": ids["pad"],
            "torch_dtype": "float32",
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": dims["hidden"],
        "intermediate_size": dims["intermediate"],
        "num_hidden_layers": dims["layers"],
        "num_attention_heads": dims["heads"],
        "num_key_value_heads": dims["kv_heads"],
        "head_dim": dims["hidden"] // dims["heads"],
        "max_position_embeddings": dims["positions"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "torch_dtype": "float32",
    }


def _random_weights(family: str, dims: dict[str, int], vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Random fp32 weights large enough that logits are decisive (so greedy comparisons are not decided by ties)."""
    rng = np.random.default_rng(seed)
    H, L, inter = dims["hidden"], dims["layers"], dims["intermediate"]
    lin_std = 1.0 / np.sqrt(H)

    def n(*shape: int, std: float = lin_std) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_w() -> np.ndarray:
        return (1.0 + rng.standard_normal(H) * 0.1).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    if family == "gpt2":
        w["transformer.wte.weight"] = n(vocab, H, std=0.15)
        w["transformer.wpe.weight"] = n(dims["positions"], H, std=0.05)
        for i in range(L):
            p = f"transformer.h.{i}."
            w[p + "ln_1.weight"], w[p + "ln_1.bias"] = norm_w(), n(H, std=0.02)
            w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = n(H, 3 * H), n(3 * H, std=0.02)
            w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = n(H, H), n(H, std=0.02)
            w[p + "ln_2.weight"], w[p + "ln_2.bias"] = norm_w(), n(H, std=0.02)
            w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = n(H, 4 * H), n(4 * H, std=0.02)
            w[p + "mlp.c_proj.weight"] = n(4 * H, H, std=1.0 / np.sqrt(4 * H))
            w[p + "mlp.c_proj.bias"] = n(H, std=0.02)
        w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = norm_w(), n(H, std=0.02)
        return w
    D = H // dims["heads"]
    KV = dims["kv_heads"] * D
    w["model.embed_tokens.weight"] = n(vocab, H, std=0.15)
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_w()
        w[p + "self_attn.q_proj.weight"] = n(H, H)
        w[p + "self_attn.k_proj.weight"] = n(KV, H)
        w[p + "self_attn.v_proj.weight"] = n(KV, H)
        w[p + "self_attn.o_proj.weight"] = n(H, H)
        w[p + "post_attention_layernorm.weight"] = norm_w()
        w[p + "mlp.gate_proj.weight"] = n(inter, H)
        w[p + "mlp.up_proj.weight"] = n(inter, H)
        w[p + "mlp.down_proj.weight"] = n(H, inter, std=1.0 / np.sqrt(inter))
    w["model.norm.weight"] = norm_w()
    w["lm_head.weight"] = n(vocab, H, std=0.15)
    return w


def _write_tokenizer_files(tmp: str, family: str, tok: Any, max_positions: int) -> None:
    spec = SPECIAL_TOKENS[family]
    tok.save(os.path.join(tmp, "tokenizer.json"))
    special = {k + "_token": spec[k] for k in ("bos", "eos", "pad", "unk")}
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_positions,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": family == "llama",
        **special,
    }
    with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_cfg, f, indent=2)
    with open(os.path.join(tmp, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2)


def special_ids(family: str, tok: Any) -> dict[str, int]:
    """The ids of the family's bos, eos and pad tokens in the trained tokenizer `tok`."""
    spec = SPECIAL_TOKENS[family]
    return {k: tok.token_to_id(spec[k]) for k in ("bos", "eos", "pad")}


def write_model_files(folder: str, family: str, tok: Any, config: dict[str, Any], max_positions: int) -> None:
    """A checkpoint's files besides the weights: the tokenizer's (`max_positions` its longest input), config.json
    and generation_config.json (config's special token ids)."""
    _write_tokenizer_files(folder, family, tok, max_positions)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(folder, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({k + "_token_id": config[k + "_token_id"] for k in ("bos", "eos", "pad")}, f, indent=2)


def publish_folder(tmp: str, out: str, is_complete: Callable[[str], bool], overwrite: bool = False) -> str:
    """Rename the folder built at `tmp` into place at `out` (readable by all), so a reader sees nothing or the whole
    folder; a complete `out` a racing writer published first is kept (`tmp` removed) unless `overwrite`, an empty
    one (a placeholder) replaced. Returns `out`."""
    os.chmod(tmp, 0o755)
    for name in os.listdir(tmp):
        os.chmod(os.path.join(tmp, name), 0o644)
    if os.path.exists(out):
        if overwrite:
            shutil.rmtree(out, ignore_errors=True)
        elif is_complete(out):  # another writer finished first
            shutil.rmtree(tmp, ignore_errors=True)
            return out
        else:
            try:
                os.rmdir(out)  # empty placeholder
            except OSError:
                pass
    try:
        os.rename(tmp, out)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST) and is_complete(out):
            shutil.rmtree(tmp, ignore_errors=True)  # another writer won the race
        else:
            raise
    return out


def _is_complete(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, n)) for n in ("config.json", "model.safetensors", "tokenizer.json"))


def create_checkpoint(
    out_dir: str | os.PathLike[str], family: str = "gpt2", size: str = "tiny", seed: int = 0, overwrite: bool = False
) -> str:
    """Write a random-weight HF checkpoint + tokenizer to ``out_dir`` atomically; return its absolute path.

    The folder is built under a temporary name next to ``out_dir`` and renamed into place, so concurrent jobs see
    either nothing or a complete checkpoint.  An existing complete checkpoint is kept unless ``overwrite``
    (generation is deterministic for a given family/size/seed, so racing writers produce identical folders).
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {tuple(SIZES)}, got {size!r}")
    from safetensors.numpy import save_file

    out = os.path.abspath(os.fspath(out_dir))
    if os.path.exists(out) and not overwrite:
        if _is_complete(out):
            return out
        if os.listdir(out):
            raise FileExistsError(f"{out} exists, is not empty and is not a complete checkpoint")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    dims = SIZES[size]
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        tok = train_tokenizer(family, dims["vocab"])
        vocab = tok.get_vocab_size()
        ids = special_ids(family, tok)
        write_model_files(tmp, family, tok, _hf_config(family, dims, vocab, ids), dims["positions"])
        save_file(
            _random_weights(family, dims, vocab, seed),
            os.path.join(tmp, "model.safetensors"),
            metadata={"format": "pt"},
        )
        return publish_folder(tmp, out, _is_complete, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``init-model DIR [--family gpt2|llama] [--size tiny|small] [--weights-seed N] [--overwrite]``."""
    ap = argparse.ArgumentParser(
        prog="init-model", description="Write a small random-weight HF checkpoint + tokenizer."
    )
    ap.add_argument("dir")
    ap.add_argument("--family", choices=FAMILIES, default="gpt2")
    ap.add_argument("--size", choices=tuple(SIZES), default="tiny")
    ap.add_argument("--weights-seed", type=int, default=0)
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    path = create_checkpoint(args.dir, args.family, args.size, args.weights_seed, args.overwrite)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
