"""hpc/client.py against a stand-in HTTP server: requests go to the published node directly, never through
`$http_proxy` (clusters export one for the outside world; it cannot reach a compute node's address)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hpc.client import Client, Endpoint

pytestmark = pytest.mark.timeout(60)


class _Triton(BaseHTTPRequestHandler):
    """Answers what Client asks of a tritonserver: health and the generate extension."""

    def do_GET(self) -> None:
        self._reply(200 if self.path == "/v2/health/ready" else 404, {})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v2/models/ensemble/generate":
            return self._reply(404, {"error": "no such model"})
        self._reply(200, {"text_output": f"echo: {body['text_input']} ({body['max_tokens']})"})

    def _reply(self, code: int, data: dict) -> None:
        payload = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Triton)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def dead_proxy(monkeypatch: pytest.MonkeyPatch) -> str:
    """$http_proxy pointing at a port nothing listens on, and no $no_proxy exception for the node."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: connections are refused
    proxy = f"http://127.0.0.1:{port}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return proxy


def _client(port: int) -> Client:
    return Client(Endpoint(address="127.0.0.1", http_port=port, grpc_port=port + 1, metrics_port=port + 2))


def test_generate_ignores_http_proxy(server: int, dead_proxy: str) -> None:
    assert _client(server).generate("hello", max_tokens=3) == "echo: hello (3)"


def test_ready_ignores_http_proxy(server: int, dead_proxy: str) -> None:
    assert _client(server).ready()


def test_generate_reports_the_servers_error(server: int) -> None:
    client = _client(server)
    client.model = "nope"
    with pytest.raises(RuntimeError, match="nope: HTTP 404"):
        client.generate("hello")
