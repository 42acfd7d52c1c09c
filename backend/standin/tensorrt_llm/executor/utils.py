"""upstream's `tensorrt_llm/executor/utils.py` error type: what a failed request raises where its result is read."""


class RequestError(RuntimeError):
    """The engine failed one request (its message says why); the LLM serves on."""
