"""The CPU stand-in's own wire between its `LLM` inside tritonserver (backend/standin/tensorrt_llm/
llmapi/llm.py) and the CPU engine's leader node (leader_node.py): one schema, one module. Private to the stand-in:
the Triton model speaks only the LLM API.

Why a socket and not the engine in the stub: the llmapi workflow's process layout (launcher/contracts/llmapi.py)
puts the engine's rank 0 in a process of its own, the MPI job's rank 0, reached by the model over
`TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR` with the hex HMAC key of `TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY`, as
TensorRT-LLM's `RemoteMpiCommSessionClient` reaches `mgmn_leader_node`. The transport is the standard library's
`multiprocessing.connection` (an HMAC challenge at connect: a peer without the key never gets a message through);
the messages are the dataclasses below, sent as JSON with their type's name (no pickle: nothing but these types
can come off the wire).

Conversation: the model connects, sends `Load` (model.yaml's LLM arguments) and gets `Loaded` or `LoadFailed`;
then `Submit`s, `Abort`s and, at unload, `Shutdown`. The leader answers each submitted request with `Output`s:
one per engine step that made tokens when streaming, else one final. `StatsQuery` → `Stats`, `KvEventsQuery` →
`KvEvents` (any connection).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from multiprocessing.connection import Client, Connection, Listener
from threading import Lock
from typing import Any
from urllib.parse import urlsplit

from launcher.contracts.llmapi import IPC_ADDR_VAR, IPC_HMAC_KEY_VAR, SPAWN_PROXY_VAR

#: how long the model tries to reach a leader node that is not listening yet: the launcher starts both at once,
#: and the leader imports numpy and MPI first (seconds); past this the model's load fails with the address
CONNECT_TIMEOUT_S = 120.0
CONNECT_RETRY_S = 0.1


class ProtocolError(RuntimeError):
    """A peer sent something that is not one of this module's messages, or the endpoint is misconfigured."""


# ------------------------------------------------------------------------------------------------ messages
@dataclass(frozen=True)
class Load:
    """model.yaml's LLM API arguments (triton_config removed): what the leader loads and tells its workers."""

    llm_args: dict[str, Any]


@dataclass(frozen=True)
class Loaded:
    """The engine is up: the facts the model needs to check requests before they reach it."""

    model: str
    family: str
    vocab_size: int
    max_seq_len: int
    max_batch_size: int
    kv_cache_tokens: int
    tp_size: int
    #: the LLM API arguments the CPU engine does not act on (said in the model's log)
    ignored: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LoadFailed:
    error: str


@dataclass(frozen=True)
class Sampling:
    """What the engine needs of a request's SamplingParams (the model mapped and checked them)."""

    max_tokens: int
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int = 0
    #: None: never end at a token (SamplingParams.ignore_eos)
    end_id: int | None = None
    #: stop strings as token ids (SamplingParams tokenized them): the engine stops when the output ends with one
    stop_words: list[list[int]] = field(default_factory=list)
    repetition_penalty: float | None = None
    min_tokens: int = 0
    #: each new token's log-probability comes back in Output.log_probs (SamplingParams.logprobs)
    return_log_probs: bool = False


@dataclass(frozen=True)
class Submit:
    request_id: str
    prompt_ids: list[int]
    sampling: Sampling
    streaming: bool


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Shutdown:
    """The model unloads: the leader node stops its engine, releases the workers and exits."""


@dataclass(frozen=True)
class StatsQuery:
    pass


@dataclass(frozen=True)
class Stats:
    """The engine's counters after its latest step (backend/cpu_engine/stats.py EngineStats, field for field)."""

    iterations: int
    active_requests: int
    waiting_requests: int
    completed_requests: int
    scheduled_requests: int = 0
    max_requests: int = 0
    context_requests: int = 0
    generation_requests: int = 0
    context_tokens: int = 0
    used_blocks: int = 0
    free_blocks: int = 0
    max_blocks: int = 0
    tokens_per_block: int = 0


@dataclass(frozen=True)
class KvEventsQuery:
    pass


@dataclass(frozen=True)
class KvEvents:
    """The KV-cache events since the last query (TensorRT-LLM's envelope: event_id, data, window_size), oldest first;
    none when the LLM keeps none (kv_cache_config.event_buffer_max_size 0, or no block reuse)."""

    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Perf:
    """A request's perf metrics as TensorRT-LLM reports them (RequestPerfMetrics): its timestamps, and its prompt's
    KV blocks found in the engine's cache (reused, copied instead of computed: prefix_cache.py) or not (missed)."""

    arrival_time_ns: int
    first_scheduled_time_ns: int
    first_token_time_ns: int
    last_token_time_ns: int
    kv_cache_alloc_new_blocks: int
    kv_cache_alloc_total_blocks: int
    kv_cache_missed_block: int
    kv_cache_reused_block: int = 0
    kv_cache_hit_rate: float = 0.0


@dataclass(frozen=True)
class Output:
    """New tokens of one request (all of them when not streaming); `finish_reason` is the engine's
    ("end_id" | "stop_words" | "length" | "cancelled" | "error", with `error`) on the final one."""

    request_id: str
    new_tokens: list[int]
    finished: bool
    cum_log_prob: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    perf: Perf | None = None
    #: the new tokens' log-probabilities, when the request asked (Sampling.return_log_probs)
    log_probs: list[float] = field(default_factory=list)


MESSAGES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Load,
        Loaded,
        LoadFailed,
        Submit,
        Abort,
        Shutdown,
        StatsQuery,
        Stats,
        KvEventsQuery,
        KvEvents,
        Output,
        Sampling,
        Perf,
    )
}
#: fields that hold another message type (decoded into it)
_NESTED = {(Submit, "sampling"): Sampling, (Output, "perf"): Perf}


#: each message type's field names, in order (read once: `dataclasses.asdict` deep-copies every value, a third of
#: the leader's CPU per streamed token)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls)) for cls in MESSAGES.values()}


def _as_dict(message: Any) -> dict[str, Any]:
    """`asdict` for these messages: their fields, a nested message as a mapping (lists and dicts are sent as they
    are, never changed after being sent)."""
    values = {}
    for name in _FIELD_NAMES[type(message)]:
        value = getattr(message, name)
        values[name] = _as_dict(value) if type(value) in _FIELD_NAMES else value
    return values


def encode(message: Any) -> bytes:
    if type(message).__name__ not in MESSAGES:
        raise ProtocolError(f"not a protocol message: {type(message).__name__}")
    return json.dumps({"type": type(message).__name__, "fields": _as_dict(message)}).encode("utf-8")


def decode(data: bytes) -> Any:
    try:
        raw = json.loads(data)
        cls = MESSAGES[raw["type"]]
        values = dict(raw["fields"])
        for f in fields(cls):
            nested = _NESTED.get((cls, f.name))
            if nested is not None and values.get(f.name) is not None:
                values[f.name] = nested(**values[f.name])
        return cls(**values)
    except (ValueError, KeyError, TypeError) as e:
        raise ProtocolError(f"malformed message from the peer: {type(e).__name__}: {e}") from None


class Channel:
    """One connection: typed send (thread-safe: the engine thread and request threads both send) and recv."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send_lock = Lock()

    def send(self, message: Any) -> None:
        data = encode(message)
        with self._send_lock:
            self.conn.send_bytes(data)

    def recv(self) -> Any:
        """The next message; EOFError/OSError once the peer is gone."""
        return decode(self.conn.recv_bytes())

    def close(self) -> None:
        self.conn.close()


# ------------------------------------------------------------------------------------------------ endpoint
@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    authkey: bytes

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


def endpoint(environ: Mapping[str, str] | None = None) -> Endpoint:
    """The leader node's address and key from the spawn-proxy variables; a clear error naming what is missing."""
    env = os.environ if environ is None else environ
    if env.get(SPAWN_PROXY_VAR) != "1":
        raise ProtocolError(
            f"{SPAWN_PROXY_VAR}=1 is not set: the CPU stand-in's LLM reaches its engine through the leader "
            f"node (python -m tensorrt_llm.llmapi.mgmn_leader_node) started beside tritonserver with {IPC_ADDR_VAR} "
            f"and {IPC_HMAC_KEY_VAR} (hpc-serve's launcher sets all three: launcher/contracts/llmapi.py proxy_env)"
        )
    addr, key = env.get(IPC_ADDR_VAR, ""), env.get(IPC_HMAC_KEY_VAR, "")
    if not addr:
        raise ProtocolError(f"{IPC_ADDR_VAR} is not set (tcp://HOST:PORT of the leader node)")
    parts = urlsplit(addr)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ProtocolError(f"{IPC_ADDR_VAR}={addr!r}: the CPU engine's leader node needs tcp://HOST:PORT")
    try:
        authkey = bytes.fromhex(key)
    except ValueError:
        authkey = b""
    if not authkey:
        raise ProtocolError(f"{IPC_HMAC_KEY_VAR} must be a non-empty hex string (as TensorRT-LLM reads it)")
    return Endpoint(parts.hostname, parts.port, authkey)


def listen(ep: Endpoint) -> Listener:
    return Listener(ep.address, family="AF_INET", authkey=ep.authkey)


def connect(ep: Endpoint, timeout_s: float = CONNECT_TIMEOUT_S) -> Channel:
    """Connect to the leader node, waiting up to `timeout_s` for it to listen (it may start after the model)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Channel(Client(ep.address, family="AF_INET", authkey=ep.authkey))
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise ProtocolError(
                    f"no leader node listening at tcp://{ep.host}:{ep.port} after {timeout_s:g}s "
                    "(python -m tensorrt_llm.llmapi.mgmn_leader_node on this rank)"
                ) from None
            time.sleep(CONNECT_RETRY_S)
