"""The model repository's model names: upstream's (tensorrtllm_backend's ``inflight_batcher_llm``), so a client
written for upstream works unchanged against hpc-serve's repository.

backend/ writes the repository (``backend/templates/tables.py`` and ``engine_tables.py`` name each model from
here), and every other side names its models from here too: the launcher (the followers' model, the warm-up's),
render (launch.json, the BLS model's parameters), the gateway and the client (what they send to, what a stop goes
to), the bench (metrics by model). Why here, in launcher/, and not in backend/ that owns the repository: the
launcher needs the names, imports the standard library and its own package only, and backend/ already imports
launcher/ (``launcher.contracts.rank``), never the other way.
"""

from __future__ import annotations

#: what the gateway, ``hpc.client`` and the warm-up send requests to: preprocessing → tensorrt_llm → postprocessing
ENSEMBLE = "ensemble"
#: the ensemble's steps: tokenize, generate (TensorRT-LLM, or the CPU engine behind the same tensors), detokenize
PREPROCESSING = "preprocessing"
TENSORRT_LLM = "tensorrt_llm"
POSTPROCESSING = "postprocessing"
#: the same pipeline as python BLS calls (a client may send to it instead of the ensemble)
TENSORRT_LLM_BLS = "tensorrt_llm_bls"

#: the largest values the models' INT32 inputs (max_tokens, top_k) and UINT64 input (seed) hold: what the gateway's
#: OpenAI bodies (hpc/gateway/bodies.py) and the CLI's flags accept at most, so that a larger one is refused naming
#: its field or flag, not wrapped round on its way into the model (max_tokens 10^12 would be a 500 "must be at
#: least 1, got -727379968")
INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1

#: A request id that starts with this marks a streaming request whose id is unique (hpc-serve's clients send
#: ``hpc-serve-stream:<uuid4>``).  Triton's ensemble passes the client's request id to postprocessing but
#: nothing else per stream (a step may not mix tensors from before a decoupled model with its outputs), so this
#: is the only way postprocessing (backend/models/postprocessing.py) can tell one stream's chunks from another's.
STREAM_REQUEST_PREFIX = "hpc-serve-stream:"
