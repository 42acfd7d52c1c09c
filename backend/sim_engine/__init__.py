"""The simulated GPU engine (`model.backend: sim`): TensorRT-LLM's batching, paged KV cache and block reuse with a
GPU's timing, waited rather than computed, behind the same stand-in and leader-node wire as the CPU engine.

- `profiles.py`: the GPUs and models (published figures) and the calibration constants; `timing.py`: a step's
  time; `kv_cache.py`: blocks, reuse by chained hashes, eviction, KV events; `text.py`: the answers' tokens;
- `engine.py`: `SimEngine`; `node.py`: the leader and worker nodes' `EngineKind`; `checkpoint.py`: the weightless
  checkpoint `model.init` writes; `calibrate.py`: the published throughput against the model's.
"""
