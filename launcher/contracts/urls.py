"""The one place that builds a served job's URLs, and opens them without a proxy.

Why without a proxy: clusters often export `http_proxy` for the outside world, and `urllib` honours it, so a
request to a compute node's address would go to the proxy (which cannot reach it, or answers with its own
error page). Every request hpc-serve makes goes to a node of the job itself: the launcher's readiness probe,
the client's `generate`, the metrics scrape.
"""

from __future__ import annotations

import http.client
import urllib.request

READY_PATH = "/v2/health/ready"
#: a gateway's own liveness route: which deployment it serves (so a reused port is not taken for it), no token
GATEWAY_HEALTH_PATH = "/gateway/health"
METRICS_PATH = "/metrics"


def http_url(address: str, port: int, path: str = "") -> str:
    """`http://address:port` + `path` (which starts with `/` when given)."""
    return f"http://{address}:{port}{path}"


def grpc_target(address: str, port: int) -> str:
    """What a gRPC client dials: `address:port`, no scheme."""
    return f"{address}:{port}"


def metrics_url(address: str, port: int) -> str:
    return http_url(address, port, METRICS_PATH)


def generate_url(base: str, model: str) -> str:
    """Triton's HTTP generate extension for `model`, under a server's base URL."""
    return f"{base}/v2/models/{model}/generate"


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def open_direct(request: str | urllib.request.Request, timeout: float) -> http.client.HTTPResponse:
    """`urllib.request.urlopen` that ignores `$http_proxy`/`$https_proxy` (see the module docstring)."""
    return _DIRECT.open(request, timeout=timeout)
