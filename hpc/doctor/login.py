"""The doctor's checks from the login node: what Slurm says about itself, before anything is submitted.

Every command goes through `hpc.scheduler.slurm.default` (timeouts, errors naming the command, retries), never a
subprocess of its own. `Facts` (hpc/doctor/facts.py) keeps what was found, for `--write-profile`
(hpc/doctor/profile.py).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from hpc.doctor.facts import Facts
from hpc.doctor.gateway import gateway_checks
from hpc.doctor.parse import (
    SINFO_NODE_FORMAT,
    NodeInfo,
    config_values,
    gres_gpus,
    mem_mb,
    mpi_types,
    scontrol_records,
    sinfo_nodes,
    slurm_version,
)
from hpc.doctor.preflight import partition_check, time_check
from hpc.doctor.report import Check, fail, ok, skip, warn
from hpc.render.sbatch import test_only_argv
from hpc.scheduler import slurm
from hpc.spec import Spec

#: what hpc-serve runs: sbatch/srun/scontrol/sinfo are required; sacct and squeue feed tracking, which falls back.
REQUIRED = ("sbatch", "srun", "scontrol", "sinfo", "scancel")
TRACKING = ("squeue", "sacct")
NO_SLURM_FIX = (
    "put Slurm's commands on PATH (`module load slurm`, or the folder of sbatch); on a machine without Slurm use "
    "`hpc-serve submit SPEC --executor local`"
)


def _run(argv: list[str]) -> tuple[str, str | None]:
    """(stdout, None) or ("", the error naming the command)."""
    try:
        result = slurm.default.run(argv)
    except slurm.SlurmError as exc:
        return "", str(exc)
    return result.stdout, None


def needs(spec: Spec) -> tuple[int, int, int | None]:
    """(GPUs, CPUs, memory MB or None) one node must have for the spec."""
    s = spec.slurm
    gpus = gres_gpus(s.gres) if s.gres else s.gpus_per_node
    cpus = spec.tasks_per_node * (s.cpus_per_task or 1)
    return gpus, cpus, mem_mb(s.mem) if s.mem else None


def login_checks(spec: Spec) -> tuple[list[Check], Facts]:
    """Every login-side check, in the order a user fixes things: Slurm there, its MPI, the partition and its
    nodes, the time, account and QOS, the container runtime, the workdir, and Slurm's own verdict on the request."""
    facts = Facts()
    checks = [_commands(facts)]
    if checks[0].status == "fail":
        return [*checks, skip("the rest", "needs Slurm's commands")], facts
    config_text, error = _run(["scontrol", "show", "config"])
    if error:
        return [
            *checks,
            fail("controller", error, "check `scontrol ping`; the controller must answer before anything else"),
        ], facts
    facts.config = config_values(config_text)
    checks.append(_accounting(facts))
    checks.append(_mpi(facts, getattr(spec.slurm, "mpi", "pmix")))
    part = _partition(spec, facts)
    checks.append(part)
    if part.status == "fail":
        checks += [skip("nodes", "needs the partition"), skip("time limit", "needs the partition")]
    else:
        checks += [_nodes(spec, facts), _time(spec, facts)]
    checks += gateway_checks(spec, facts, part)
    checks.append(_account_qos(spec, facts))
    checks.append(_container(spec, facts))
    checks.append(_workdir(spec))
    if any(c.status == "fail" for c in checks):
        checks.append(skip("sbatch --test-only", "fix the failures above first"))
    else:
        checks.append(_test_only(spec, facts))
    return checks, facts


def _commands(facts: Facts) -> Check:
    missing = [c for c in REQUIRED if shutil.which(c) is None]
    if missing:
        return fail("slurm commands", f"not on PATH: {', '.join(missing)}", NO_SLURM_FIX)
    text, error = _run(["sinfo", "--version"])
    facts.slurm_version = slurm_version(text) if not error else None
    version = f"Slurm {facts.slurm_version}" if facts.slurm_version else f"version unknown ({error})"
    no_tracking = [c for c in TRACKING if shutil.which(c) is None]
    if no_tracking:
        return warn(
            "slurm commands",
            f"{version}; not on PATH: {', '.join(no_tracking)}",
            "status falls back to scontrol, which forgets a job MinJobAge after it ends; put them on PATH",
        )
    return ok("slurm commands", f"{version}: {', '.join(REQUIRED + TRACKING)}")


def _accounting(facts: Facts) -> Check:
    storage = facts.config.get("AccountingStorageType", "")
    min_age = facts.config.get("MinJobAge", "300 sec")
    fallback = f"hpc-serve tracks jobs with squeue/scontrol, which forget a job {min_age} after it ends"
    if not storage or storage.endswith("/none"):
        return warn("accounting", f"off (AccountingStorageType={storage or 'unset'})", fallback)
    _, error = _run(["sacct", "-n", "-X", "-o", "JobID", "-S", "now"])
    if error:
        return warn("accounting", f"{storage}, but sacct fails: {error}", fallback)
    facts.accounting = True
    return ok("accounting", f"on ({storage}, enforce {facts.config.get('AccountingStorageEnforce', 'none')})")


def _mpi(facts: Facts, flavour: str) -> Check:
    text, error = _run(["srun", "--mpi=list"])
    types, versions = mpi_types(text + "\n" + (error or ""))
    facts.mpi = types + [v for v in versions if v not in types]
    if not facts.mpi:
        return fail("mpi", f"`srun --mpi=list` gave nothing ({error})", "check that srun works: `srun --mpi=list`")
    if flavour in facts.mpi:
        return ok("mpi", f"{flavour} offered (srun --mpi=list: {', '.join(facts.mpi)})")
    choices = [t for t in ("pmix", "pmi2") if t in facts.mpi]
    fix = f"set slurm.mpi to one of: {', '.join(choices)}" if choices else "ask your admins for Slurm's PMIx plugin"
    return fail("mpi", f"slurm.mpi {flavour} not offered (srun --mpi=list: {', '.join(facts.mpi)})", fix)


def _partition(spec: Spec, facts: Facts) -> Check:
    text, error = _run(["scontrol", "-o", "show", "partition"])
    if error:
        return fail("partition", error, "check `scontrol show partition`")
    facts.partitions = scontrol_records(text)
    return partition_check(spec, facts)


def _fitting(spec: Spec, nodes: list[NodeInfo], partition: str) -> list[NodeInfo]:
    gpus, cpus, mem = needs(spec)
    return [
        n
        for n in nodes
        if n.partition == partition
        and n.usable
        and n.gpus >= gpus
        and n.cpus >= cpus
        and (mem is None or n.memory_mb >= mem)
    ]


def _nodes(spec: Spec, facts: Facts) -> Check:
    text, error = _run(["sinfo", "-h", "-N", "-o", SINFO_NODE_FORMAT])
    if error:
        return fail("nodes", error, "check `sinfo -N`")
    facts.nodes = sinfo_nodes(text)
    part = facts.partition or ""
    gpus, cpus, mem = needs(spec)
    want = f"{spec.slurm.nodes} node(s) with {cpus} CPUs, {gpus} GPUs" + (f", {mem} MB" if mem else "")
    mine = [n for n in facts.nodes if n.partition == part]
    fit = _fitting(spec, facts.nodes, part)
    if len(fit) >= spec.slurm.nodes:
        return ok("nodes", f"{want}: {len(fit)} of {len(mine)} in {part} fit")
    usable = [n for n in mine if n.usable]
    most = (
        f"its usable nodes have at most {max(n.cpus for n in usable)} CPUs, {max(n.gpus for n in usable)} GPUs"
        if usable
        else "none of its nodes is usable (down, drained)"
    )
    elsewhere = sorted(
        {n.partition for n in facts.nodes} - {part},
        key=lambda p: -len(_fitting(spec, facts.nodes, p)),
    )
    elsewhere = [p for p in elsewhere if len(_fitting(spec, facts.nodes, p)) >= spec.slurm.nodes]
    fix = "lower slurm.nodes, slurm.gpus_per_node, ntasks_per_node or cpus_per_task to what a node has" + (
        f", or set slurm.partition to {' or '.join(elsewhere)} (where it fits)" if elsewhere else ""
    )
    return fail("nodes", f"{want}: {len(fit)} of {len(mine)} in {part} fit; {most}", fix)


def _time(spec: Spec, facts: Facts) -> Check:
    return time_check(spec, facts)


def _account_qos(spec: Spec, facts: Facts) -> Check:
    s = spec.slurm
    if not s.account and not s.qos:
        return skip("account/qos", "the spec names neither: Slurm uses your default account and QOS")
    asked = ", ".join(f"{k} {v}" for k, v in (("account", s.account), ("qos", s.qos)) if v)
    record = facts.partition_record(facts.partition) or {}
    for key, value, field_name in (("AllowAccounts", s.account, "account"), ("AllowQos", s.qos, "qos")):
        allowed = record.get(key, "ALL")
        if value and allowed != "ALL" and value not in allowed.split(","):
            return fail(
                "account/qos",
                f"{facts.partition} allows {field_name} {allowed}, not {value}",
                f"set slurm.{field_name} to one of: {allowed.replace(',', ', ')}, or use another partition",
            )
    if not facts.accounting:
        return warn("account/qos", f"{asked}: not checked (accounting off)", "sbatch --test-only below still tries it")
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid())
    text, error = _run(["sacctmgr", "-n", "-P", "show", "assoc", f"where user={user}", "format=Account,Partition,QOS"])
    if error:
        return warn("account/qos", f"{asked}: sacctmgr fails: {error}", "ask your admins which account to use")
    rows = [line.split("|") for line in text.splitlines() if line.count("|") == 2]
    rows = [r for r in rows if r[1] in ("", facts.partition)]
    accounts = sorted({r[0] for r in rows})
    enforced = facts.config.get("AccountingStorageEnforce", "none")
    strict = "associations" in enforced or "qos" in enforced
    problem = ""
    if s.account and s.account not in accounts:
        problem = f"user {user} has no association with account {s.account} (yours: {', '.join(accounts) or 'none'})"
        fix = f"set slurm.account to one of: {', '.join(accounts)}" if accounts else "ask your admins for an account"
    elif s.qos:
        qos = sorted({q for r in rows if not s.account or r[0] == s.account for q in r[2].split(",") if q})
        if s.qos not in qos:
            problem = f"qos {s.qos} is not among your association's: {', '.join(qos) or 'none'}"
            fix = f"set slurm.qos to one of: {', '.join(qos)}" if qos else "drop slurm.qos"
    if not problem:
        return ok("account/qos", f"{asked}: accepted by your associations")
    if not strict:
        return warn("account/qos", f"{problem}; not enforced here (AccountingStorageEnforce={enforced})", fix)
    return fail("account/qos", problem, fix)


def _container(spec: Spec, facts: Facts) -> Check:
    text, _ = _run(["srun", "--help"])
    facts.pyxis = "--container-image" in text
    facts.apptainer = next((b for b in ("apptainer", "singularity") if shutil.which(b)), None)
    c = spec.container
    if c.type == "none":
        found = ", ".join(x for x in ("pyxis" if facts.pyxis else "", facts.apptainer or "") if x) or "none"
        return ok("container", f"none: ranks run on the node (runtimes here: {found})")
    if c.type == "pyxis":
        if not facts.pyxis:
            alt = f"container.type apptainer ({facts.apptainer} is here)" if facts.apptainer else "container.type none"
            return fail(
                "container",
                "pyxis is not installed: `srun --help` has no --container-image",
                f"use {alt} with a tritonserver the nodes can run, or ask your admins for pyxis/enroot",
            )
        detail = f"pyxis: srun --container-image (image {c.image})"
    else:
        if facts.apptainer != "apptainer":
            alt = "container.type pyxis" if facts.pyxis else "container.type none"
            what = "only singularity is on PATH" if facts.apptainer else "no apptainer (or singularity) on PATH"
            return fail(
                "container",
                f"apptainer: {what}; the job runs `apptainer exec`",
                f"`module load apptainer` in slurm.modules (and here), or use {alt}",
            )
        detail = f"apptainer: {shutil.which('apptainer')} (image {c.image})"
    image = str(c.image or "")
    local = image.startswith(("/", ".", "~")) or image.endswith((".sif", ".sqsh", ".squashfs"))
    if local and not Path(image).expanduser().exists():
        return fail("container", f"{detail}: the image file does not exist", "set container.image to an existing file")
    return ok("container", detail)


def _workdir(spec: Spec) -> Check:
    workdir = Path(spec.workdir).expanduser()
    existing = next((p for p in (workdir, *workdir.parents) if p.exists()), None)
    if existing is None or not os.access(existing, os.W_OK):
        return fail(
            "workdir",
            f"{workdir}: {existing} is not writable",
            "set workdir to a folder on a shared filesystem you can write (e.g. $SCRATCH/hpc-serve)",
        )
    made = "" if existing == workdir else f" (created on first submit under {existing})"
    return ok("workdir", f"{workdir} writable here{made}; --probe checks the nodes see it")


def _test_only(spec: Spec, facts: Facts) -> Check:
    """`sbatch --test-only` with the options of the serving job's own #SBATCH lines (hpc/render/sbatch.py): what
    it approves is what submit asks for."""
    try:
        result = slurm.default.run(test_only_argv(spec), repeatable=False)
    except slurm.SlurmError as exc:
        return fail("sbatch --test-only", exc.stderr or str(exc), "change the slurm: field Slurm's message names")
    said = (result.stderr or result.stdout).strip().splitlines()
    # "sbatch: Job 12 to start at …": nothing was queued, the number is only the one the next job would get
    return ok(
        "sbatch --test-only", re.sub(r"^(sbatch: )?Job \d+ to ", "accepted: would ", said[-1]) if said else "accepted"
    )
