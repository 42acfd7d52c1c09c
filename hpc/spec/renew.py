"""The spec's `renew:` section: a deployment that outlives its job's time limit (launcher/jobscript/renew.py does it).

Each job submits its successor `before` its time limit, hands over once the successor is READY, and ends with
an ordered stop; `max_jobs` and `until` bound the chain. How `before` must fit the job's `slurm.time` is
checked with the whole spec (hpc/spec/schema.py `Spec`), since it needs both sections.
"""

from __future__ import annotations

import re
from datetime import date, datetime, time
from typing import Any

from pydantic import Field, field_validator

from hpc.spec.checks import _Section

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_UNITS = (86400, 3600, 60, 1)


def duration_seconds(value: str) -> int:
    """`15m`, `90s`, `1h30m`, `2d` → seconds (ValueError naming the forms)."""
    match = _DURATION.fullmatch(value.strip())
    if not value.strip() or match is None:
        raise ValueError(f"{value!r} is not a duration; use e.g. 15m, 90s, 1h30m or 1d")
    return sum(int(part) * unit for part, unit in zip(match.groups(), _UNITS, strict=True) if part)


def format_duration(seconds: float) -> str:
    """Seconds as a duration the spec accepts (the shortest such text)."""
    seconds = int(seconds)
    parts: list[str] = []
    for suffix, unit in zip("dhms", _UNITS, strict=True):
        if seconds >= unit or (unit == 1 and not parts):
            parts.append(f"{seconds // unit}{suffix}")
            seconds %= unit
    return "".join(parts)


def _duration_text(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"got the number {value}: give a unit, e.g. 15m, 90s or 1h30m")
    if isinstance(value, str):
        duration_seconds(value)
    return value


class RenewSpec(_Section):
    """Renew the job before its time limit: a successor job of the same deployment takes over with nothing
    dropped (DEVELOPERS.md "Renewal")."""

    before: str = Field(
        description="submit the successor this long before the time limit (e.g. 15m): its queue wait and start-up"
    )
    max_jobs: int | None = Field(None, ge=1, description="jobs in the chain, the first included; default no bound")
    until: datetime | None = Field(
        None, description="submit no successor after this date/time (local time unless it names a zone)"
    )
    drain: str = Field(
        "1m", description="once the successor serves, how long requests in flight may still run on the predecessor"
    )

    _durations = field_validator("before", "drain", mode="before")(_duration_text)

    @field_validator("until", mode="before")
    @classmethod
    def _date_is_midnight(cls, value: Any) -> Any:
        # YAML reads `until: 2026-12-01` as a date; it means the start of that day
        if isinstance(value, date) and not isinstance(value, datetime):
            return datetime.combine(value, time())
        return value

    @property
    def before_s(self) -> int:
        return duration_seconds(self.before)

    @property
    def drain_s(self) -> int:
        return duration_seconds(self.drain)

    @property
    def until_epoch(self) -> float | None:
        """`until` as epoch seconds (a time without a zone is this machine's local time, as Slurm's are)."""
        return self.until.timestamp() if self.until is not None else None
