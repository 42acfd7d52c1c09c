"""The files of an ordered stop (DEVELOPERS.md "Stopping", "Renewal"), each a typed record of launcher/contracts/records.py's
kind (versioned to_dict/from_dict, written whole), defined once for the side that writes it and the one that reads it:

- ``StopRequest``: ``jobs/<id>/cancel_requested`` (``hpc-serve cancel``) and ``jobs/<id>/stop_requested`` (the job
  itself: the `.sub`'s trap on Slurm's time-limit warning, through ``stop_request_format``; its renewer). Every
  rank's launcher stops in order once one is there: its presence is the request, its fields say who asked, when.
- ``StopNotice``: ``ranks/rank-<r>.stopping`` (``$HPC_SERVE_STOP_FILE``), a leader's launcher on its first stop
  signal: by when its model must have drained, and where the model says how far it got. The gateway and
  ``hpc.client`` send the job nothing new once one is there.
- ``DrainReport``: that ``drain_file`` (``ranks/rank-<r>.drain``), the leader's model: "draining", then "drained";
  its launcher sends tritonserver SIGTERM only then (launcher/node/stop.py LeaderDrain).
- ``DrainingMark``: ``jobs/<id>/draining``, the job's renewer once its successor serves (``final``: no new
  requests even though no other replica serves, its stop is near).

Standard library only: the launcher, the renewer and the CPU engine's model (inside tritonserver) import it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.contracts.config import STOP_ACK_S
from launcher.contracts.layout import JobPaths
from launcher.contracts.records import VERSION, Record

#: who wrote a StopRequest (the autoscaling controller: hpc/jobs/autoscale.py)
BY_CANCEL, BY_TIME_LIMIT, BY_RENEWER, BY_AUTOSCALE = "cancel", "time-limit", "renewer", "autoscale"
#: a DrainReport's states, in order
DRAINING, DRAINED = "draining", "drained"


@dataclass(frozen=True, kw_only=True)
class StopRequest(Record):
    """A stop asked of the whole job: every rank's launcher starts its ordered stop once the file is there."""

    version: int = VERSION
    at: float
    by: str
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class StopNotice(Record):
    """A leader's launcher got its first stop signal (``signal``, at ``at``): its model drains what is in flight
    until ``drain_until`` (epoch seconds) and reports in ``drain_file``; without a ``drain_file`` (a model that
    does not report, as TensorRT-LLM's backend) the launcher watches the server's metrics instead."""

    version: int = VERSION
    signal: str
    at: float
    drain_until: float
    drain_file: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StopNotice:
        record = super().from_dict(data)
        return dataclasses.replace(record, at=float(record.at), drain_until=float(record.drain_until))


@dataclass(frozen=True, kw_only=True)
class DrainReport(Record):
    """How the leader's model drains: ``DRAINING`` (it saw the stop, refuses new requests), then ``DRAINED``
    (nothing in flight any more)."""

    version: int = VERSION
    state: str
    at: float = 0.0


@dataclass(frozen=True, kw_only=True)
class DrainingMark(Record):
    """The job takes no new requests: its successor (``successor``) serves since ``at``; ``final``: not even when
    no other replica serves (its renewer stops it soon and no successor serves yet)."""

    version: int = VERSION
    at: float
    successor: str = ""
    final: bool = False


def stop_request_format() -> str:
    """The printf format of the `.sub`'s StopRequest (its one argument: the epoch seconds, `date +%s`)."""
    return StopRequest.shell_format(
        ["at"], by=BY_TIME_LIMIT, note="the batch script trap: USR1 (the time-limit warning) or TERM"
    )


def is_final(mark: Path) -> bool:
    """Whether the draining mark at ``mark`` says ``final`` (False without one, or while it is replaced)."""
    record = DrainingMark.read(mark)
    return record is not None and record.final


def stop_acknowledged(paths: JobPaths, within_s: float = STOP_ACK_S, poll_s: float = 0.1) -> bool:
    """Whether a leader of the job started its ordered stop (its ``rank-<r>.stopping``) within ``within_s`` of a
    stop request (the cancel marker, the job's own stop request). Who asked (``hpc-serve cancel``, the job's
    renewer) falls back to ``scancel --signal=TERM`` when not: launchers from before they watched the files, or a
    leader not started yet."""
    deadline = time.monotonic() + within_s
    while not paths.stopping_marks():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True
