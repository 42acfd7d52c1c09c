"""The doctor's checks of the gateway job (a spec's `gateway:` section, hpc/spec/gateway.py): its partition and
time limit, beside the serving job's.

Why apart from the serving job's: the gateway is a Slurm job of its own (`D/gateway.sub`, submitted before the
serving job) with its own `gateway.partition` and `gateway.time` (often a service partition and a long time,
since it outlives the serving jobs), so a spec whose serving job fits can still have a gateway job Slurm refuses
or never starts. Its values default to the serving job's (hpc/render/jobfiles.py `gateway_context`): the checks say which
one applied, and each fix names the `gateway.` field that overrides it.
"""

from __future__ import annotations

from hpc.doctor.facts import Facts, judge_partition, judge_time
from hpc.doctor.report import Check, skip, warn
from hpc.spec import Spec
from hpc.spec.checks import slurm_time_seconds

PARTITION, TIME = "gateway partition", "gateway time limit"


def gateway_checks(spec: Spec, facts: Facts, serving_partition: Check) -> list[Check]:
    """The gateway job's partition and time limit (none for a spec without an enabled `gateway:`).
    `serving_partition`: the serving job's partition check, which a gateway on the same partition shares."""
    g, s = spec.gateway, spec.slurm
    if g is None or not g.enabled:
        return []
    if not facts.partitions:  # `scontrol show partition` failed: the serving job's check says so
        return [skip(PARTITION, "needs `scontrol show partition`"), skip(TIME, "needs the partition")]
    named = g.partition or s.partition
    default = facts.default_partition()
    if (named or default) == (s.partition or default) and serving_partition.status == "fail":
        why = "the serving job's partition, which failed above (gateway.partition can name another)"
        return [skip(PARTITION, why), skip(TIME, "needs the partition")]
    whence = "" if g.partition else ("slurm.partition's" if s.partition else "the spec names none")
    part, name = judge_partition(PARTITION, "gateway.partition", named, whence, facts)
    if part.status == "fail":
        return [part, skip(TIME, "needs the partition")]
    time = g.time or s.time
    check = judge_time(
        TIME, "gateway.time", time, name, facts, renew=spec.renew is not None, whence="" if g.time else "slurm.time's"
    )
    return [part, _outlives(check, spec) if check.status == "ok" else check]


def _outlives(check: Check, spec: Spec) -> Check:
    """A gateway job that ends before the serving job it fronts leaves clients without the deployment's address
    while it still serves (without renew:, nothing starts another until the next `submit`)."""
    g, s = spec.gateway, spec.slurm
    assert g is not None
    mine, theirs = slurm_time_seconds(g.time or s.time), slurm_time_seconds(s.time)
    if spec.renew is not None or mine is None or theirs is None or mine >= theirs:
        return check
    return warn(
        TIME,
        f"{check.detail}, but it ends before the serving job's slurm.time {s.time}: clients lose the gateway's "
        "address while the job still serves",
        f"set gateway.time to {s.time} or more (or leave it out: it defaults to slurm.time), or add a renew: section",
    )
