"""The files other processes read: ``jobs/<job>/endpoints/replica-<k>.json`` and ``jobs/<job>/ranks/rank-<r>.json``.

Readers (``hpc`` discover/track, clients on other nodes over a shared filesystem) must never see a half-written
file, so every write goes to a temporary sibling and is ``os.replace``d into place.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping

VERSION = 1


def job_dir(deployment_dir: str | os.PathLike[str], job_id: str) -> Path:
    return Path(deployment_dir) / "jobs" / job_id


def endpoint_path(deployment_dir: str | os.PathLike[str], job_id: str, replica: int) -> Path:
    return job_dir(deployment_dir, job_id) / "endpoints" / f"replica-{replica}.json"


def rank_path(deployment_dir: str | os.PathLike[str], job_id: str, rank: int) -> Path:
    return job_dir(deployment_dir, job_id) / "ranks" / f"rank-{rank}.json"


def write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    """Write ``data`` as JSON to ``path`` atomically (tmp file in the same dir + fsync + os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _usable(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_unspecified or ip.is_link_local)


def advertised_address(node: str, single_node: bool, env: Mapping[str, str] | None = None) -> str:
    """An IPv4 address of this node that other nodes can reach (never 127.x unless the job is single-node).

    ``$HPC_SERVE_ADVERTISE_ADDRESS`` wins; then the source address of the route to ``$HPC_SERVE_ROUTE_PROBE`` (a
    UDP connect sends no packet; default 10.255.255.255, i.e. the cluster-side interface on typical private
    networks); then the node name's DNS addresses; then ``hostname -I``; then the node name itself.
    """
    env = os.environ if env is None else env
    if env.get("HPC_SERVE_ADVERTISE_ADDRESS"):
        return env["HPC_SERVE_ADVERTISE_ADDRESS"]
    candidates: list[str] = []
    for probe in (env.get("HPC_SERVE_ROUTE_PROBE") or "10.255.255.255", "192.0.2.1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 9))
                candidates.append(sock.getsockname()[0])
        except OSError:
            pass
    try:
        candidates += [info[4][0] for info in socket.getaddrinfo(node, None, socket.AF_INET)]
    except OSError:
        pass
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
        candidates += out.split()
    except (OSError, subprocess.SubprocessError):
        pass
    for addr in candidates:
        if _usable(addr) and ":" not in addr:
            return addr
    return "127.0.0.1" if single_node else node


def endpoint_record(*, job_id: str, replica: int, rank: int, host: str, address: str, http_port: int,
                    grpc_port: int, metrics_port: int, pid: int, started_at: float, ready_at: float) -> dict:
    """The endpoint record of DEVELOPERS.md (field names are the contract with ``hpc``)."""
    return {
        "version": VERSION, "job_id": job_id, "replica": replica, "rank": rank, "host": host, "address": address,
        "http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port, "pid": pid,
        "started_at": started_at, "ready_at": ready_at,
    }


def rank_record(*, rank: int, host: str, exit_code: int | None, signal_name: str | None, log_tail: list[str],
                error: str | None = None) -> dict:
    """The rank exit record of DEVELOPERS.md; ``error`` is added only when the launcher itself gave up."""
    record: dict[str, object] = {
        "rank": rank, "host": host, "exit_code": exit_code, "signal": signal_name, "log_tail": log_tail,
        "ended_at": time.time(),
    }
    if error:
        record["error"] = error
    return record
