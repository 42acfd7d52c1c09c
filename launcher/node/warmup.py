"""READY means a token came back: a replica leader's one real request before it publishes its endpoint.

Why: ``/v2/health/ready`` answers 200 once every model *loaded*; it says nothing about whether they *serve*. A
model whose ``execute`` fails (a broken tokenizer, an engine that cannot allocate its KV cache on the first
batch, a stub that crashes on its first tensor) would be published READY, and its first client would get the
error instead. So once tritonserver is ready (and, with ``auth: token``, proven to require the token), the
leader's launcher sends one request the way a client does: ``max_tokens`` 1 through the ``ensemble`` (what the
gateway and ``hpc-serve generate`` use; ``tensorrt_llm_bls`` where a repository has no ensemble), with the
access token, and only an answer carrying ``text_output`` lets it publish. An error answer, or none within
``warmup_timeout_s`` (launcher/contracts/config.py ``DEFAULT_WARMUP_TIMEOUT_S``), fails the rank with the server's own
error text in its exit record.

Why ``generate_stream`` for every repository: on tritonserver 2.51 it serves decoupled models (the ensemble is
decoupled when ``decoupled_mode`` is true: its ``tensorrt_llm`` is) and non-decoupled ones alike, and its first
server-sent event is the first response, so the launcher need not know which kind it has; ``generate`` refuses a
decoupled model that sends more than one response ("generate expects model to produce exactly 1 response").
Errors come as HTTP 4xx/5xx with ``{"error": ...}`` (before any response, e.g. a preprocessing error: a 400 whose
body is the event ``data: {"error": ...}``) or as an event ``{"error": ...}`` after a 200.

Only the leader warms up: TensorRT-LLM followers (and the CPU engine's) serve through their leader, open no
port, and are in this request's collectives. Standard library only (urllib), like the rest of the launcher.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher.contracts import model_names
from launcher.contracts.auth import HEADER, bearer
from launcher.contracts.llmapi import MODEL_YAML
from launcher.contracts.text_enum import TextEnum
from launcher.contracts.urls import http_url, open_direct
from launcher.node.supervise import Child, Supervisor

#: the models a warm-up may go through, first found wins: what our clients send to (the ensemble), else the BLS
#: model; a repository with neither (not one hpc-serve wrote) is READY on its health check alone
MODELS = (model_names.ENSEMBLE, model_names.TENSORRT_LLM_BLS)
PROMPT = "Hello"
ENSEMBLE_BODY = {"text_input": PROMPT, "max_tokens": 1}
#: the llmapi model (launcher/contracts/llmapi.py): upstream's input names; not streamed, so one response
LLMAPI_BODY = {"text_input": PROMPT, "sampling_param_max_tokens": 1}
#: the output a successful answer carries (both models' text; the token may be part of a character, so "")
OUTPUT = "text_output"
#: the server's error text is cut to this many characters in the record and the log
ERROR_CHARS = 2000


class WarmupFailed(RuntimeError):
    """The warm-up request failed; the message is the server's own error text (or why there was no answer)."""


@dataclass(frozen=True)
class Warmup:
    """One warm-up request: to ``model``, with the deployment's token when auth is on."""

    model: str
    timeout_s: float
    token: str | None = None
    #: the request: the ensemble's and BLS model's inputs, or the llmapi model's (LLMAPI_BODY)
    body: Mapping[str, object] = field(default_factory=lambda: dict(ENSEMBLE_BODY))

    @property
    def path(self) -> str:
        return f"/v2/models/{self.model}/generate_stream"

    @property
    def detail(self) -> str:
        """What the startup record and the log say it is waiting for."""
        return f"one token through {self.model}"

    def request(self, port: int, host: str = "127.0.0.1") -> urllib.request.Request:
        body = json.dumps(self.body).encode()
        request = urllib.request.Request(http_url(host, port, self.path), data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        if self.token is not None:
            request.add_header(HEADER, bearer(self.token))
        return request


def choose(repository: Path, timeout_s: float, token: str | None = None) -> Warmup | None:
    """The warm-up for a model repository (the first of MODELS it holds, else the llmapi model), or None when it
    holds none of them."""
    for model in MODELS:
        if (repository / model / "config.pbtxt").is_file():
            return Warmup(model, timeout_s, token)
    if (repository / model_names.TENSORRT_LLM / "1" / MODEL_YAML).is_file():
        return Warmup(model_names.TENSORRT_LLM, timeout_s, token, LLMAPI_BODY)
    return None


def _error_text(body: bytes) -> str:
    """The ``error`` of a JSON body or of its first event, else the body itself."""
    text = body.decode("utf-8", "replace").strip()
    for line in text.splitlines():
        if line.startswith("data:"):
            text = line[len("data:") :].strip()
            break
    try:
        data = json.loads(text)
    except ValueError:
        return text[:ERROR_CHARS] or "(empty answer)"
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])[:ERROR_CHARS]
    return text[:ERROR_CHARS]


def first_event(event: str) -> str:
    """The text of a successful first event; WarmupFailed with the server's error otherwise."""
    try:
        data = json.loads(event)
    except ValueError:
        raise WarmupFailed(f"answered an event that is not JSON: {event[:ERROR_CHARS]!r}") from None
    if not isinstance(data, dict):
        raise WarmupFailed(f"answered {event[:ERROR_CHARS]!r}")
    if "error" in data:
        raise WarmupFailed(str(data["error"])[:ERROR_CHARS])
    if OUTPUT not in data:
        raise WarmupFailed(f"answered without {OUTPUT}: {event[:ERROR_CHARS]}")
    return str(data[OUTPUT])


#: how much longer than warmup_timeout_s the request's socket waits (see send)
SOCKET_GRACE_S = 2.0


def send(warmup: Warmup, port: int, host: str = "127.0.0.1") -> str:
    """Send the warm-up and read its first event: the generated text (WarmupFailed otherwise). The rest of the
    stream (at most a final empty response: max_tokens is 1) is not waited for."""
    try:
        # the socket's own timeout a little past warmup_timeout_s: the supervisor's clock in warm_up() decides
        # (a socket timing out at the same moment would read as a failed request, not as the timeout)
        with open_direct(warmup.request(port, host), timeout=warmup.timeout_s + SOCKET_GRACE_S) as resp:
            for raw in iter(resp.readline, b""):
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("data:"):
                    return first_event(line[len("data:") :].strip())
    except urllib.error.HTTPError as exc:
        raise WarmupFailed(f"HTTP {exc.code}: {_error_text(exc.read())}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise WarmupFailed(f"no answer: {getattr(exc, 'reason', exc)}") from None
    raise WarmupFailed("the stream ended without a response")


class WarmupState(TextEnum):
    """How a warm-up ended: an answer with text, an error answer, no answer in time, tritonserver ended (or the
    launcher's fail-fast ended it), or a stop signal came first."""

    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"
    EXITED = "exited"
    STOPPING = "stopping"


@dataclass(frozen=True)
class Outcome:
    """How a warm-up went: ``state``; ``why`` the error; ``seconds`` how long; ``text`` the token's text."""

    state: WarmupState
    why: str = ""
    seconds: float = 0.0
    text: str = ""


def warm_up(sup: Supervisor, child: Child, warmup: Warmup, port: int, host: str = "127.0.0.1") -> Outcome:
    """Send the warm-up on a thread while the supervisor goes on polling (a stop signal, a dead stub or a failed
    peer are acted on at once, as while loading); the first of: the answer, tritonserver's exit, a stop, the
    timeout."""
    result: dict[str, str] = {}

    def run() -> None:
        try:
            result["text"] = send(warmup, port, host)
        except WarmupFailed as exc:
            result["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - a bug here must fail the warm-up, not hang it
            result["error"] = f"{type(exc).__name__}: {exc}"

    start = time.monotonic()
    thread = threading.Thread(target=run, name="warm-up", daemon=True)
    thread.start()
    while True:
        thread.join(0.01)
        took = time.monotonic() - start
        if sup.poll(child) is not None:
            return Outcome(WarmupState.EXITED, seconds=took)
        if sup.stopping:
            return Outcome(WarmupState.STOPPING, seconds=took)
        if not thread.is_alive():
            if "error" in result:
                return Outcome(WarmupState.FAILED, result["error"], took)
            return Outcome(WarmupState.OK, seconds=took, text=result.get("text", ""))
        if took >= warmup.timeout_s:
            why = f"no answer within warmup_timeout_s={warmup.timeout_s:g} s (launch.json)"
            return Outcome(WarmupState.TIMEOUT, why, seconds=took)
