"""Does the simulated engine keep a GPU's pace, and what CPU does it cost? N simulated H200s (Llama 3.1 8B), each
at max_batch_size 64 and kept full by streaming requests, run in real time in this one process (N engine threads,
one GIL: harder than a deployment's N leader-node processes). Printed side by side, in one run: each engine's GPU
time (the sum of its steps' simulated durations) against the wall clock (1.00: it kept the GPU's pace; below: the
bookkeeping fell behind), the aggregate tokens/s, and the CPU the process used per wall second (cores).

    python benchmarks/bench_sim_engine.py --engines 8 --seconds 10
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from backend.cpu_engine.scheduler import GenerationOutput, GenerationRequest
from backend.sim_engine.checkpoint import create_sim_checkpoint
from backend.sim_engine.engine import SimEngine
from backend.sim_engine.node import build_engine


class Feeder:
    """Keeps `batch` streaming requests in one engine until told to stop; counts the tokens streamed."""

    def __init__(self, engine: SimEngine, batch: int, isl: int, osl: int, seed: int) -> None:
        self.engine, self.isl, self.osl = engine, isl, osl
        self.rng = np.random.default_rng(seed)
        self.tokens = 0
        self.stopping = False
        self.idle = threading.Event()
        self.live = 0
        self.lock = threading.Lock()
        for _ in range(batch):
            self.submit()

    def submit(self) -> None:
        with self.lock:
            self.live += 1
        prompt = self.rng.integers(3, 1000, self.isl)
        req = GenerationRequest(input_ids=prompt, max_new_tokens=self.osl, streaming=True, on_output=self.on_output)
        self.engine.submit(req)

    def on_output(self, out: GenerationOutput) -> None:
        self.tokens += len(out.new_tokens)
        if out.finished:
            with self.lock:
                self.live -= 1
                if self.stopping and self.live == 0:
                    self.idle.set()
            if not self.stopping:
                self.submit()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--isl", type=int, default=512)
    ap.add_argument("--osl", type=int, default=256)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = create_sim_checkpoint(Path(tmp) / "sim-llama-3.1-8b", "llama-3.1-8b")
        engines = [build_engine(checkpoint, {"max_batch_size": args.batch}, gpu="h200") for _ in range(args.engines)]
        for e in engines:
            e.start()
        feeders = [Feeder(e, args.batch, args.isl, args.osl, i) for i, e in enumerate(engines)]
        wall0, cpu0 = time.monotonic(), time.process_time()
        busy0 = [e.busy_s for e in engines]
        tokens0 = [f.tokens for f in feeders]
        time.sleep(args.seconds)  # a benchmark's measuring window, not a test's wait
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        busy = [e.busy_s - b for e, b in zip(engines, busy0, strict=True)]
        tokens = sum(f.tokens - t for f, t in zip(feeders, tokens0, strict=True))
        for f in feeders:
            f.stopping = True
        for e in engines:
            e.shutdown()
    pace = [b / wall for b in busy]
    print(
        f"{args.engines} simulated H200 engines (Llama 3.1 8B), batch {args.batch}, ISL/OSL {args.isl}/{args.osl}, {wall:.1f} s"
    )
    print(
        f"GPU time / wall time per engine: min {min(pace):.2f}  mean {sum(pace) / len(pace):.2f}  (1.00: a GPU's pace)"
    )
    print(f"aggregate: {tokens / wall:,.0f} tokens/s streamed, {tokens / wall / args.engines:,.0f} per engine")
    print(f"CPU: {cpu / wall:.2f} cores for {args.engines} engines ({cpu / max(tokens, 1) * 1e6:.1f} us per token)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
