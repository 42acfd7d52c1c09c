from ..executor.result import CompletionOutput
from ..sampling_params import SamplingParams
from .llm import LLM, RequestOutput
from .llm_args import KvCacheConfig

__all__ = ["LLM", "CompletionOutput", "KvCacheConfig", "RequestOutput", "SamplingParams"]
