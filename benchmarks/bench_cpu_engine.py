"""Decode throughput of the CPU engine vs Hugging Face ``generate`` on the same checkpoint, side by side.

For each concurrency C (default 1, 8, 32): C requests (prompt lengths 24..40 tokens, ``--new-tokens`` each, no
early stop) are generated
  - by the engine: all submitted at once, in-flight batched, KV-cached numpy decode;
  - by HF ``generate``: one padded batch of C (left padding + attention mask, KV cache on, greedy), i.e. HF's
    best batched mode on CPU (torch, default threads).
Throughput = generated tokens / wall time (prefill included for both).  Greedy outputs are also compared
(token agreement), so the two are known to do the same work.

    python benchmarks/bench_cpu_engine.py [--family llama|gpt2] [--size small] [--new-tokens 64] [--conc 1 8 32]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.cpu_engine.engine import Engine  # noqa: E402
from backend.cpu_engine.init_model import create_checkpoint  # noqa: E402
from backend.cpu_engine.scheduler import GenerationRequest  # noqa: E402


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(10, vocab, size=int(rng.integers(24, 41))).tolist() for _ in range(n)]


def bench_engine(path: str, prompts: list[list[int]], new_tokens: int, max_batch: int) -> tuple[float, list[list[int]]]:
    eng = Engine(path, max_batch_size=max_batch)
    eng.generate(GenerationRequest(input_ids=prompts[0], max_new_tokens=4))  # warm-up (cache allocation)
    reqs = [GenerationRequest(input_ids=p, max_new_tokens=new_tokens) for p in prompts]
    t0 = time.perf_counter()
    for r in reqs:
        eng.submit(r)
    eng.run_until_idle()
    dt = time.perf_counter() - t0
    assert all(len(r.output_ids) == new_tokens for r in reqs)
    return sum(len(r.output_ids) for r in reqs) / dt, [r.output_ids for r in reqs]


def bench_hf(model, pad_id: int, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    kw = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id,
              eos_token_id=None)
    with torch.no_grad():
        model.generate(ids[:1, -8:], attention_mask=mask[:1, -8:], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, **kw)
        dt = time.perf_counter() - t0
    gen = out[:, width:]
    return gen.numel() / dt, gen.tolist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=("llama", "gpt2"), default="llama")
    ap.add_argument("--size", default="small")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--conc", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--model-dir", default=None, help="existing checkpoint (default: a fresh random one)")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    path = args.model_dir or create_checkpoint(
        Path(tempfile.gettempdir()) / f"hpc-serve-bench-{args.family}-{args.size}", family=args.family, size=args.size
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cfg = model.config
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    print(f"checkpoint {path} ({args.family} {args.size}: {cfg.num_hidden_layers if hasattr(cfg, 'num_hidden_layers') else cfg.n_layer} layers, "
          f"vocab {cfg.vocab_size}); torch threads {torch.get_num_threads()}, cores {os.cpu_count()}, "
          f"{args.new_tokens} new tokens per request")
    print(f"{'concurrent':>10} {'engine tok/s':>13} {'HF tok/s':>10} {'ratio':>7} {'greedy agree':>13}")
    for c in args.conc:
        prompts = make_prompts(c, cfg.vocab_size, seed=c)
        ours, ours_tokens = bench_engine(path, prompts, args.new_tokens, max_batch=max(c, 1))
        hf, hf_tokens = bench_hf(model, pad, prompts, args.new_tokens)
        agree = np.mean([a == b for a, b in zip(ours_tokens, hf_tokens)])
        print(f"{c:>10} {ours:>13.1f} {hf:>10.1f} {ours / hf:>6.2f}x {agree:>12.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
