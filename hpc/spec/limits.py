"""The gateway's bounds that its CLI, the spec's `gateway:` section and the app share, in a module without
imports, so that the CLI and spec validation can read them without loading the web stack."""

from __future__ import annotations

#: the default bound of a request's body, in MiB (`hpc-serve gateway --max-body-mb`, the spec's
#: `gateway.max_body_mb`; hpc/gateway/bodylimit.py): far above any prompt a model's context holds (a million
#: tokens are ~4 MB of text), far below what would strain the gateway's memory
MAX_BODY_MB = 16
#: characters of the prompt that make its prefix key (hpc/serving/balancer.py says why characters)
PREFIX_CHARS = 256
#: requests in flight one replica is given before the gateway answers 429 (the CPU engine and TensorRT-LLM
#: batch up to `triton_max_batch_size`, 8-256 typically; beyond a few batches' worth a request only waits)
MAX_OUTSTANDING = 256
#: how the gateway (`--routing`, the spec's `gateway.routing`) and `hpc.client` choose a replica
#: (hpc/serving/routing.py `MODES`): cache (the longest cached prefix against load, the default), prefix (the
#: first `PREFIX_CHARS` characters as the key: prefix affinity before cache-aware routing), least (least
#: outstanding), round_robin (for comparisons)
ROUTING_MODES = ("cache", "prefix", "least", "round_robin")
ROUTING = "cache"
