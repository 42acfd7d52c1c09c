"""Finding a job's folder from its id alone, from any shell on the cluster.

A job lives in `D/jobs/<job_id>/` (DEVELOPERS.md "The deployment folder"). The index
`~/.hpc-serve/jobs/<job_id>@<cluster>` (or `$HPC_SERVE_HOME/jobs`; launcher/contracts/job_index.py) is a symlink to it,
made by `submit` at once and by the `.sub` when the job starts, so a job submitted by hand with `sbatch` is found as
soon as it runs. While such a job is still pending, `scontrol show job` tells where its script is (`Command=`); after it
ended, `sacct` keeps the submit line.

Job ids are unique per Slurm cluster only, and clusters may share $HOME: an id the index holds for several
clusters means the current cluster's job (SLURM_CONF's), or is refused as ambiguous; `ID@CLUSTER` names one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hpc.scheduler import slurm
from launcher.contracts.job_index import all_entries, entries, entry_name, index_dir, link_index, parse_entry
from launcher.contracts.layout import LAUNCH_NAME, SUB_NAME, JobPaths
from launcher.contracts.plan import LaunchPlan


class JobNotFound(LookupError):
    """No folder is known for this job id."""


@dataclass(frozen=True)
class JobRef:
    """A job and the folders it uses."""

    job_id: str
    job_dir: Path
    #: the cluster its index entry names (None: not found through the index, or an entry without one)
    indexed_cluster: str | None = None

    @property
    def cluster(self) -> str | None:
        """The Slurm cluster the job belongs to: its index entry's, else its folder's record (`layout.CLUSTER_NAME`).
        None: a local job, or a Slurm job indexed before clusters were recorded (the current cluster's)."""
        return self.indexed_cluster or self.paths.cluster

    @property
    def paths(self) -> JobPaths:
        """Every name and path in the job folder (launcher/contracts/layout.py, shared with the launcher)."""
        return JobPaths.of_folder(self.job_dir)

    @property
    def deploy_dir(self) -> Path:
        return self.paths.deploy_dir

    @property
    def endpoints_dir(self) -> Path:
        return self.paths.endpoints_dir

    @property
    def ranks_dir(self) -> Path:
        return self.paths.ranks_dir

    @property
    def cancel_marker(self) -> Path:
        return self.paths.cancel_marker

    def launch_plan(self) -> LaunchPlan:
        """The deployment's launch plan (launcher/contracts/plan.py); PlanError names the file and key when it is unusable."""
        return LaunchPlan.read(self.paths.deployment.launch)

    @property
    def world_size(self) -> int:
        return self.launch_plan().world_size

    def rank_log(self, rank: int, stream: str = "out") -> Path:
        """Per-rank log, in submitit's naming (launcher/contracts/layout.py rank_log_name)."""
        return self.paths.rank_log(rank, stream)


def register(job_id: str, job_dir: Path, cluster: str | None = None) -> None:
    """Record the job's cluster in its folder and point the index at it (atomic: a temporary link renamed over
    the old one). `cluster` None: a local job."""
    link_index(job_id, job_dir, cluster)


def _from_scontrol(job_id: str) -> Path | None:
    try:
        command = slurm.default.scontrol_jobs([job_id]).get(job_id, {}).get("Command")
    except slurm.SlurmError:
        return None  # not installed, or the controller is away: the next finder may still know
    return Path(command).parent if command else None


def _from_sacct(job_id: str) -> Path | None:
    try:
        rows = slurm.default.sacct([job_id], ["WorkDir", "SubmitLine"])
    except slurm.SlurmError:
        return None
    for row in rows:
        workdir, submit_line = row.get("WorkDir", ""), row.get("SubmitLine", "")
        # The submit line is as typed: `cd D && sbatch tensorrt_llm_triton.sub` leaves no folder in it at all,
        # and a relative one is relative to the job's WorkDir, not to this shell's cwd.
        match = re.search(rf"(?:^|\s)((?:\S*/)?){re.escape(SUB_NAME)}(?:\s|$)", submit_line)
        if match:
            return Path(workdir) / match.group(1) if workdir else Path(match.group(1) or ".")
    return None


def find_job(job: str) -> JobRef:
    """A job id (`123`, `123@cluster`, `local-…`) or a job folder path → JobRef. Raises JobNotFound saying what was
    tried."""
    as_path = Path(job).expanduser()
    if as_path.is_dir() and JobPaths.is_job_folder(as_path):
        return JobRef(as_path.name, as_path.resolve())
    # Only a plain id is looked up in the index (job_index.entries): `index_dir() / "/abs/path"` is "/abs/path"
    # itself, which would make a deployment folder passed by mistake "found" as a job whose id is that path.
    found = entries(job)
    if found:
        cluster, link = _pick(job, found)
        return JobRef(parse_entry(job)[0], link.resolve(), cluster)
    if parse_entry(job)[1] is None:
        for finder in (_from_scontrol, _from_sacct):
            deploy = finder(job)
            if deploy is not None and (deploy / LAUNCH_NAME).exists():
                return JobRef(job, JobPaths(deploy, job).folder)
    raise JobNotFound(
        f"job {job}: not in {index_dir()}, and neither scontrol nor sacct names a hpc-serve script for it; "
        "pass the job folder (DEPLOY_DIR/jobs/JOB) instead"
    )


def _pick(job: str, found: dict[str | None, Path]) -> tuple[str | None, Path]:
    """The one of a job id's index entries that `job` means: the only one; else the current cluster's (an entry
    without a cluster counts as the current cluster's); else JobNotFound naming each, to type instead."""
    if len(found) == 1:
        return next(iter(found.items()))
    current = slurm.default.cluster_name()
    for cluster in (current, None):
        if cluster in found:
            return cluster, found[cluster]
    names = ", ".join(sorted(entry_name(parse_entry(job)[0], c) for c in found))
    raise JobNotFound(f"job {job}: the index holds jobs of that id on several clusters ({names}); name one of them")


def list_jobs() -> list[JobRef]:
    """Every indexed job whose folder still exists, newest first (job_index.all_entries), each with the cluster
    its entry names."""
    return [_ref(link) for link in all_entries()]


def _ref(link: Path) -> JobRef:
    job_id, cluster = parse_entry(link.name)
    return JobRef(job_id, link.resolve(), cluster)
