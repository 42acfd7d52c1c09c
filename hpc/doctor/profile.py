"""`hpc-serve doctor --write-profile [PATH]`: a starting site profile from what the doctor found.

Only what was seen to work goes in (the partition that passed, the MPI flavour srun offers, the container
runtime that is installed); what a profile cannot say alone (a container type needs its image) becomes a
comment. Writing and checking is hpc/spec/site.py's `write_profile`, so the file loads as every profile does.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from hpc.doctor.facts import Facts
from hpc.doctor.node import workflows_of
from hpc.doctor.report import Check
from hpc.spec import Spec
from hpc.spec.site import USER_PROFILE, write_profile


def profile_values(spec: Spec, facts: Facts, checks: list[Check]) -> tuple[dict[str, Any], list[str]]:
    """(the profile's values, comment lines) from the doctor's facts and verdicts."""
    passed = {c.name for c in checks if c.status in ("ok", "warn")}
    slurm: dict[str, Any] = {}
    notes: list[str] = []
    if "partition" in passed and facts.partition:
        slurm["partition"] = facts.partition
        gpus = [n.gpus for n in facts.nodes if n.partition == facts.partition and n.usable]
        if gpus and min(gpus) > 0:
            slurm["gpus_per_node"] = min(gpus)
    if spec.slurm.account and "account/qos" in passed:
        slurm["account"] = spec.slurm.account
    if spec.slurm.qos and "account/qos" in passed:
        slurm["qos"] = spec.slurm.qos
    wanted = getattr(spec.slurm, "mpi", "pmix")
    mpi = next((m for m in (wanted, "pmix", "pmi2") if m in facts.mpi), None)
    if mpi:
        slurm["mpi"] = mpi
    values: dict[str, Any] = {"slurm": slurm} if slurm else {}
    c = spec.container
    if c.type != "none" and "container" in passed:
        values["container"] = {"type": c.type, "image": c.image, **({"mounts": c.mounts} if c.mounts else {})}
    else:
        found = [
            name for name, there in (("pyxis", facts.pyxis), ("apptainer", facts.apptainer == "apptainer")) if there
        ]
        if found:
            notes.append(f"container runtimes here: {', '.join(found)} (set container.type and container.image)")
    if facts.trtllm_version:
        notes.append(_workflow_note(facts.trtllm_version, c.image if c.type != "none" else None))
    return values, notes


def _workflow_note(version: str, image: str | None) -> str:
    """What the image's TensorRT-LLM serves, for the specs that use this profile: model.workflow is a spec's
    own (a profile cannot hold `model:`), so the profile says it as a comment."""
    where = f"the image {image}" if image else "the ranks' python"
    served = " or ".join(workflows_of(version))  # every version has one: the engine path until 1.3.0rc20
    return f"{where} has TensorRT-LLM {version}: specs may use model.workflow {served}"


def write_doctor_profile(path: str | None, spec: Spec, facts: Facts, checks: list[Check], source: str) -> Path:
    """Write the profile (default ~/.config/hpc-serve/site.yaml); FileExistsError if it exists, SpecError if a
    value does not check."""
    values, notes = profile_values(spec, facts, checks)
    header = "\n".join(
        [
            f"written by hpc-serve doctor on {socket.gethostname()} at {time.strftime('%Y-%m-%d %H:%M')} "
            f"from {source}" + (f", Slurm {facts.slurm_version}" if facts.slurm_version else ""),
            *notes,
        ]
    )
    return write_profile(Path(path) if path else USER_PROFILE.expanduser(), values, header=header)
