"""Port choice for the replica leader: honour fixed ports, pick free ones for ``auto``, tell a port collision.

Upstream gives every rank the same fixed ports (tensorrtllm_backend#243); two deployments sharing a node then collide.
``auto`` asks the kernel for free ports (bind to port 0) on the leader's node; the small window between our probe and
tritonserver's own bind is covered by retrying with fresh ports when tritonserver exited and one of its ports turns out
to be taken. That is told by trying to bind the port (``taken``), a fact, never by reading tritonserver's log for
"already in use": wording changes between versions, and a model's own log line could say it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NAMES = ("http", "grpc", "metrics")


class PortError(RuntimeError):
    """A fixed (user-chosen) port cannot be used; names the port so the user can pick another."""


@dataclass(frozen=True)
class Ports:
    """The three tritonserver endpoints of a leader."""

    http: int
    grpc: int
    metrics: int

    def as_dict(self) -> dict[str, int]:
        return {"http": self.http, "grpc": self.grpc, "metrics": self.metrics}


def free_ports(count: int, exclude: Iterable[int] = (), host: str = "") -> list[int]:
    """``count`` distinct ports that were free a moment ago (all probes are held open together, so distinct)."""
    excluded = set(exclude)
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count * 20):
            if len(ports) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            held.append(sock)
            port = sock.getsockname()[1]
            if port not in excluded and port not in ports:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    if len(ports) != count:
        raise PortError(f"could not find {count} free ports")
    return ports


def allocate(spec: Mapping[str, object] | None, avoid: Iterable[int] = ()) -> tuple[Ports, frozenset[str]]:
    """Resolve ``{"http": "auto"|int, ...}`` into Ports; also return the names that were ``auto``.

    ``avoid`` holds ports that already failed (or belong to other endpoints) so a retry never reuses them.
    """
    spec = dict(spec or {})
    fixed: dict[str, int] = {}
    auto: list[str] = []
    for name in NAMES:
        value = spec.get(name, "auto")
        if value is None or (isinstance(value, str) and value.strip().lower() in ("auto", "", "0")):
            auto.append(name)
            continue
        try:
            port = int(str(value))
        except (TypeError, ValueError):
            raise PortError(f'ports.{name} must be an integer or "auto", got {value!r}') from None
        if not 0 < port < 65536:
            raise PortError(f"ports.{name} = {port} is not a TCP port")
        fixed[name] = port
    if len(set(fixed.values())) != len(fixed):
        raise PortError(f"ports must be distinct, got {fixed}")
    picked = free_ports(len(auto), exclude=set(avoid) | set(fixed.values())) if auto else []
    values = {**fixed, **dict(zip(auto, picked, strict=True))}
    return Ports(**values), frozenset(auto)


def _bind_error(port: int, host: str = "") -> OSError | None:
    """Why ``port`` cannot be bound on this node now, or None when it can (SO_REUSEADDR, as tritonserver binds:
    a connection of an earlier server in TIME_WAIT is no collision)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        return exc
    finally:
        sock.close()
    return None


def check_fixed(ports: Ports, auto: frozenset[str], host: str = "") -> None:
    """Fail early, naming the port, when a user-fixed port is already bound on this node."""
    for name, port in ports.as_dict().items():
        if name in auto:
            continue
        error = _bind_error(port, host)
        if error is not None:
            raise PortError(
                f"{name} port {port} (fixed in launch.json ports) is already in use on {socket.gethostname()}: "
                f'{error.strerror}; choose another port or "auto"'
            )


def taken(ports: Ports, host: str = "") -> dict[str, int]:
    """The ports (name → number) that another process holds now. Asked after tritonserver exited and its
    process group was reaped, so none of them is its own: one that cannot be bound is why it could not start
    its HTTP, gRPC or metrics service (it binds them after loading its models)."""
    return {name: port for name, port in ports.as_dict().items() if _bind_error(port, host) is not None}
