"""The timing model against TensorRT-LLM's published throughput: `python -m backend.sim_engine.calibrate` runs
each point of the perf overview
(NVIDIA/TensorRT-LLM/docs/source/performance/perf-overview.md@00f37686aa854010d68bcbd0f4ab000221541ca6, "Llama 3.1 8B" and "Llama 3.3 70B": total output tokens/s, trtllm-bench throughput, FP8, random prompts of ISL tokens
asking OSL) through the simulated engine on its own clock, and prints published, simulated and their ratio.
The engine runs as trtllm-bench leaves it: LLM API defaults (max_batch_size 2048, max_num_tokens 8192), KV cache
0.9 of free memory (the overview says 0.95 where it fit; 0.9 is the default), block reuse off (random prompts
share nothing). docs/decisions.md "A simulated engine at a GPU's pace" holds the table this prints.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from backend.cpu_engine.scheduler import GenerationRequest

from .engine import SimEngine, SimModel
from .kv_cache import PagedKvCache
from .profiles import GPUS, ModelFacts, model_config
from .text import CorpusText
from .timing import StepTiming

#: the published points: (model, gpu, tp) → {(isl, osl): total output tokens/s}
PUBLISHED: dict[tuple[str, str, int], dict[tuple[int, int], float]] = {
    ("llama-3.1-8b", "h200", 1): {
        (128, 128): 27911,
        (128, 2048): 26221,
        (500, 2000): 20770,
        (1000, 1000): 17744,
        (2048, 128): 3538,
        (2048, 2048): 12194,
        (5000, 500): 3902,
    },
    ("llama-3.1-8b", "h100", 1): {
        (128, 128): 28312,
        (128, 2048): 22714,
        (500, 2000): 17660,
        (1000, 1000): 15220,
        (2048, 128): 3450,
        (2048, 2048): 9305,
        (5000, 500): 3459,
    },
    # Llama 3.3 70B: Llama 3.1 70B's architecture (same config.json dimensions)
    ("llama-3.1-70b", "h200", 1): {
        (128, 128): 3803,
        (128, 2048): 4336,
        (1000, 1000): 2909,
        (2048, 128): 442,
        (2048, 2048): 2003,
    },
    ("llama-3.1-70b", "h100", 2): {
        (128, 128): 6378,
        (128, 2048): 6651,
        (1000, 1000): 4205,
        (2048, 128): 762,
        (2048, 2048): 3082,
    },
}
#: the LLM API's defaults trtllm-bench runs with
MAX_BATCH_SIZE = 2048
MAX_NUM_TOKENS = 8192
FREE_FRACTION = 0.9
TOKENS_PER_BLOCK = 32


@dataclass(frozen=True)
class Point:
    model: str
    gpu: str
    tp: int
    isl: int
    osl: int
    published: float
    simulated: float

    @property
    def ratio(self) -> float:
        return self.simulated / self.published


def simulate(model: str, gpu: str, tp: int, isl: int, osl: int, requests: int | None = None, seed: int = 0) -> float:
    """Total output tokens/s of `requests` random prompts (default: enough to fill the batch three times over)."""
    facts = ModelFacts.from_config(model_config(model))
    timing = StepTiming(GPUS[gpu], facts, tp)
    blocks = timing.kv_capacity_tokens(FREE_FRACTION) // TOKENS_PER_BLOCK
    cache = PagedKvCache(blocks, TOKENS_PER_BLOCK, reuse=False)
    fits = min(MAX_BATCH_SIZE, blocks // cache.blocks_for(isl + osl))
    rng = np.random.default_rng(seed)
    engine = SimEngine(
        timing=timing,
        cache=cache,
        text=CorpusText(ids=rng.integers(0, facts.vocab, 4096)),
        max_batch_size=MAX_BATCH_SIZE,
        max_num_tokens=MAX_NUM_TOKENS,
        max_seq_len=isl + osl,
        model=SimModel("llama", facts.vocab),
    )
    n = requests or 3 * fits
    reqs = [GenerationRequest(input_ids=rng.integers(0, facts.vocab, isl), max_new_tokens=osl) for _ in range(n)]
    seconds = engine.run_offline(reqs)
    return n * osl / seconds


def points(scale: float = 1.0) -> list[Point]:
    found = []
    for (model, gpu, tp), table in PUBLISHED.items():
        for (isl, osl), published in table.items():
            found.append(Point(model, gpu, tp, isl, osl, published, simulate(model, gpu, tp, isl, osl)))
    return found


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m backend.sim_engine.calibrate", description=__doc__).parse_args(argv)
    print("| model | GPU | tp | ISL/OSL | published tok/s | simulated tok/s | simulated / published |")
    print("|---|---|---|---|---:|---:|---:|")
    for p in points():
        print(
            f"| {p.model} | {p.gpu.upper()} | {p.tp} | {p.isl}/{p.osl} | {p.published:,.0f} | {p.simulated:,.0f} "
            f"| {p.ratio:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
