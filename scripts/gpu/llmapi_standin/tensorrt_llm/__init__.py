"""A stand-in for TensorRT-LLM, for scripts/gpu/prove_llmapi_gpus.py only: NOT TensorRT-LLM.

It holds the two modules hpc-serve's llmapi launch runs on the ranks (launcher/contracts/llmapi.py
LEADER_MODULES/WORKER_MODULES["tensorrtllm"]), reduced to what decides GPU visibility: each picks its CUDA device
the way TensorRT-LLM's PyTorch worker does, holds memory there and says where it sits.
"""
