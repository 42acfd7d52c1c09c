"""The spec's `restart:` section: how `replica_policy: restart` restarts a replica that died without being asked
(the `.sub` does it: hpc/render/templates/tensorrt_llm_triton.sub.j2; DEVELOPERS.md "Replica restarts").

A replica's step is started again on the same nodes, after a back-off that doubles from `backoff` up to
`max_backoff`; after `max_restarts` restarts in a row the job ends as fail-job ends it, every run's cause kept. A
run that served for `reset_after` or longer starts the count afresh, so a replica that fails once a day in a
week-long job is not ended by its fourth failure.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from hpc.spec.checks import _Section
from hpc.spec.renew import _duration_text, duration_seconds


class RestartSpec(_Section):
    """Bounds of `replica_policy: restart`."""

    max_restarts: int = Field(3, ge=1, le=100, description="restarts in a row of one replica before the job fails")
    backoff: str = Field("10s", description="wait before the first restart; it doubles with each restart in a row")
    max_backoff: str = Field("5m", description="the longest wait between restarts")
    reset_after: str = Field(
        "10m", description="a run that served (READY) this long before it died starts the count of restarts afresh"
    )

    _durations = field_validator("backoff", "max_backoff", "reset_after", mode="before")(_duration_text)

    @property
    def backoff_s(self) -> int:
        return duration_seconds(self.backoff)

    @property
    def max_backoff_s(self) -> int:
        return max(duration_seconds(self.max_backoff), self.backoff_s)

    @property
    def reset_after_s(self) -> int:
        return duration_seconds(self.reset_after)
