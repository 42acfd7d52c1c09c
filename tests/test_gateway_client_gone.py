"""A client that leaves before its answer started, through `hpc-serve gateway` in front of a real job (local executor,
tritonserver, CPU engine): its request ends then, not at its first token (hpc/gateway/streaming.py `Watch`). A
client that leaves mid-stream: tests/test_gateway_e2e_replicas.py."""

from __future__ import annotations

import json
import socket
from datetime import datetime

import pytest

from tests.e2e import prometheus_samples, wait_for

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]

#: the replica's engine batch (tests/e2e.py write_spec's `triton_max_batch_size`): this many streams fill it
BATCH = 8
#: rounds played at most for one whose premise holds (test_a_client_gone_before_its_first_token_...)
ROUNDS = 5


@pytest.fixture(scope="module")
def gateway(paced_gateway):
    """The engine at a GPU's pace (tests/conftest.py): a stream of 200 tokens holds its slot 4 s at least, however
    fast the CPU. Unpaced, the tiny model runs them in a fraction of a second, and on a loaded 2-core machine a slot
    comes free before the two waiting clients leave."""
    return paced_gateway


def _send_and_leave(url: str, token: str, body: dict) -> socket.socket:
    """`POST /v1/completions` over a socket of its own, whose answer is not read (the caller closes it)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def test_a_client_gone_before_its_first_token_ends_its_request_at_once(gateway):
    """Clients that close their connection while their request waits for its first token (streamed) or its whole
    answer (not streamed) end it then: the gateway's requests in flight drop while the replica is still busy, and
    the access log records 499 without tokens. They wait because the replica's engine is full (BATCH streams run
    meanwhile); unwatched, each would wait for a free slot, make its first token for nobody, and be logged as a
    200.

    The premise is that the engine has no slot for the two when their clients leave. Under a loaded CPU it may
    have one (a stream ended in the engine before the gateway relayed its last events): a waiting request then
    rightly gets its first token, which its access line shows (`ttft_ms`), and that round is played again, up
    to ROUNDS times. In a round where neither got a token, both must be 499s with no tokens, and the streams
    that held the engine 200s. A gateway that did not end them would see them get a token in every round."""
    for round_ in range(1, ROUNDS + 1):
        access = _clients_leave_while_waiting(gateway)
        if access is None and round_ < ROUNDS:
            continue  # the two were never in flight beside all BATCH streams: the premise did not hold
        assert access is not None, f"in each of {ROUNDS} rounds the two requests never waited beside {BATCH} streams"
        starts = sorted(access, key=lambda a: _epoch(a["time"]))
        running, waiting = starts[:BATCH], starts[BATCH:]
        served = [a for a in waiting if a["ttft_ms"] is not None]
        if served and round_ < ROUNDS:
            continue  # a slot came free before the two clients left: the premise did not hold
        assert not served, f"in each of {ROUNDS} rounds a waiting request got its first token: {served}"
        statuses = [a["status"] for a in running + waiting]
        assert statuses == [200] * BATCH + [499] * 2, f"the two clients gone are logged as 499: {access}"
        gone = [(a["stream"], a["ttft_ms"], a["completion_tokens"]) for a in waiting]
        assert sorted(gone) == [(False, None, None), (True, None, None)], "they ended before their first token"
        return


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _clients_leave_while_waiting(gateway: dict) -> list[dict] | None:
    """BATCH streams fill the engine; two more requests wait, and their clients leave: the access lines of these
    requests. None when the gateway never had the two in flight beside all BATCH streams (a contended run: a stream
    ended, or a waiting request was served, before the gateway counted both), a round whose premise failed."""
    url, token = gateway["url"], gateway["token"]
    body = {"model": gateway["model"], "prompt": "Once upon a time", "max_tokens": 200, "stream": True}

    def in_flight() -> float:
        samples = prometheus_samples(url)
        return sum(v for (name, _), v in samples.items() if name == "hpc_serve_gateway_replica_outstanding")

    wait_for(lambda: in_flight() == 0, 30, "no request in flight")
    log_lines = len(gateway["log"].read_text().splitlines())
    running = [_send_and_leave(url, token, body) for _ in range(BATCH)]
    try:
        for sock in running:  # each one holds a slot of the engine once its first event came
            got = b""
            while b"data: {" not in got:
                chunk = sock.recv(65536)
                assert chunk, f"a stream ended before its first event: {got!r}"
                got += chunk
        waiting = [_send_and_leave(url, token, body), _send_and_leave(url, token, {**body, "stream": False})]
        try:
            wait_for(lambda: in_flight() == BATCH + 2, 30, "the two requests to wait for the replica")
            waited = True
        except AssertionError:
            waited = False
        for sock in waiting:
            sock.close()
        wait_for(lambda: in_flight() <= BATCH, 30, "the requests of the clients gone to end")
    finally:
        for sock in running:
            sock.close()
    wait_for(lambda: in_flight() == 0, 30, "the gateway's requests in flight to end")
    if not waited:
        return None
    lines = gateway["log"].read_text().splitlines()[log_lines:]
    access = [json.loads(line) for line in lines if line.startswith("{")]
    return [a for a in access if a["route"] == "/v1/completions"]


def test_a_client_gone_while_sending_its_body_is_a_quiet_499_on_every_route(gateway):
    """A client that declares a body and leaves half-way through it (a crash, a timeout, a dropped network):
    nothing to answer and nothing wrong with the gateway. Each route logs 499, with no traceback (the Triton
    passthrough's route raised Starlette's ClientDisconnect into uvicorn: a 500 and "Exception in ASGI
    application"), and the gateway serves on."""
    import httpx

    url, token = gateway["url"], gateway["token"]
    host, port = url.removeprefix("http://").split(":")
    routes = [
        ("/v2/models/ensemble/generate_stream", "application/json"),
        ("/v2/models/ensemble/generate", "application/json"),
        ("/v1/completions", "application/json"),  # the fast path
        ("/v1/completions", "text/plain"),  # FastAPI's own route
    ]
    log_lines = len(gateway["log"].read_text().splitlines())
    for path, content_type in routes:
        with socket.create_connection((host, int(port))) as sock:
            head = (
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: 1000\r\n\r\n"
            )
            sock.sendall(head.encode() + b'{"text_input": "Once')

    def logged() -> list[dict]:
        lines = gateway["log"].read_text().splitlines()[log_lines:]
        return [json.loads(line) for line in lines if line.startswith("{")]

    wait_for(lambda: len(logged()) == len(routes), 30, "an access line for each request")
    assert sorted(a["route"] for a in logged()) == sorted(p.replace("ensemble", "{model}") for p, _ in routes)
    assert {a["status"] for a in logged()} == {499}, logged()
    text = "\n".join(gateway["log"].read_text().splitlines()[log_lines:])
    assert "Traceback" not in text and "Exception in ASGI" not in text, text[-3000:]
    body = {"model": gateway["model"], "prompt": "Once upon a time", "max_tokens": 2}
    answer = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert answer.status_code == 200, answer.text
