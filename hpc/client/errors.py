"""What can go wrong when asking a deployment for text, as one exception hierarchy under `ClientError`.

Why these classes and not the transports' own errors (httpx, gRPC, tritonclient): the same failure reaches the
caller the same way whether the request went through the gateway or straight to a replica, so a caller can
retry on NotReady, fix its request on RequestError, and fix its token on AuthError without knowing the path.
"""

from __future__ import annotations


class ClientError(RuntimeError):
    """Every error of hpc.client."""


class TargetError(ClientError):
    """TARGET names no spec file, job, deployment folder or deployment."""


class NotReady(ClientError):
    """No gateway answers and no replica of the deployment is ready (or every one failed this request before
    its first piece)."""


class RequestError(ClientError):
    """The server refused the request (a 400-like answer): the message is the server's, `param` the field it
    named, when it named one."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


class AuthError(RequestError):
    """The access token is missing or wrong (401): `hpc-serve token TARGET` prints the deployment's."""


class ServerError(ClientError):
    """The server failed the request after taking it (the model's failure, a replica lost mid-stream, 5xx)."""


class Busy(ServerError):
    """Every ready replica's queue is full (the gateway's 429): nothing failed, try again later."""
