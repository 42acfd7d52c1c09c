"""The autoscaling controller's record, ``D/autoscale.json``: its last decisions (`status` shows them as a table) and
the state its hysteresis needs, so that a gateway job's successor takes the controller over where it was.

The gateway job writes it (hpc/jobs/autoscale.py), `status` reads it; the policy that makes the decisions:
hpc/serving/autoscale.py. Standard library only, like every record here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.contracts.records import VERSION, Record
from launcher.contracts.text_enum import TextEnum

#: decisions kept in the record, newest last: a few hours of a busy controller's acts (holds that say the same
#: as the one before are not appended again, hpc/jobs/autoscale.py)
KEEP_DECISIONS = 50


class Action(TextEnum):
    """What one decision does: nothing, add a job, or one of the three ways a job leaves (never a kill)."""

    HOLD = "hold"
    SUBMIT = "submit"
    #: scancel a surplus PENDING job (it holds no GPU and serves nobody)
    CANCEL = "cancel"
    #: no new requests, those in flight finish, then the ordered stop: the job ends COMPLETED
    DRAIN = "drain"
    #: a job close to its time limit: its renewer submits no successor, it serves to its end
    EXPIRE = "expire"


@dataclass(frozen=True, kw_only=True)
class DecisionRecord(Record):
    """One decision: when, what (on which job), why, the load signal's value against its target, and whether it was
    only advised (`autoscale.advisory`) or acted on (`error`: the act failed, e.g. sbatch's words)."""

    version: int = VERSION
    at: float = 0.0
    action: str = Action.HOLD
    job_id: str = ""
    reason: str = ""
    signal: float = 0.0
    target: float = 0.0
    advisory: bool = False
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class AutoscaleRecord(Record):
    """The controller's state: which gateway job runs it, since when the load has been above its target (`up_since`)
    or has fitted one job fewer (`down_since`), the jobs it drains and since when, and its last decisions."""

    version: int = VERSION
    controller: str = ""
    up_since: float | None = None
    down_since: float | None = None
    draining: dict[str, float] = field(default_factory=dict)
    decisions: tuple[DecisionRecord, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["decisions"] = [d.to_dict() for d in self.decisions]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AutoscaleRecord:
        rows = tuple(DecisionRecord.from_dict(row) for row in data.get("decisions") or () if isinstance(row, Mapping))
        record = super().from_dict({k: v for k, v in data.items() if k != "decisions"})
        return dataclasses.replace(record, decisions=rows, draining=dict(record.draining or {}))

    def with_decision(self, decision: DecisionRecord) -> AutoscaleRecord:
        """This record with `decision` appended (the oldest dropped beyond KEEP_DECISIONS)."""
        return dataclasses.replace(self, decisions=(*self.decisions, decision)[-KEEP_DECISIONS:])
