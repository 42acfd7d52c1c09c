"""CPU reference engine: serves Hugging Face GPT-2 / Llama checkpoints with numpy behind the same Triton tensors
as TensorRT-LLM's ``tensorrt_llm`` model (see ``backend/models/tensorrt_llm_cpu.py``).

Public API (numpy-only imports; ``mpi4py`` only when tp_size > 1):

- ``Engine(model_dir, tp_size=1, max_batch_size=8, max_tokens_in_kv_cache=None, block_size=64)``: leader engine;
  ``submit(GenerationRequest)``, ``cancel(request_id)``, ``start()``, ``shutdown()``, ``generate()``, ``stats()``.
- ``load_shard(model_dir, comm, max_slots)`` + ``follower_loop(shard)``: what ranks > 0 run.
- ``GenerationRequest`` / ``GenerationOutput`` / ``SamplingParams``: engine-level request types.
- ``create_checkpoint(out_dir, family, size, seed)``: random-weight HF checkpoint + tokenizer (``init_model``).
"""

from .engine import Engine
from .follower import follower_loop, load_shard
from .init_model import create_checkpoint
from .sampling import SamplingParams
from .scheduler import GenerationOutput, GenerationRequest
from .stats import EngineStats

__all__ = [
    "Engine",
    "EngineStats",
    "GenerationOutput",
    "GenerationRequest",
    "SamplingParams",
    "create_checkpoint",
    "follower_loop",
    "load_shard",
]
