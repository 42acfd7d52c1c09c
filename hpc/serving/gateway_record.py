"""The gateway's address record (`<workdir>/<name>.gateway.json`, launcher.contracts.records.GatewayRecord): written by the
gateway once it listens, removed when it stops, read by `status`, `endpoints`, `submit` and the Python client.

Why the record is checked by asking the gateway (`GET /gateway/health`) and not trusted as it is: a gateway
killed outright (SIGKILL, a node lost, the time limit's KILL) leaves its record behind, and another process may
listen on that port by now. Only an answer naming this deployment (its name and workdir) makes a record live.
Standard library only (urllib, no proxy): `hpc-serve status` must not pay for the web stack.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
from dataclasses import dataclass
from pathlib import Path

from hpc.serving.deployment import Target
from launcher.contracts.layout import gateway_record
from launcher.contracts.records import GatewayRecord, read_gateway, write_json_atomic
from launcher.contracts.urls import GATEWAY_HEALTH_PATH, open_direct

PROBE_TIMEOUT_S = 2.0


def record_path(target: Target) -> Path:
    return gateway_record(target.workdir, target.name)


def node_name() -> str:
    """The node a gateway runs on, as Slurm names it (the test cluster's nodes share one hostname)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def health_body(target: Target) -> dict[str, object]:
    """What `GET /gateway/health` answers: enough to tell this deployment's gateway from any other server."""
    return {"name": target.name, "workdir": str(target.workdir), "pid": os.getpid()}


def health(record: GatewayRecord, target: Target, timeout: float = PROBE_TIMEOUT_S) -> dict[str, object] | None:
    """What a gateway of `target` at the record's URL answers now (`health_body` and `replicas_ready`), or None:
    nothing answers there, or not this deployment's gateway."""
    try:
        with open_direct(record.url + GATEWAY_HEALTH_PATH, timeout=timeout) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    ours = isinstance(body, dict) and body.get("name") == target.name and body.get("workdir") == str(target.workdir)
    return body if ours else None


def answers(record: GatewayRecord, target: Target, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a gateway of `target` answers at the record's URL now."""
    return health(record, target, timeout) is not None


def live_gateway(target: Target) -> GatewayRecord | None:
    """The deployment's gateway record when its gateway answers, else None (no record, or a stale one)."""
    record = read_gateway(record_path(target))
    return record if record is not None and answers(record, target) else None


def publish(target: Target, record: GatewayRecord) -> None:
    """Write the record atomically (a reader never sees half of it); replaces a stale one."""
    write_json_atomic(record_path(target), record.to_dict())


def _same(a: GatewayRecord, b: GatewayRecord) -> bool:
    return (a.host, a.pid, a.started_at) == (b.host, b.pid, b.started_at)


def withdraw(target: Target, record: GatewayRecord) -> bool:
    """Remove the record if it is still `record` (a gateway started since keeps its own). True if removed."""
    current = read_gateway(record_path(target))
    if current is None or not _same(current, record):
        return False
    record_path(target).unlink(missing_ok=True)
    return True


def withdraw_job(target: Target, job_id: str) -> bool:
    """After a gateway job ended: remove a record it left behind (killed before it could), if it names that job
    and nothing answers there any more."""
    current = read_gateway(record_path(target))
    if current is None or current.job_id != job_id or answers(current, target):
        return False
    return withdraw(target, current)


#: a gateway that answers with no replica to send to: every request gets 503 until a job of the deployment is READY
IDLE = "IDLE"
IDLE_REASON = "no replica is READY: every request is answered 503 until a job of the deployment is"


@dataclass(frozen=True)
class GatewayLine:
    """The deployment's gateway as `status` shows it: which job (or process) it is, its state, its URL."""

    state: str  # PENDING, STARTING, READY, IDLE, UNREACHABLE, or a job's end state
    job_id: str = ""
    url: str = ""
    host: str = ""
    pid: int = 0
    reason: str | None = None

    def summary(self) -> str:
        who = self.job_id or (f"on {self.host} (pid {self.pid})" if self.host else "")
        text = " ".join(part for part in ("gateway", who, self.state, self.url) if part)
        return text + (f" ({self.reason})" if self.reason else "")

    def to_json(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items()}
