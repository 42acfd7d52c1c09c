"""The spec's `autoscale:` section: a deployment that grows with its load and gives GPUs back, counted in serving
jobs (each carries the spec's `replicas`).

The controller lives in the gateway job (it is where the deployment's load is measured), so the section needs
`gateway:`; that and the fit with the gateway's admission bound are checked with the whole spec
(hpc/spec/schema.py `Spec`). The rules the controller follows: hpc/serving/autoscale.py; why this signal:
docs/decisions.md "Autoscaling on Slurm".
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from hpc.spec.checks import _Section
from hpc.spec.renew import _duration_text, duration_seconds


class AutoscaleSpec(_Section):
    """Grow and shrink the deployment between `min_jobs` and `max_jobs` serving jobs on the requests in flight per
    READY replica, as the gateway counts them; scale down by drain, never by kill."""

    min_jobs: int = Field(1, ge=0, description="serving jobs kept at least (0: none while idle; the gateway stays)")
    max_jobs: int = Field(ge=1, description="serving jobs at most, pending ones included")
    target_outstanding: float = Field(
        4.0,
        gt=0,
        description="requests in flight per READY replica the deployment aims at (the gateway's count: queued in "
        "the engine and decoding); above it for scale_up_after adds a job",
    )
    ttft_sla_s: float | None = Field(
        None, gt=0, description="optional: a time to first token (seconds) whose breach also adds a job"
    )
    scale_up_after: str = Field("30s", description="the load stays above target this long before a job is added")
    scale_down_after: str = Field(
        "5m", description="the load fits one job fewer this long before one is drained (N/(N-1) check)"
    )
    gpu_budget: int | None = Field(
        None,
        ge=1,
        description="GPUs the deployment's serving jobs may hold at once, pending and hand-submitted ones "
        "included; checked before every sbatch",
    )
    advisory: bool = Field(False, description="true: decide and record every decision, but act on none")
    hold_s: float = Field(
        120.0,
        ge=0,
        description="with nothing serving, how long the gateway holds a request while a job starts (the "
        "controller submits one at once) before it answers 503 with Retry-After; 0: 503 at once",
    )
    horizon: str = Field(
        "15m", description="a pending job whose estimated start is further off than this is flagged in `status`"
    )

    _durations = field_validator("scale_up_after", "scale_down_after", "horizon", mode="before")(_duration_text)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleSpec:
        if self.min_jobs > self.max_jobs:
            raise ValueError(
                f"@min_jobs: min_jobs {self.min_jobs} is more than max_jobs {self.max_jobs}; "
                f"raise max_jobs to {self.min_jobs} or lower min_jobs"
            )
        return self

    @property
    def scale_up_after_s(self) -> int:
        return duration_seconds(self.scale_up_after)

    @property
    def scale_down_after_s(self) -> int:
        return duration_seconds(self.scale_down_after)

    @property
    def horizon_s(self) -> int:
        return duration_seconds(self.horizon)
