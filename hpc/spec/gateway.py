"""The spec's `gateway:` section: `hpc-serve gateway` as a small Slurm job of its own (hpc/jobs/gateway.py)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from hpc.spec.checks import (
    _SLURM_WORD,
    Port,
    SlurmMem,
    SlurmTime,
    _check,
    _Section,
    _single_options,
    _tcp_port,
)
from hpc.spec.limits import MAX_BODY_MB, MAX_OUTSTANDING, PREFIX_CHARS
from launcher.contracts.config import DISCOVERY_REFRESH_S

#: the most gateway worker processes: a login node's or a service node's share, far above what 8 replicas need
MAX_WORKERS = 64
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-]*$|^[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*$")


class GatewaySpec(_Section):
    """`hpc-serve gateway` as a small Slurm job of its own (`submit` submits it beside the serving job): one address
    in front of every job of the deployment, which outlives them. The serving job's account/partition/qos are the
    defaults; the rest is what a single CPU-only service needs."""

    enabled: bool = Field(True, description="false: keep the section but submit no gateway job")
    host: str = Field("0.0.0.0", description="address to listen on; 0.0.0.0: every interface (login nodes reach it)")
    port: Port = Field("auto", description="TCP port, or auto (a free one; the address record says which)")
    time: SlurmTime | None = Field(None, description="the gateway job's time limit; default slurm.time")
    partition: str | None = Field(None, description="default slurm.partition")
    account: str | None = Field(None, description="default slurm.account")
    qos: str | None = Field(None, description="default slurm.qos")
    cpus: int = Field(2, ge=1, description="--cpus-per-task of the gateway job")
    mem: SlurmMem | None = Field("2G", description="--mem of the gateway job (e.g. 2G); null: the cluster's default")
    nodelist: str | None = Field(None, description="pin the gateway to a node (-w), e.g. a service node")
    sbatch_args: list[str] = Field(default_factory=list, description="extra #SBATCH directives for the gateway job")
    refresh_s: float = Field(
        DISCOVERY_REFRESH_S, gt=0, le=300, description="seconds between looks for new or lost replicas"
    )
    max_outstanding: int = Field(
        MAX_OUTSTANDING, ge=0, description="requests in flight per replica before the gateway answers 429 (0: no bound)"
    )
    prefix_chars: int = Field(
        PREFIX_CHARS, ge=0, description="prompt characters that key prefix affinity (0: off, least outstanding only)"
    )
    max_body_mb: int = Field(
        MAX_BODY_MB, ge=0, description="the largest request body the gateway takes, in MiB (413 beyond; 0: no bound)"
    )
    workers: int = Field(
        1,
        ge=1,
        le=MAX_WORKERS,
        description="gateway processes serving its one port (at most gateway.cpus): more when one core cannot relay "
        "what the replicas stream (docs/gateway.md)",
    )

    _names = field_validator("partition", "account", "qos", "nodelist")(_check(_SLURM_WORD, "Slurm name"))
    _host = field_validator("host")(_check(_HOST, "host to listen on (an IP address or a host name)"))
    _options = field_validator("sbatch_args")(_single_options)
    _port = field_validator("port")(_tcp_port)

    @model_validator(mode="after")
    def _a_core_each(self) -> GatewaySpec:
        """A worker is an event loop that keeps a core busy under load: more than the job's cores slow each other."""
        if self.workers > self.cpus:
            raise ValueError(
                f"@workers: {self.workers} workers need a core each, and gateway.cpus is {self.cpus}: raise "
                f"gateway.cpus to {self.workers}, or ask for fewer workers"
            )
        return self
