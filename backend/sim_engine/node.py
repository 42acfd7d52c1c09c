"""The simulated engine behind the stand-in's leader and worker nodes (the `EngineKind` of backend/cpu_engine/
llmapi/kind.py): model.yaml's LLM arguments and the checkpoint's config.json → a `SimEngine` on rank 0; the other
ranks of a tensor-parallel replica only answer the leader's heartbeat until it releases them (the step's time
already counts their share and their all-reduces: timing.py).

LLM arguments it acts on beyond the CPU engine's (engine_args.py): `max_num_tokens` and
`kv_cache_config.free_gpu_memory_fraction`; `max_batch_size` and `max_num_tokens` default to TensorRT-LLM's
(2048, 8192), the fraction to 0.9. The GPU is `HPC_SERVE_SIM_GPU` (the spec's model.sim.gpu, launch.json's env), the pace `HPC_SERVE_SIM_SLOWDOWN`
(model.sim.slowdown).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from backend.cpu_engine.follower import leader_messages
from backend.cpu_engine.llmapi.engine_args import EngineArgsError, WorkerLoad
from backend.cpu_engine.llmapi.kind import LeaderLoad, Started
from backend.cpu_engine.parallel import Communicator
from launcher.contracts.llmapi import SIM_GPU_VAR, SIM_SLOWDOWN_VAR

from .engine import SimEngine, SimModel
from .kv_cache import PagedKvCache
from .profiles import DEFAULT_GPU, GPUS, ModelFacts
from .text import CorpusText
from .timing import StepTiming

log = logging.getLogger("hpc_serve.sim_engine")

#: TensorRT-LLM's LLM API defaults (BaseLlmArgs max_batch_size, max_num_tokens; KvCacheConfig's memory share)
DEFAULT_MAX_BATCH_SIZE = 2048
DEFAULT_MAX_NUM_TOKENS = 8192
DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.9
#: model.yaml's arguments the simulated engine acts on that the CPU engine lists as ignored
ACTS_ON = ("max_num_tokens", "kv_cache_config.free_gpu_memory_fraction")


def gpu_name(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(SIM_GPU_VAR) or DEFAULT_GPU


def slowdown(environ: Mapping[str, str] | None = None) -> float:
    """`HPC_SERVE_SIM_SLOWDOWN` (model.sim.slowdown): how many times the GPU's time a step takes; 1 when unset."""
    text = (os.environ if environ is None else environ).get(SIM_SLOWDOWN_VAR) or "1"
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 1 <= value <= 1000:
        raise EngineArgsError(f"{SIM_SLOWDOWN_VAR}={text!r}: a number from 1 to 1000")
    return value


def _positive(llm_args: Mapping[str, Any], key: str, default: int) -> int:
    value = llm_args.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineArgsError(f"model.yaml: {key} must be a positive integer, got {value!r}")
    return value


def build_engine(
    checkpoint: str,
    llm_args: Mapping[str, Any],
    tp: int = 1,
    gpu: str = DEFAULT_GPU,
    *,
    block_reuse: bool = True,
    tokens_per_block: int = 32,
    kv_cache_tokens: int | None = None,
    comm: Communicator | None = None,
    on_kv_event: Callable[[dict], None] | None = None,
    slowed: float = 1.0,
) -> SimEngine:
    """A simulated engine for `checkpoint` (its config.json and tokenizer) on `tp` GPUs named `gpu`."""
    profile = GPUS.get(gpu)
    if profile is None:
        raise EngineArgsError(f"{SIM_GPU_VAR}={gpu!r}: the simulated GPUs are {', '.join(GPUS)}")
    with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as f:
        facts = ModelFacts.from_config(json.load(f))
    timing = StepTiming(profile, facts, tp)
    kv = llm_args.get("kv_cache_config") or {}
    fraction = kv.get("free_gpu_memory_fraction")
    if fraction is None:  # the LLM sends KvCacheConfig whole, unset fields as None
        fraction = DEFAULT_FREE_GPU_MEMORY_FRACTION
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise EngineArgsError(
            f"model.yaml: kv_cache_config.free_gpu_memory_fraction must be in (0, 1], got {fraction!r}"
        )
    tokens = timing.kv_capacity_tokens(float(fraction))
    if kv_cache_tokens is not None:
        tokens = min(tokens, kv_cache_tokens)  # TensorRT-LLM takes the smaller of the two
    if tokens < tokens_per_block:
        raise EngineArgsError(
            f"the weights of this model leave no KV cache on {tp} simulated {gpu.upper()} GPU(s): raise "
            "tensor_parallel_size or kv_cache_config.free_gpu_memory_fraction"
        )
    text = CorpusText(checkpoint)
    max_seq_len = _positive(llm_args, "max_seq_len", min(facts.max_positions, tokens))
    return SimEngine(
        timing=timing,
        cache=PagedKvCache(tokens // tokens_per_block, tokens_per_block, block_reuse, on_kv_event),
        text=text,
        max_batch_size=_positive(llm_args, "max_batch_size", DEFAULT_MAX_BATCH_SIZE),
        max_num_tokens=_positive(llm_args, "max_num_tokens", DEFAULT_MAX_NUM_TOKENS),
        max_seq_len=max_seq_len,
        model=SimModel(family="llama", vocab_size=text.vocab_size),
        comm=comm,
        slowdown=slowed,
    )


class SimKind:
    name = "sim"

    def leader(self, load: LeaderLoad) -> Started:
        args = load.args
        engine = build_engine(
            args.load.model,
            load.llm_args,
            args.tp_size,
            gpu_name(),
            block_reuse=args.block_reuse,
            tokens_per_block=args.tokens_per_block,
            kv_cache_tokens=args.kv_cache_tokens,
            comm=load.comm,
            on_kv_event=load.on_kv_event,
            slowed=slowdown(),
        )
        log.info(
            "simulated %s x%d: %.0f GB of weights per GPU, KV cache %d blocks of %d tokens",
            gpu_name().upper(),
            args.tp_size,
            engine.timing.weight_bytes / 1e9,
            engine.cache.max_blocks,
            engine.cache.tokens_per_block,
        )
        return Started(engine, engine.max_seq_len, [k for k in args.ignored if k not in ACTS_ON])

    def worker(self, load: WorkerLoad, comm: Communicator) -> None:
        """Answer the leader's heartbeats until it says stop (or goes silent)."""
        for _ in leader_messages(comm):
            pass


SIM = SimKind()
