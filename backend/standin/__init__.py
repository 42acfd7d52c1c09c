"""The folder that holds the CPU engine's stand-in of TensorRT-LLM's package, `tensorrt_llm/` (its docstring says
what it is). The launcher puts this folder itself on PYTHONPATH for `model.backend: cpu`, so that the stand-in is
imported as `tensorrt_llm`, the name the one llmapi model (backend/models/llmapi.py) imports on a GPU too."""
