"""launcher/node/warmup.py and launcher/node/ready.py: the warm-up request and what READY waits for, against a small
HTTP server that answers as tritonserver 2.51 does (its bodies copied from a real one: tests/test_warmup_e2e.py
runs the real thing), and a real child process under a real Supervisor."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.contracts import records
from launcher.contracts.layout import JobPaths
from launcher.node.supervise import Supervisor
from launcher.node.warmup import MODELS, Warmup, WarmupFailed, choose, first_event, send, warm_up

pytestmark = pytest.mark.timeout(60)

# what tritonserver 2.51 answered on /v2/models/ensemble/generate_stream (tiny-cpu, decoupled)
OK = b'data: {"model_name":"ensemble","model_version":"1","text_output":" c"}\n\n'
PREPROCESSING_ERROR = (
    b'data: {"error":"in ensemble \'ensemble\', preprocessing: input REQUEST_OUTPUT_LEN (max_tokens) must be at '
    b'least 1, got 0"}\n\n'
)


class Triton(http.server.BaseHTTPRequestHandler):
    """Answers POST .../generate_stream with the server's ``answers[path]``: (status, content type, body, held:
    whether to answer only once ``release`` is set, at the test's end); records each request's path, headers
    and body, and sets ``received`` once a request came."""

    answers: dict[str, tuple[int, str, bytes, bool]] = {}
    seen: list[tuple[str, dict[str, str], dict]] = []
    received: threading.Event
    release: threading.Event

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        status, kind, data, held = self.answers[self.path]
        self.received.set()
        if held:
            self.release.wait(60)
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client gave up (its timeout), as a launcher does
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def triton() -> Iterator[tuple[int, type[Triton]]]:
    release = threading.Event()
    handler = type("Handler", (Triton,), {"answers": {}, "seen": [], "received": threading.Event(), "release": release})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def repository(tmp_path: Path, *models: str) -> Path:
    for model in models:
        (tmp_path / "repo" / model).mkdir(parents=True)
        (tmp_path / "repo" / model / "config.pbtxt").write_text(f'name: "{model}"\n')
    return tmp_path / "repo"


def test_the_ensemble_is_warmed_up_else_the_bls_model_else_none(tmp_path: Path) -> None:
    assert MODELS == ("ensemble", "tensorrt_llm_bls")
    assert choose(repository(tmp_path, "ensemble", "tensorrt_llm_bls", "tensorrt_llm"), 5).model == "ensemble"
    bls = choose(repository(tmp_path / "b", "tensorrt_llm_bls", "tensorrt_llm"), 5, "tok")
    assert bls == Warmup("tensorrt_llm_bls", 5, "tok") and bls.path == "/v2/models/tensorrt_llm_bls/generate_stream"
    assert choose(repository(tmp_path / "c", "identity"), 5) is None, "not a repository of ours: health alone"


@pytest.mark.slow
def test_a_token_that_came_back_is_success_and_the_token_is_sent(triton) -> None:
    port, server = triton
    server.answers["/v2/models/ensemble/generate_stream"] = (200, "text/event-stream", OK, False)
    assert send(Warmup("ensemble", 5, "hpcs_secret"), port) == " c"
    path, headers, body = server.seen[0]
    assert body == {"text_input": "Hello", "max_tokens": 1}
    assert headers["authorization"] == "Bearer hpcs_secret"
    send(Warmup("ensemble", 5), port)
    assert "authorization" not in server.seen[1][1], "auth: none sends no header"


@pytest.mark.parametrize(
    ("status", "kind", "body", "expected"),
    [
        (400, "text/event-stream", PREPROCESSING_ERROR, "HTTP 400: in ensemble 'ensemble', preprocessing: input"),
        (500, "application/json", b'{"error":"Stub process is not healthy"}', "HTTP 500: Stub process is not"),
        (403, "text/plain", b'{"error":"This API is restricted"}', "HTTP 403: This API is restricted"),
        (200, "text/event-stream", b'data: {"error":"boom: every request fails"}\n\n', "boom: every request fails"),
        (200, "text/event-stream", b'data: {"model_name":"ensemble"}\n\n', "answered without text_output"),
        (200, "text/event-stream", b"", "the stream ended without a response"),
    ],
)
@pytest.mark.slow
def test_an_error_answer_fails_with_the_servers_text(triton, status, kind, body, expected) -> None:
    port, server = triton
    server.answers["/v2/models/ensemble/generate_stream"] = (status, kind, body, False)
    with pytest.raises(WarmupFailed) as failed:
        send(Warmup("ensemble", 5), port)
    assert str(failed.value).startswith(expected), str(failed.value)


def test_first_event_parsing() -> None:
    assert first_event('{"text_output": ""}') == "", "a token that is part of a character is still a token"
    with pytest.raises(WarmupFailed, match="not JSON"):
        first_event("{oops")


@pytest.fixture
def child():
    """A real process under a real Supervisor, as tritonserver is (its own process group)."""
    sup = Supervisor(stop_grace_s=5)
    started = sup.spawn([sys.executable, "-c", "import time; time.sleep(600)"], env={})
    yield sup, started
    sup.kill_group(started)
    started.proc.wait(10)


@pytest.mark.slow
def test_warm_up_outcomes(triton, child) -> None:
    port, server = triton
    sup, proc = child
    path = "/v2/models/ensemble/generate_stream"
    server.answers[path] = (200, "text/event-stream", OK, False)
    outcome = warm_up(sup, proc, Warmup("ensemble", 60), port)
    assert (outcome.state, outcome.text) == ("ok", " c")
    server.answers[path] = (200, "text/event-stream", b'data: {"error":"boom"}\n\n', False)
    assert warm_up(sup, proc, Warmup("ensemble", 60), port).why == "boom"
    # an answer held until the test ends: only the timeout can end this warm-up, however slow the machine
    server.answers[path] = (200, "text/event-stream", OK, True)
    outcome = warm_up(sup, proc, Warmup("ensemble", 0.5), port)
    assert outcome.state == "timeout" and "warmup_timeout_s=0.5" in outcome.why
    assert outcome.seconds >= 0.5, "timed out early"  # a deadline never fires early, however slow the machine
    # the supervisor keeps polling while the request waits: tritonserver's end is seen, not the answer (held) or
    # the timeout (60 s: only a warm-up that missed the end would reach it)
    server.received.clear()

    def end_once_received() -> None:
        server.received.wait(60)
        sup.kill_group(proc)

    threading.Thread(target=end_once_received, daemon=True).start()
    outcome = warm_up(sup, proc, Warmup("ensemble", 60), port)
    assert outcome.state == "exited", outcome


@pytest.mark.slow
def test_startup_record_round_trip(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path, "9").create()
    record = records.StartupRecord(job_id="9", replica=1, phase=records.WARMING_UP, since=100.0, detail="x")
    records.write_json_atomic(paths.starting(1), {**record.to_dict(), "future": 1})
    assert records.read_startups(paths) == [record], "unknown keys ignored"
    assert records.read_endpoints(paths) == [], "not an endpoint"
    assert record.describe(now=102.4) == "replica 1: warming up (x) for 2 s"
