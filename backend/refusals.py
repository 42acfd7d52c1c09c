"""How a model's refusal of a request reads, where a client must tell its kind from its text: Triton's python
models and TensorRT-LLM report errors as messages, not codes, so the CPU engine writes these phrases and the
gateway (hpc/serving/triton.py `model_error`) matches them, along with the words of Triton and TensorRT-LLM.

Why a module of its own: the engine and the gateway must agree on the words, and the gateway must not import
the engine (numpy, its model code) to learn them. Standard library only.
"""

from __future__ import annotations

#: how a full queue reads (Triton's dynamic batcher: "Exceeds maximum queue size"; TensorRT-LLM's executor:
#: "Maximum queue size ... reached"), lower case: another replica may take the request
BUSY_MARKERS = ("exceeds maximum queue size", "maximum queue size")

#: the CPU engine's words for a prompt that leaves no room in the model's context (backend/cpu_engine/scheduler.py)
CPU_CONTEXT = "this model's context (max_seq_len)"
#: TensorRT-LLM's (`LlmRequest::validate`: "Prompt length (%d) exceeds maximum input length (%d)"); a prompt that
#: fits but leaves too little room for `max_tokens` is not refused there: its new tokens are cut to the room left
TRTLLM_CONTEXT = "exceeds maximum input length"
#: the LLM API's (`LLM._check_arguments`, upstream's words in the CPU stand-in too: "The sum of prompt length (N)
#: and query length (0) should not exceed max_seq_len (M)", or max_num_tokens on the PyTorch backend)
LLMAPI_CONTEXT = "should not exceed max_"
#: lower case, as matched
CONTEXT_MARKERS = (CPU_CONTEXT.lower(), TRTLLM_CONTEXT, LLMAPI_CONTEXT)

#: the CPU engine's words for a request refused because its server is stopping (backend/cpu_engine/drain.py)
CPU_STOPPING = "the server is stopping"
#: tritonserver's, for a request that reaches a model being unloaded or gone (its stop has begun): "Server is
#: stopping, scheduler for model has stopped accepting new inference requests", "Request for unknown model:
#: 'ensemble' has no available versions". Not its "Request for unknown model: 'ensemble' is not found": a model the
#: replica never had (the passthrough asked for the engine workflow's ensemble of an llmapi deployment): read so, it
#: would be tried on every replica and then a 503 "no replica is ready", where tritonserver's own 404 says it
TRITON_STOPPING = ("scheduler for model has stopped accepting", "has no available versions")
#: lower case, as matched: the replica takes no request any more, another one may (the request is retried there)
STOPPING_MARKERS = (CPU_STOPPING, *TRITON_STOPPING)
