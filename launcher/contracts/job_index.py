"""The job index: `~/.hpc-serve/jobs/<job_id>@<cluster>` → `D/jobs/<job_id>`, how a job is found from its id.

Why the cluster is in each entry's name: many sites run several Slurm clusters that share $HOME, and a job id is
unique only within its cluster (job 33 of one and job 33 of the other are two jobs; docs/decisions.md "The job
index keys jobs by cluster" says what an index keyed by the id alone showed). So a Slurm job's entry names its
cluster (Slurm's ClusterName), its job folder records it (`layout.CLUSTER_NAME`), and readers ask the job's own
cluster (hpc/jobs/executors.py). Entries without a cluster: local jobs (`local-<hex>`, this machine's), and Slurm
jobs indexed before clusters were recorded, which are taken to be the current cluster's.

Standard library only: the renewer (launcher/jobscript/renew.py) indexes the successor it submits from inside the job, and
the `.sub`s run the shell form (`INDEX_JOB_SHELL`) at job start, so a hand-run sbatch is indexed too.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from pathlib import Path

from launcher.contracts.layout import CLUSTER_NAME, JOBS_NAME, JobPaths

#: The index's folder: `$HPC_SERVE_HOME/jobs`, default `~/.hpc-serve/jobs`.
HOME_ENV = "HPC_SERVE_HOME"
DEFAULT_HOME = "~/.hpc-serve"
#: the same rule in the shell, for the `.sub`s (a hand-run sbatch indexes its job too)
INDEX_DIR_SHELL = f"${{{HOME_ENV}:-$HOME/{DEFAULT_HOME[2:]}}}/{JOBS_NAME}"
#: between a job id and its cluster in an entry's name (Slurm cluster names are letters, digits, `-` and `_`)
CLUSTER_SEP = "@"
#: set by Slurm in a job's environment (batch script and steps): the cluster the job runs on
CLUSTER_ENV = "SLURM_CLUSTER_NAME"

#: What every `.sub` runs at job start, with $JOB_DIR (`D/jobs/<job_id>`) set: record the job's cluster in its
#: folder (atomically: a reader must never take an empty file for "no cluster") and point the index entry at it.
#: Outside Slurm (the local executor runs gateway.sub and build.sub with $HPC_SERVE_JOB_ID) there is no cluster.
#: Its shell variables are `HPC_SERVE_`'s: the .sub runs in the user's environment, where a site may export
#: CLUSTER, INDEX or JOB_ID for its own tools (and the steps inherit what the script sets). An entry without the
#: cluster that points at this job's folder (`submit` made it while Slurm could not say its cluster) is removed
#: once the entry with it is made: one job, one entry (`link_index` does the same).
INDEX_JOB_SHELL = f"""\
HPC_SERVE_CLUSTER="${{SLURM_JOB_ID:+${{{CLUSTER_ENV}:-}}}}"
if [ -n "$HPC_SERVE_CLUSTER" ] && [ "$(cat "$JOB_DIR/{CLUSTER_NAME}" 2>/dev/null)" != "$HPC_SERVE_CLUSTER" ]; then
  {{ printf '%s\\n' "$HPC_SERVE_CLUSTER" >"$JOB_DIR/.{CLUSTER_NAME}.$$" && mv -f "$JOB_DIR/.{CLUSTER_NAME}.$$" "$JOB_DIR/{CLUSTER_NAME}"; }} || true
fi
HPC_SERVE_INDEX="{INDEX_DIR_SHELL}"
if mkdir -p "$HPC_SERVE_INDEX"; then
  ln -sfn "$JOB_DIR" "$HPC_SERVE_INDEX/${{JOB_DIR##*/}}${{HPC_SERVE_CLUSTER:+{CLUSTER_SEP}$HPC_SERVE_CLUSTER}}" || true
  if [ -n "$HPC_SERVE_CLUSTER" ] && [ "$HPC_SERVE_INDEX/${{JOB_DIR##*/}}" -ef "$JOB_DIR" ]; then
    rm -f "$HPC_SERVE_INDEX/${{JOB_DIR##*/}}" || true
  fi
fi"""


def index_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where job ids map to job folders (the `.sub` computes the same folder from INDEX_DIR_SHELL)."""
    env = os.environ if env is None else env
    return Path(env.get(HOME_ENV) or DEFAULT_HOME).expanduser() / JOBS_NAME


def entry_name(job_id: str, cluster: str | None) -> str:
    """`<job_id>@<cluster>`, or `<job_id>` for a job of no cluster (local, or indexed before clusters were)."""
    return f"{job_id}{CLUSTER_SEP}{cluster}" if cluster else job_id


def parse_entry(name: str) -> tuple[str, str | None]:
    """(job id, cluster or None) of an entry's name: `33@twin` → ("33", "twin"), `33` → ("33", None)."""
    job_id, sep, cluster = name.partition(CLUSTER_SEP)
    return (job_id, cluster or None) if sep else (name, None)


def job_cluster(env: Mapping[str, str] | None = None) -> str | None:
    """Inside a Slurm job (the renewer, `hpc-serve launch` under srun): the cluster it runs on, else None."""
    env = os.environ if env is None else env
    return (env.get(CLUSTER_ENV) or None) if env.get("SLURM_JOB_ID") else None


def link_index(job_id: str, job_dir: Path, cluster: str | None = None) -> Path:
    """Record the job's cluster in its folder and point its index entry there (atomic: a temporary link renamed
    over the old one). `submit` and a renewer (for the successor it submitted) call it; the `.sub` does the same
    with INDEX_JOB_SHELL at job start."""
    if cluster:
        JobPaths.of_folder(job_dir).record_cluster(cluster)
    index = index_dir()
    index.mkdir(parents=True, exist_ok=True)
    name = entry_name(job_id, cluster)
    tmp = index / f".{name}.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(job_dir)
    os.replace(tmp, index / name)
    if cluster:  # the entry `submit` made while Slurm could not say the job's cluster: the same job
        plain = index / job_id
        try:
            if plain.is_symlink() and plain.samefile(job_dir):
                plain.unlink()
        except OSError:
            pass  # its folder is gone (nothing lists it), or another process removed it first
    return index / name


def entries(text: str) -> dict[str | None, Path]:
    """The index entries a job id names, by cluster (None: an entry without one): `33` → every `33@<cluster>`
    and a plain `33` (unless it is one of those: `_one_per_job`); `33@twin` → that entry only. Only live links
    (their folder exists) count."""
    index = index_dir()
    if os.sep in text or not text or text.startswith(".") or not index.is_dir():
        return {}
    job_id, cluster = parse_entry(text)
    if cluster is not None:
        names = [text]
    else:
        # the id is the user's text: `status '*'` must name no job, let alone every one
        names = [job_id] + [p.name for p in index.glob(f"{glob.escape(job_id)}{CLUSTER_SEP}*")]
    links = _one_per_job([index / name for name in names if (index / name).exists()])
    return {parse_entry(link.name)[1]: link for link in links}


def all_entries() -> list[Path]:
    """Every live index entry (a `link_index` in progress, `.…`, is none), newest first: by when the entry was
    made (at submit, again when a Slurm job starts), not by the job folder's mtime, which every local.json
    update, log or `cancel` of an old job moves forward."""
    index = index_dir()
    if not index.is_dir():
        return []
    links = [p for p in index.iterdir() if not p.name.startswith(".") and p.exists()]
    links.sort(key=lambda p: p.lstat().st_mtime, reverse=True)
    return _one_per_job(links)


def _one_per_job(links: list[Path]) -> list[Path]:
    """`links` without an entry that has no cluster when an entry with one points at the same job folder: the same
    job, indexed by `submit` while Slurm could not say its cluster, and by the `.sub` with it (an older `.sub`
    left the first). Entries of two clusters at one folder stay two (one folder submitted on both)."""
    clustered = {link.resolve() for link in links if parse_entry(link.name)[1] is not None}
    return [link for link in links if parse_entry(link.name)[1] is not None or link.resolve() not in clustered]


def entry_name_of(job: JobPaths) -> str:
    """The entry name of a job folder, by the cluster the folder records: what tells the job from another of its
    id (the gateway keys its replicas, their draining and their tokens by it)."""
    return entry_name(job.job_id, job.cluster)


def entry_of(job: JobPaths) -> Path:
    """The index entry of a job folder, by the cluster the folder records."""
    return index_dir() / entry_name_of(job)


def template_values() -> dict[str, str]:
    """What the `.sub` templates write to index their job: hpc/render/jobfiles.py and hpc/jobs/build_script.py pass it
    beside layout.template_values (this module imports layout, never the other way)."""
    return {"index_job_shell": INDEX_JOB_SHELL}
