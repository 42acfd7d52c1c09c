"""What Slurm would queue and never start, said before `sbatch`: each job's time limit within its partition's
MaxTime (and, as notes, a partition the cluster lacks or has down), the serving job's and the gateway job's, by
the doctor's own judgments (hpc/doctor/facts.py, hpc/doctor/gateway.py) over one `scontrol show partition`.

Why here and not in `sbatch`'s answer: Slurm takes a job past its partition's MaxTime (unless the site enforces
partition limits) and leaves it PENDING with the reason PartitionTimeLimit for good, so `submit` would say
"queued" and `submit --wait` wait forever. `validate` and `submit` ask this; where Slurm's commands do not answer
(a workstation, the local executor) there is nothing to ask, and the spec alone is checked.
"""

from __future__ import annotations

import shutil

from hpc.doctor.facts import Facts, judge_partition, judge_time
from hpc.doctor.gateway import PARTITION, TIME, gateway_checks
from hpc.doctor.parse import scontrol_records
from hpc.doctor.report import Check
from hpc.scheduler import slurm
from hpc.spec import Problem, Spec, SpecError
from hpc.spec.document import provenance

#: each check's spec field (the judgments name it in their fix; a problem is located at it)
FIELDS = {
    "partition": "slurm.partition",
    "time limit": "slurm.time",
    PARTITION: "gateway.partition",
    TIME: "gateway.time",
}
#: a partition the cluster lacks (sbatch refuses it itself) or has down: a note, not a refusal
PARTITION_FIELDS = ("slurm.partition", "gateway.partition")


def partition_check(spec: Spec, facts: Facts) -> Check:
    """The serving job's partition; sets `facts.partition` (the doctor's check too)."""
    named = spec.slurm.partition
    check, facts.partition = judge_partition(
        "partition", FIELDS["partition"], named, "" if named else "the spec names none", facts
    )
    return check


def time_check(spec: Spec, facts: Facts) -> Check:
    """The serving job's time limit against its partition's MaxTime (the doctor's check too)."""
    return judge_time(
        "time limit", FIELDS["time limit"], spec.slurm.time, facts.partition, facts, renew=spec.renew is not None
    )


def refusals(spec: Spec) -> tuple[list[Problem], list[str]]:
    """(problems, notes). Problems: the spec's jobs' time limits past their partitions' MaxTime, which Slurm queues
    and never starts, at their fields. Notes: a partition this cluster lacks or has down (sbatch refuses the
    first itself, and a spec may be checked here for another cluster; the second may come back UP). Nothing
    where Slurm's commands do not answer."""
    if shutil.which("scontrol") is None:
        return [], []
    try:
        text = slurm.default.run(["scontrol", "-o", "show", "partition"]).stdout
    except slurm.SlurmError:
        return [], []  # the controller does not answer: sbatch says so itself
    facts = Facts(partitions=scontrol_records(text))
    part = partition_check(spec, facts)
    checks = [part] if part.status == "fail" else [part, time_check(spec, facts)]
    checks += gateway_checks(spec, facts, part)
    origin = provenance(spec)
    problems, notes = [], []
    for c in (c for c in checks if c.status == "fail"):
        field = FIELDS[c.name]
        if field in PARTITION_FIELDS:
            notes.append(f"note: on this cluster, {c.detail} ({c.fix})")
            continue
        message = f"{c.detail}: Slurm would queue the job and never start it; {c.fix}"
        problems.append(origin.problem(field, message) if origin else Problem("<spec>", 1, field, message))
    return problems, notes


def check_before_submit(spec: Spec, executor: str | None) -> None:
    """SpecError naming what Slurm would never start, before anything is written or submitted (a job the local
    executor runs has no partition)."""
    from hpc.jobs.executors import executor_named

    if executor_named(executor).queues:
        problems, _ = refusals(spec)  # a partition the cluster lacks: sbatch's own refusal says it
        if problems:
            raise SpecError(problems)
