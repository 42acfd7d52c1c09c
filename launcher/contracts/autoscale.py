"""The autoscaling controller's record, ``D/autoscale.json``: its last decisions (`status` shows them as a table) and
the state its hysteresis needs, so that a gateway job's successor takes the controller over where it was.

The gateway job writes it (hpc/jobs/autoscale.py), `status` reads it; the policy that makes the decisions:
hpc/serving/autoscale.py. Standard library only, like every record here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from launcher.contracts.records import VERSION, Record
from launcher.contracts.text_enum import TextEnum

#: decisions kept in the record, newest last: a few hours of a busy controller's acts (holds that say the same
#: as the one before are not appended again, hpc/jobs/autoscale.py)
KEEP_DECISIONS = 50
#: samples kept in the record (one a look, hpc/jobs/autoscale.py TICK_S): past this the older half is thinned to
#: every other one, so the newest hour stays whole and the hours before it sparser, the record bounded
KEEP_SAMPLES = 720


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


class Sample(NamedTuple):
    """One look: its jobs by phase (an expiring job counts as draining: both are leaving), the load signal against
    its target, and the requests in flight it measured (the mean over the look). A list in the file (compact: one
    a look for hours), named here."""

    at: float
    pending: int
    starting: int
    ready: int
    draining: int
    signal: float
    target: float
    in_flight: float


def _sample(row: Any) -> Sample | None:
    """A sample from its JSON list; None for a row of another shape (a hand edit)."""
    if not isinstance(row, list | tuple) or len(row) != len(Sample._fields):
        return None
    try:
        at, pending, starting, ready, draining, signal, target, in_flight = row
        return Sample(
            float(at), int(pending), int(starting), int(ready), int(draining), float(signal), float(target),
            float(in_flight),
        )  # fmt: skip
    except (TypeError, ValueError):
        return None


def thinned(samples: tuple[Sample, ...], keep: int = KEEP_SAMPLES) -> tuple[Sample, ...]:
    """`samples` bounded by `keep`: past it, those older than the newest half are thinned to every other one."""
    if len(samples) <= keep:
        return samples
    recent = keep // 2
    return (*samples[:-recent][::2], *samples[-recent:])


@dataclass(frozen=True, kw_only=True)
class AutoscaleRecord(Record):
    """The controller's state: which gateway job runs it, since when the load has been above its target (`up_since`)
    or has fitted one job fewer (`down_since`), the jobs it drains and since when, and its last decisions.

    When it expects capacity (`expected_at`, epoch seconds; None: nothing on the way, or Slurm gives no start
    estimate yet): the earliest job on its way (`expected_job`), its start estimate plus a job's time from start
    to READY (`ready_after_s`, as the deployment's job `measured_job` took; None: not measured yet), in words for
    `status` (`expected_note`); a gateway's 503 tells a held request's client to come back then. `samples`: one a
    look, for the plot of jobs over time (`thinned`)."""

    version: int = VERSION
    controller: str = ""
    up_since: float | None = None
    down_since: float | None = None
    draining: dict[str, float] = field(default_factory=dict)
    decisions: tuple[DecisionRecord, ...] = ()
    expected_at: float | None = None
    expected_job: str = ""
    expected_note: str = ""
    ready_after_s: float | None = None
    measured_job: str = ""
    samples: tuple[Sample, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["decisions"] = [d.to_dict() for d in self.decisions]
        data["samples"] = [list(s) for s in self.samples]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AutoscaleRecord:
        rows = tuple(DecisionRecord.from_dict(row) for row in data.get("decisions") or () if isinstance(row, Mapping))
        samples = tuple(s for row in data.get("samples") or () if (s := _sample(row)) is not None)
        record = super().from_dict({k: v for k, v in data.items() if k not in ("decisions", "samples")})
        return dataclasses.replace(record, decisions=rows, samples=samples, draining=dict(record.draining or {}))

    def with_decision(self, decision: DecisionRecord) -> AutoscaleRecord:
        """This record with `decision` appended (the oldest dropped beyond KEEP_DECISIONS)."""
        return dataclasses.replace(self, decisions=(*self.decisions, decision)[-KEEP_DECISIONS:])

    def with_sample(self, sample: Sample) -> AutoscaleRecord:
        """This record with `sample` appended (the older ones thinned beyond KEEP_SAMPLES)."""
        return dataclasses.replace(self, samples=thinned((*self.samples, sample)))
