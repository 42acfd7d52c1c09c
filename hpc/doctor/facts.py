"""What the doctor's login-side checks found about the cluster (`Facts`), and the judgments of a job's partition
and time limit against them: the serving job's checks (hpc/doctor/login.py) and the gateway job's
(hpc/doctor/gateway.py) both ask them, so they sit below both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpc.doctor.parse import NodeInfo
from hpc.doctor.report import Check, fail, ok
from hpc.spec.checks import slurm_time_seconds


@dataclass
class Facts:
    """What the login-side checks found about this cluster."""

    slurm_version: str | None = None
    config: dict[str, str] = field(default_factory=dict)
    accounting: bool = False
    mpi: list[str] = field(default_factory=list)
    partitions: list[dict[str, str]] = field(default_factory=list)
    nodes: list[NodeInfo] = field(default_factory=list)
    partition: str | None = None  # the partition the spec runs on (its own, or the default one)
    pyxis: bool = False
    apptainer: str | None = None  # the binary: apptainer, or singularity
    trtllm_version: str | None = None  # the image's TensorRT-LLM, as the probe job found it (--probe)

    def partition_record(self, name: str | None) -> dict[str, str] | None:
        for record in self.partitions:
            if record.get("PartitionName") == name:
                return record
        return None

    def default_partition(self) -> str | None:
        return next((p["PartitionName"] for p in self.partitions if p.get("Default") == "YES"), None)


def judge_partition(check: str, key: str, named: str | None, whence: str, facts: Facts) -> tuple[Check, str | None]:
    """A job's partition (`named`, else the cluster's default) against `facts.partitions`: it exists and is UP.
    (the check, the partition's name when it exists). `key` is the spec field the fix names; `whence`, where
    the name came from when the job's own field did not give it. The serving job's and the gateway job's."""
    names = [p.get("PartitionName", "?") for p in facts.partitions]
    default = facts.default_partition()
    listing = ", ".join(n + (" (default)" if n == default else "") for n in names) or "none"
    name = named or default
    if name is None:
        return fail(check, "the spec names none and the cluster has no default", f"set {key}: {listing}"), None
    record = facts.partition_record(name)
    if record is None:
        return fail(check, f"{key} {name!r} does not exist", f"set {key} to one of: {listing}"), None
    state = record.get("State", "UNKNOWN")
    which = f"{name}" + (f" ({'the default; ' if not named else ''}{whence})" if whence else "")
    if state != "UP":
        others = ", ".join(p["PartitionName"] for p in facts.partitions if p.get("State") == "UP") or "none"
        return fail(check, f"{which} is {state}", f"use a partition that is UP ({others}), or ask your admins"), name
    return ok(check, f"{which}: UP, {record.get('TotalNodes', '?')} nodes"), name


def judge_time(
    check: str, key: str, wanted_text: str, partition: str | None, facts: Facts, *, renew: bool, whence: str = ""
) -> Check:
    """A job's time limit (`wanted_text`, from spec field `key`, or from elsewhere as `whence` says) against its
    partition's MaxTime. The fix names the field, the UP partitions that allow the time, and (without `renew:`)
    the renewal that outlives any limit. The serving job's and the gateway job's."""
    record = facts.partition_record(partition) or {}
    max_time = record.get("MaxTime", "UNLIMITED")
    limit = slurm_time_seconds(max_time)
    wanted = slurm_time_seconds(wanted_text)
    asked = f"{key} {wanted_text}" + (f" ({whence})" if whence else "")
    if limit is None:
        return ok(check, f"{asked}; {partition} has no limit")
    if wanted is not None and wanted <= limit:
        return ok(check, f"{asked} within {partition}'s MaxTime {max_time}")
    longer = [
        p["PartitionName"]
        for p in facts.partitions
        if p.get("State") == "UP"  # a drained or down partition is no fix
        and (
            (lim := slurm_time_seconds(p.get("MaxTime", "UNLIMITED"))) is None or (wanted is not None and lim >= wanted)
        )
    ]
    fix = f"set {key} to {max_time} or less" + (
        f", or use a partition that allows it: {', '.join(longer)}" if longer else ""
    )
    if not renew:
        fix += "; for a longer service add a renew: section (a successor job takes over)"
    return fail(check, f"{asked} is past {partition}'s MaxTime {max_time}", fix)
