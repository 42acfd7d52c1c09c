"""The gRPC side of a client: the gateway's `TritonEngine` (one stream per request to a replica's ensemble, the
same request, token metadata included, that the gateway sends), on channels that never go through
`$http_proxy`, and tritonserver's refusal of a missing or wrong token told apart from an unreachable replica.

Why a subclass and not the engine as it is: gRPC, like urllib, sends every channel through `$http_proxy` (or
`$grpc_proxy`) unless told otherwise (launcher/urls.py says why that cannot reach a node). That belongs in
TritonEngine itself, where the gateway needs it as much (DEVELOPERS.md, "The Python client"); until it takes
channel options, this overrides the one method that makes a replica's channel.
"""

from __future__ import annotations

import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc

from hpc.gateway.triton import TritonEngine

_KEEPALIVE = grpcclient.KeepAliveOptions()
#: tritonclient's own channel defaults, and no proxy: replicas are cluster nodes
CHANNEL_ARGS = [
    ("grpc.enable_http_proxy", 0),
    ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
    ("grpc.keepalive_time_ms", _KEEPALIVE.keepalive_time_ms),
    ("grpc.keepalive_timeout_ms", _KEEPALIVE.keepalive_timeout_ms),
    ("grpc.keepalive_permit_without_calls", _KEEPALIVE.keepalive_permit_without_calls),
    ("grpc.http2.max_pings_without_data", _KEEPALIVE.http2_max_pings_without_data),
]

#: how tritonserver's refusal of a request without the restricted protocol's header reads (status UNAVAILABLE)
RESTRICTED_MARKER = "protocol is restricted"


def is_auth_refusal(exc: BaseException) -> bool:
    """A replica's "this protocol is restricted" answer: the token is missing or wrong and the replica is fine
    (tritonserver answers UNAVAILABLE, which TritonEngine reports as ReplicaUnavailable)."""
    return RESTRICTED_MARKER in str(exc).lower()


class ReplicaEngine(TritonEngine):
    """TritonEngine whose channels bypass `$http_proxy`."""

    def _client(self, grpc_url: str) -> aiogrpc.InferenceServerClient:
        if grpc_url not in self._clients:
            self._clients[grpc_url] = aiogrpc.InferenceServerClient(grpc_url, channel_args=CHANNEL_ARGS)
        return self._clients[grpc_url]
