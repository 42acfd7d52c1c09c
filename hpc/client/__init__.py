"""Text from a deployment, in Python: through its gateway when one runs, else balanced over its replicas.

    from hpc.client import Client
    with Client("configs/tiny-cpu.yaml") as client:        # or a job id, a deployment folder or name
        print(client.generate("The capital of France is", max_tokens=16, temperature=0.7, seed=1))
        for piece in client.stream("Once upon a time", max_tokens=32):
            print(piece, end="", flush=True)
        answers = client.generate_batch(["Hello", "Bonjour"], concurrency=8)

    async with AsyncClient("tiny-cpu") as client:           # the same, on the caller's event loop
        async for piece in client.stream("Once upon a time"):
            ...

One module per concern: `aio` (AsyncClient: routing, retries, the API), `sync` (Client: AsyncClient on a
private loop), `transport` (the gateway's OpenAI API, the sampling parameters), `discovery` (TARGET, tokens),
`errors` (ClientError and its kinds), `replica` (gRPC channels: no proxy, the token as metadata).

The clients load on first use (`__getattr__`): `hpc-serve endpoints` and `metrics` import `job_endpoints` from
here and need neither httpx nor gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpc.client.discovery import job_endpoints
from hpc.client.errors import AuthError, Busy, ClientError, NotReady, RequestError, ServerError, TargetError
from launcher.contracts.records import EndpointRecord

if TYPE_CHECKING:
    from hpc.client.aio import AsyncClient
    from hpc.client.sync import Client
    from hpc.client.transport import Sampling

#: One replica's published endpoint record (launcher/contracts/records.py, DEVELOPERS.md "Shared contracts"):
#: address, ports and URLs.
Endpoint = EndpointRecord

__all__ = [
    "AsyncClient",
    "AuthError",
    "Busy",
    "Client",
    "ClientError",
    "Endpoint",
    "NotReady",
    "RequestError",
    "Sampling",
    "ServerError",
    "TargetError",
    "job_endpoints",
]


def __getattr__(name: str) -> Any:
    if name == "AsyncClient":
        from hpc.client.aio import AsyncClient

        return AsyncClient
    if name == "Client":
        from hpc.client.sync import Client

        return Client
    if name == "Sampling":
        from hpc.client.transport import Sampling

        return Sampling
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
