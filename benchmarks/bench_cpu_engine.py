"""Decode throughput of the CPU engine vs Hugging Face ``generate`` on the same checkpoint, side by side.

For each concurrency C (default 1, 8, 32): C requests (prompt lengths 24..40 tokens, ``--new-tokens`` each, no
early stop) are generated
  - by the engine: all submitted at once, in-flight batched, KV-cached numpy decode;
  - by HF ``generate``: one padded batch of C (left padding + attention mask, KV cache on, greedy), i.e. HF's
    best batched mode on CPU (torch, default threads).
Throughput = generated tokens / wall time (prefill included for both).  Greedy outputs are also compared
(token agreement), so the two are known to do the same work.

Fairness on a small shared machine: both sides first run the exact timed workload once untimed (first-touch page
faults, allocator and thread-pool start-up, the engine's KV-cache growth, torch's first-call paths), then the timed
runs alternate engine / HF ``--repeats`` times and the median of each side is reported, so a burst of load from
other processes does not land on one side only.

    python benchmarks/bench_cpu_engine.py [--family llama|gpt2] [--size small] [--new-tokens 64] [--conc 1 8 32]
                                          [--repeats 3]
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


def engine_runner(path: str, max_batch: int):
    eng = Engine(path, max_batch_size=max_batch)

    def run(prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
        reqs = [GenerationRequest(input_ids=p, max_new_tokens=new_tokens) for p in prompts]
        t0 = time.perf_counter()
        for r in reqs:
            eng.submit(r)
        eng.run_until_idle()
        dt = time.perf_counter() - t0
        assert all(len(r.output_ids) == new_tokens for r in reqs)
        return sum(len(r.output_ids) for r in reqs) / dt, [r.output_ids for r in reqs]

    return run


def hf_runner(model, pad_id: int):
    import torch

    def run(prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        kw = dict(
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad_id,
            eos_token_id=None,
            use_cache=True,
        )
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, **kw)
            dt = time.perf_counter() - t0
        gen = out[:, width:]
        return gen.numel() / dt, gen.tolist()

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=("llama", "gpt2"), default="llama")
    ap.add_argument("--size", default="small")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--conc", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per side (alternating); median reported")
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
    print(
        f"checkpoint {path} ({args.family} {args.size}: {cfg.num_hidden_layers if hasattr(cfg, 'num_hidden_layers') else cfg.n_layer} layers, "
        f"vocab {cfg.vocab_size}); torch threads {torch.get_num_threads()}, cores {os.cpu_count()}, "
        f"{args.new_tokens} new tokens per request, median of {args.repeats} alternating timed runs after a warm-up"
    )
    print(f"{'concurrent':>10} {'engine tok/s':>13} {'HF tok/s':>10} {'ratio':>7} {'greedy agree':>13}")
    for c in args.conc:
        prompts = make_prompts(c, cfg.vocab_size, seed=c)
        ours_run, hf_run = engine_runner(path, max_batch=max(c, 1)), hf_runner(model, pad)
        _, ours_tokens = ours_run(prompts, args.new_tokens)  # untimed warm-up of the exact workload, both sides
        _, hf_tokens = hf_run(prompts, args.new_tokens)
        ours_s, hf_s = [], []
        for _ in range(max(1, args.repeats)):
            ours_s.append(ours_run(prompts, args.new_tokens)[0])
            hf_s.append(hf_run(prompts, args.new_tokens)[0])
        ours, hf = float(np.median(ours_s)), float(np.median(hf_s))
        agree = np.mean([a == b for a, b in zip(ours_tokens, hf_tokens, strict=False)])
        print(f"{c:>10} {ours:>13.1f} {hf:>10.1f} {ours / hf:>6.2f}x {agree:>12.0%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
