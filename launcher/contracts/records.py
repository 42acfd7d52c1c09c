"""The records other processes read: ``endpoints/replica-<k>.json``, ``endpoints/replica-<k>.starting``,
``ranks/rank-<r>.json``, ``chain.json`` and the gateway's address record (paths: layout.py).

Defined once, as typed records with a version, for both sides: the launcher writes them, ``hpc`` (track, client)
reads them, on other nodes over a shared filesystem. Readers must never see a half-written file, so every
write goes to a temporary sibling and is ``os.replace``d into place; and a reader takes a record of an older
version (fields it lacks get defaults) or a newer one (fields it does not know are ignored).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from launcher.contracts.layout import ENDPOINT_GLOB, RANK_RECORD_GLOB, JobPaths
from launcher.contracts.llmapi import ENGINE
from launcher.contracts.text_enum import TextEnum
from launcher.contracts.urls import grpc_target, http_url, metrics_url

#: version 1: the first with a version key in the endpoint record; rank records had none before it. The
#: records of a job (endpoint, startup, chain, gateway) gained an optional ``cluster`` within version 1: the Slurm
#: cluster of their job (job ids are per cluster); "" in a record written before it, or for a job of no cluster.
VERSION = 1


def write_json_atomic(path: Path, data: Mapping[str, object], indent: int = 1) -> None:
    """Write ``data`` as JSON to ``path`` atomically (tmp file in the same dir + fsync + os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=indent)
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
        candidates += [str(info[4][0]) for info in socket.getaddrinfo(node, None, socket.AF_INET)]
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


_R = TypeVar("_R", bound="Record")


#: the files said once to be no record of their kind (Record.read)
_REPORTED: set[tuple[str, str]] = set()


def _report(path: Path, kind: type, exc: BaseException) -> None:
    key = (str(path), kind.__name__)
    if key not in _REPORTED:
        _REPORTED.add(key)
        print(
            f"hpc-serve: {path} is not a readable {kind.__name__} ({type(exc).__name__}: {exc}); ignored",
            file=sys.stderr,
        )


class Record:
    """to/from dict for the record dataclasses below (and launcher/contracts/stop_records.py, launcher/contracts/build_records.py):
    unknown keys are ignored, missing ones take defaults; ``write`` and ``read`` a record's file whole."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[_R], data: Mapping[str, Any]) -> _R:
        # type[_R] -> _R rather than typing.Self (3.11+): ranks import this with the container's python3 (3.10)
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in names})

    def write(self, path: Path) -> None:
        """Write the record to ``path`` atomically: a reader sees the old one or this one, never half."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def read(cls: type[_R], path: Path) -> _R | None:
        """The record at ``path``, or None: none there yet (or any more). A file that is there but is not one of
        these (not JSON, a schema it does not fit, unreadable) is None too, and said once on stderr: records are
        written whole (``write_json_atomic``), so that is a bug or a hand edit, never a record half written."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            _report(path, cls, exc)
            return None
        try:
            return cls.from_dict(json.loads(text))
        except (ValueError, TypeError, AttributeError) as exc:
            _report(path, cls, exc)
            return None

    @classmethod
    def shell_format(cls, args: Sequence[str], **values: Any) -> str:
        """A printf(1) format that writes this record as JSON, for a bash script that must write one: the fields
        in ``args`` (in the fields' order) come from printf's arguments (``%d`` an int, ``%s`` a float, ``"%s"`` a
        str: no quote or backslash in it), those in ``values`` are fixed, the others take their defaults. So the
        file's format is typed once, here, for the script as for python (render passes the format in)."""
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        if list(args) != [name for name in names if name in args]:
            raise ValueError(f"{cls.__name__}.shell_format: {list(args)} are not fields in the fields' order {names}")
        marks = {name: f"@{name}@" for name in args}
        text = json.dumps(cls(**values, **marks).to_dict())
        text = text.replace("\\", "\\\\").replace("%", "%%")
        types = {f.name: str(f.type) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for name in args:
            kind = types[name].split("|")[0].strip()
            text = text.replace(f'"@{name}@"', {"int": "%d", "float": "%s"}.get(kind, '"%s"'))
        return text + "\\n"


@dataclass(frozen=True, kw_only=True)
class EndpointRecord(Record):
    """Where a replica serves, published by its leader once ``/v2/health/ready`` answered 200."""

    version: int = VERSION
    job_id: str = ""
    cluster: str = ""  # the job's Slurm cluster ($SLURM_CLUSTER_NAME); "" for a local job or an older record
    replica: int = 0
    rank: int = 0
    host: str = ""
    address: str
    http_port: int
    grpc_port: int = 0
    metrics_port: int = 0
    pid: int = 0
    started_at: float = 0.0
    ready_at: float = 0.0
    #: the replica's TensorRT-LLM workflow (launcher/contracts/llmapi.py), which says the model clients send
    #: generations to and how (hpc/serving/model_io.py); an older record has none: the engine workflow's ensemble
    workflow: str = ENGINE
    #: its generation model streams (decoupled); False: one whole response a request (launch plan `decoupled`)
    decoupled: bool = True
    #: llmapi: which `tensorrt_llm` model serves (launcher/contracts/llmapi.py OWN_MODEL, IMAGE_MODEL): the image's
    #: takes fewer inputs (hpc/serving/model_io.py); an older record has none: taken as hpc-serve's
    llmapi_model: str = ""
    #: replica_policy restart: how many times the job restarted this replica before this run (0: its first)
    restarts: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EndpointRecord:
        record = super().from_dict(data)
        return dataclasses.replace(  # JSON written by hand or by another tool may quote numbers
            record,
            job_id=str(record.job_id),
            cluster=str(record.cluster or ""),
            replica=int(record.replica),
            rank=int(record.rank),
            http_port=int(record.http_port),
            grpc_port=int(record.grpc_port),
            metrics_port=int(record.metrics_port),
            decoupled=record.decoupled is not False,  # only an explicit false is a unary model
            pid=int(record.pid),
            restarts=int(record.restarts or 0),
        )

    @property
    def http_url(self) -> str:
        return http_url(self.address, self.http_port)

    @property
    def grpc_url(self) -> str:
        return grpc_target(self.address, self.grpc_port)

    @property
    def metrics_url(self) -> str:
        return metrics_url(self.address, self.metrics_port)


@dataclass(frozen=True, kw_only=True)
class RankExitRecord(Record):
    """How a rank ended: written by its launcher when tritonserver exits, or when the launcher itself gave up
    (``error`` says why: world size, port, ready timeout, a python stub that died). ``cause_rank``: the launcher
    ended this rank because that rank of its replica failed (launcher/node/watch.py); the cause is that rank's record."""

    version: int = VERSION
    rank: int
    host: str = "?"
    exit_code: int | None = None
    signal: str | None = None
    log_tail: list[str] = field(default_factory=list)
    ended_at: float = 0.0
    error: str | None = None
    cause_rank: int | None = None
    #: llmapi rank 0: how its leader node ended after tritonserver: its exit code, and the signal the launcher had
    #: to send it (None: it ended as its release ends it, by itself or `--action stop`; "SIGTERM", "SIGKILL")
    leader_node_exit: int | None = None
    leader_node_signal: str | None = None

    @property
    def failed(self) -> bool:
        """A non-zero exit, or a signal (a record may name the signal alone: hpc/jobs/status.py first_failure
        must head a FAILED job's status with the rank that was killed, not with a peer Slurm ended after it)."""
        return self.exit_code not in (0, None) or self.signal is not None

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        for key in ("error", "cause_rank", "leader_node_exit", "leader_node_signal"):
            if data[key] is None:
                del data[key]  # present only when the launcher gave up, or ended the rank for a peer
        return data


#: ReplicaRestart.outcome: the `.sub` starts the replica again at ``restart_at``; or it does not, and the job ends
#: as fail-job ends it: the bound was reached, or a rank gave up on what a restart cannot change (NO_RESTART_SUFFIX)
RESTARTING, GAVE_UP, NOT_RESTARTABLE = "restarting", "gave-up", "not-restartable"


@dataclass(frozen=True, kw_only=True)
class ReplicaRestart(Record):
    """replica_policy restart: replica ``replica``'s step ended without being asked (exit status ``exit_status`` at
    ``ended_at``), and what the `.sub` does about it (``outcome``). ``restarts``: the restarts so far, this one
    included; the rank records of the run that ended are in JobPaths.replica_ended_run(replica, restarts)."""

    version: int = VERSION
    replica: int
    restarts: int
    exit_status: int
    ended_at: float
    restart_at: float
    outcome: str
    max_restarts: int = 0

    @classmethod
    def shell(cls, max_restarts: int) -> str:
        """The `.sub`'s printf format: replica, restarts, exit status, ended at, restart at (epoch s), outcome."""
        return cls.shell_format(
            ["replica", "restarts", "exit_status", "ended_at", "restart_at", "outcome"], max_restarts=max_restarts
        )


def read_replica_restarts(job: JobPaths) -> dict[int, ReplicaRestart]:
    """Every replica's latest ReplicaRestart of a job (replica_policy restart), by replica."""
    found = _read(job.replica_restarts_dir, "replica-*.json", ReplicaRestart)
    return {record.replica: record for record in found}


def _read(folder: Path, pattern: str, kind: type[_R]) -> list[_R]:
    """Every record of ``kind`` in ``folder`` (Record.read: one that is not one is left out, and said once)."""
    records = (kind.read(path) for path in sorted(folder.glob(pattern))) if folder.is_dir() else iter(())
    return [record for record in records if record is not None]


class Phase(TextEnum):
    """A replica leader's startup phases (StartupRecord.phase), in order: tritonserver loads its models until
    ``/v2/health/ready`` answers 200, then one real request must come back (launcher/node/warmup.py) before the
    endpoint record is published; ``status`` says which one a STARTING replica is in. str-valued: the record
    carries the value, and a record read back holds the plain text (equal to its Phase)."""

    LOADING = "loading"
    WARMING_UP = "warming-up"


LOADING, WARMING_UP = Phase.LOADING, Phase.WARMING_UP
PHASES = tuple(Phase)
#: what ``status`` says a replica in each phase is waiting for
PHASE_TEXT: dict[str, str] = {LOADING: "loading the models", WARMING_UP: "warming up"}


@dataclass(frozen=True, kw_only=True)
class StartupRecord(Record):
    """What a replica's leader is waiting for before it publishes its endpoint (``phase``: LOADING, then
    WARMING_UP), since when (``since``, epoch seconds), and in words (``detail``: the request it sent). Written
    by the leader's launcher at each phase, removed once the endpoint is published or the rank ends: a replica
    with neither record has not started its leader yet."""

    version: int = VERSION
    job_id: str = ""
    cluster: str = ""  # as in EndpointRecord
    replica: int = 0
    rank: int = 0
    host: str = ""
    phase: str = LOADING
    since: float = 0.0
    started_at: float = 0.0
    detail: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StartupRecord:
        record = super().from_dict(data)
        return dataclasses.replace(
            record, job_id=str(record.job_id), cluster=str(record.cluster or ""), replica=int(record.replica)
        )

    def describe(self, now: float) -> str:
        """`replica 0: warming up (ensemble, 1 token) for 0.4 s`: what `status` shows of a STARTING replica."""
        what = PHASE_TEXT.get(self.phase, self.phase)
        detail = f" ({self.detail})" if self.detail else ""
        return f"replica {self.replica}: {what}{detail} for {max(0.0, now - self.since):.0f} s"


def read_startups(job: JobPaths) -> list[StartupRecord]:
    """Every replica leader's startup record of a job, by replica (replicas not yet ready or ended)."""
    found = [record for path in job.starting_records() if (record := StartupRecord.read(path)) is not None]
    return sorted(found, key=lambda r: r.replica)


def read_endpoints(job: JobPaths) -> list[EndpointRecord]:
    """Every published replica endpoint of a job, by replica number."""
    return sorted(_read(job.endpoints_dir, ENDPOINT_GLOB, EndpointRecord), key=lambda r: r.replica)


def read_rank_records(job: JobPaths) -> list[RankExitRecord]:
    """Every rank exit record of a job, by rank."""
    return sorted(_read(job.ranks_dir, RANK_RECORD_GLOB, RankExitRecord), key=lambda r: r.rank)


def read_ended_run(job: JobPaths, replica: int, restart: int) -> list[RankExitRecord]:
    """The rank exit records of the run of ``replica`` that ended before its restart ``restart``, by rank."""
    folder = job.replica_ended_run(replica, restart)
    return sorted(_read(folder, RANK_RECORD_GLOB, RankExitRecord), key=lambda r: r.rank)


@dataclass(frozen=True, kw_only=True)
class ChainRecord(Record):
    """A job's place in its renewal chain (``jobs/<id>/chain.json``, launcher/jobscript/renew.py): the jobs of one deployment
    folder, each submitted by its predecessor's renewer before the time limit. Written only by the job's own
    renewer; the link is both ways (``predecessor`` from the environment its predecessor submitted it with,
    ``successor`` once it submitted one). Times are epoch seconds, 0 for "not yet"."""

    version: int = VERSION
    job_id: str
    cluster: str = ""  # the chain's jobs' Slurm cluster: a successor is queued where its predecessor runs
    index: int = 1  # 1 for the job that started the chain (by `hpc-serve submit` or a hand-run sbatch)
    predecessor: str = ""
    successor: str = ""
    started_at: float = 0.0
    ends_at: float = 0.0  # the time limit as Slurm last said it
    renew_at: float = 0.0  # when it submits its successor (ends_at - renew.before)
    submitted_at: float = 0.0  # the successor's sbatch
    handover_at: float = 0.0  # the successor was READY: this job was marked draining
    stopped_at: float = 0.0  # its renewer started the ordered stop
    note: str = ""  # why it has no successor, or how it ended its service

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChainRecord:
        record = super().from_dict(data)
        return dataclasses.replace(  # job ids are text, whatever wrote them
            record,
            job_id=str(record.job_id),
            cluster=str(record.cluster or ""),
            predecessor=str(record.predecessor or ""),
            successor=str(record.successor or ""),
        )


def read_chain(job: JobPaths) -> ChainRecord | None:
    """The job's chain record, or None (no renewal, or not started yet)."""
    return ChainRecord.read(job.chain)


@dataclass(frozen=True, kw_only=True)
class GatewayRecord(Record):
    """Where the gateway of a deployment listens (layout.gateway_record), written when it starts serving and
    removed when it stops; clients (`hpc.client`, `hpc-serve endpoints`) go through it when it answers.
    `job_id` is set when the gateway runs as a Slurm job of its own, else empty (login node, workstation)."""

    version: int = VERSION
    name: str
    url: str  # http://<address>:<port>, the base of /v1 and /v2
    host: str = ""
    pid: int = 0
    job_id: str = ""
    cluster: str = ""  # the gateway job's Slurm cluster; "" for a gateway started by hand (or an older record)
    started_at: float = 0.0
    auth: bool = True


def read_gateway(path: Path) -> GatewayRecord | None:
    """The gateway record at `path`, or None when there is none."""
    return GatewayRecord.read(path)


@dataclass(frozen=True, kw_only=True)
class SuccessorRecord(Record):
    """``jobs/<id>/gateway_successor``: the gateway job that gateway job ``<id>`` submitted to take over from it
    before its time limit (hpc/jobs/renewal.py). Written by the live gateway; read by each starting gateway job, to
    know whether it is that successor (it may then take the address over)."""

    version: int = VERSION
    job_id: str = ""
    at: float = 0.0


#: a stop and a job's start compared across nodes' clocks: a job that started this close after the stop still stops
RENEW_STOP_SLACK_S = 1.0


@dataclass(frozen=True, kw_only=True)
class RenewStop(Record):
    """``D/renew_stopped``: the deployment was cancelled (`hpc-serve cancel`, hpc/jobs/chain.py) at ``at`` (epoch
    seconds); the renewer of any job that started before then submits no successor (launcher/jobscript/renew.py for
    serving jobs, hpc/jobs/renewal.py for the gateway's)."""

    version: int = VERSION
    at: float = 0.0

    def stops(self, started: float) -> bool:
        """Whether a job that started at ``started`` renews no more."""
        return self.at >= started - RENEW_STOP_SLACK_S
