"""A stand-in for TensorRT-LLM's public Python API over hpc-serve's CPU engine. NOT TensorRT-LLM.

It exists so that the one `tensorrt_llm` Triton model hpc-serve ships (backend/models/llmapi.py) runs in CI, on no
GPU, exactly as it runs over the real library: `LLM(**model.yaml)`, `SamplingParams`, `generate_async`,
`RequestOutput`, `abort`, `get_stats_async`, `shutdown`, and the `tensorrt_llm.llmapi.mgmn_leader_node` /
`mgmn_worker_node` processes that `trtllm-llmapi-launch` runs, with upstream's arguments and lifetimes per version.
It is as strict as upstream's code (types, errors, per version: docs/compatibility.md lists each rule with the
upstream file and commit), so that a bug a GPU user would meet fails here first.

The launcher puts its folder (launcher/contracts/llmapi.py STANDIN_ROOT) on PYTHONPATH for `model.backend: cpu`
only; with `backend: tensorrtllm` the real library is imported, and a missing one fails loudly.
"""

from .llmapi import LLM, CompletionOutput, KvCacheConfig, RequestOutput
from .sampling_params import SamplingParams
from .version import __version__

__all__ = ["LLM", "CompletionOutput", "KvCacheConfig", "RequestOutput", "SamplingParams", "__version__"]
