"""model.yaml's LLM API arguments → the CPU engine's settings, on the leader node (and, through `WorkerLoad`, on
every worker). Why one function: the leader and its workers must cut the same shard of the same checkpoint.

Arguments the CPU engine acts on: `model` (the Hugging Face checkpoint folder), `tensor_parallel_size` (= the MPI
world), `pipeline_parallel_size` (1 only), `max_batch_size`, `max_seq_len`, `kv_cache_config.max_tokens`,
`kv_cache_config.enable_block_reuse` and `.tokens_per_block` (TensorRT-LLM's defaults: on, 32: prefix_cache.py); the
rest (GPU memory fractions, CUDA graphs, chunked prefill, ...) have no CPU meaning and are listed back as ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backend.cpu_engine.prefix_cache import DEFAULT_TOKENS_PER_BLOCK

#: the CPU engine's batch when model.yaml names none: TensorRT-LLM's default (2048) would preallocate a KV slot
#: per request in numpy
DEFAULT_MAX_BATCH_SIZE = 8
USED = ("model", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_seq_len", "kv_cache_config")
KV_USED = ("max_tokens", "enable_block_reuse", "tokens_per_block", "event_buffer_max_size")
#: read by the model (backend/models/llmapi.py), not the engine
MODEL_SIDE = ("tokenizer", "backend", "gpus_per_node", "trust_remote_code")


class EngineArgsError(ValueError):
    """model.yaml asks for something the CPU engine cannot do; the message names the argument and the fix."""


@dataclass(frozen=True)
class WorkerLoad:
    """What the leader broadcasts to its workers once the model sent `load` (over MPI, not the IPC wire)."""

    model: str
    max_batch_size: int
    max_seq_len: int | None


@dataclass(frozen=True)
class EngineArgs:
    load: WorkerLoad
    tp_size: int
    kv_cache_tokens: int | None
    ignored: list[str]
    #: kv_cache_config.enable_block_reuse / tokens_per_block (KvCacheConfig's defaults in TensorRT-LLM's llm_args.py)
    block_reuse: bool = True
    tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK
    #: kv_cache_config.event_buffer_max_size: KV-cache events kept for `get_kv_cache_events` (0: none, upstream's
    #: default; events need block reuse too)
    kv_event_buffer: int = 0


def _int(args: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = args.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineArgsError(f"model.yaml: {key} must be a positive integer, got {value!r}")
    return value


def _count(args: Mapping[str, Any], key: str) -> int:
    value = args.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EngineArgsError(f"model.yaml: kv_cache_config.{key} must be an integer >= 0, got {value!r}")
    return value


def checkpoint_folder(llm_args: Mapping[str, Any]) -> str:
    """The absolute checkpoint folder model.yaml names (how two loads are compared)."""
    return os.path.abspath(str(llm_args.get("model", "")))


def engine_args(llm_args: Mapping[str, Any], world_size: int) -> EngineArgs:
    """Check and map the arguments for a leader node whose MPI world has `world_size` ranks."""
    model = llm_args.get("model")
    if not isinstance(model, str) or not model:
        raise EngineArgsError("model.yaml: model must name a Hugging Face checkpoint folder")
    if not os.path.isdir(model):
        raise EngineArgsError(
            f"model.yaml: model {model!r} is not a folder on this node; the CPU engine loads a local Hugging Face "
            "checkpoint (config.json, *.safetensors, tokenizer files), not a hub name"
        )
    tp = _int(llm_args, "tensor_parallel_size", 1) or 1
    pp = _int(llm_args, "pipeline_parallel_size", 1) or 1
    if pp != 1:
        raise EngineArgsError(f"model.yaml: pipeline_parallel_size {pp}: the CPU engine runs tensor parallelism only")
    if tp != world_size:
        raise EngineArgsError(
            f"model.yaml: tensor_parallel_size {tp} but the leader node's MPI world has {world_size} rank(s): "
            f"start tp x pp = {tp} tasks (rank 0 the leader node, the others worker nodes)"
        )
    kv = llm_args.get("kv_cache_config") or {}
    if not isinstance(kv, Mapping):
        raise EngineArgsError(f"model.yaml: kv_cache_config must be a mapping, got {kv!r}")
    kv_tokens = _int(kv, "max_tokens", None)
    reuse = kv.get("enable_block_reuse", True)
    if not isinstance(reuse, bool):
        raise EngineArgsError(f"model.yaml: kv_cache_config.enable_block_reuse must be true or false, got {reuse!r}")
    load = WorkerLoad(
        model=checkpoint_folder(llm_args),
        max_batch_size=_int(llm_args, "max_batch_size", DEFAULT_MAX_BATCH_SIZE) or DEFAULT_MAX_BATCH_SIZE,
        max_seq_len=_int(llm_args, "max_seq_len", None),
    )
    ignored = sorted(k for k in llm_args if k not in USED and k not in MODEL_SIDE)
    ignored += sorted(f"kv_cache_config.{k}" for k in kv if k not in KV_USED)
    return EngineArgs(
        load=load,
        tp_size=tp,
        kv_cache_tokens=kv_tokens,
        ignored=ignored,
        block_reuse=reuse,
        tokens_per_block=_int(kv, "tokens_per_block", DEFAULT_TOKENS_PER_BLOCK) or DEFAULT_TOKENS_PER_BLOCK,
        kv_event_buffer=_count(kv, "event_buffer_max_size"),
    )
