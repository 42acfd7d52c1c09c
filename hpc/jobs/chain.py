"""A deployment's renewal chains (spec `renew:`): what `status` shows of them, and `cancel` of a whole deployment.

The chain is written by the jobs themselves (launcher/jobscript/renew.py: each job's `chain.json` names its predecessor
and, once submitted, its successor); nothing here takes part in a renewal, so a job submitted by hand with
`sbatch` renews exactly as one `hpc-serve submit` started. This module only reads the records, asks the
scheduler (through the shared watcher) what became of each job, and, for `cancel`, writes the one marker every
renewer checks before it submits (`D/renew_stopped`) and then cancels every job still under way, pending
successors first, so that none starts while the others stop.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc.jobs.executors import watch
from hpc.jobs.gateway import gateway_jobs_to_stop, serving_jobs
from hpc.jobs.status import JobStatus
from hpc.jobs.track import cancel, job_status
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import SlurmError
from hpc.serving.deployment import Target, deployment_folders
from launcher.contracts.config import CANCEL_GRACE_S
from launcher.contracts.job_index import entry_of
from launcher.contracts.job_states import JobState
from launcher.contracts.layout import Deployment
from launcher.contracts.records import ChainRecord, RenewStop, read_chain

#: how many rounds `cancel_deployment` makes: a renewer that submitted just before the marker was written has
#: indexed its successor by the next round (it checks the marker again after its sbatch, launcher/jobscript/renew.py)
CANCEL_ROUNDS = 3
#: chain jobs `status` lists, newest last (a chain of 1-hour jobs has 168 after a week)
SHOWN = 8


@dataclass
class ChainLink:
    """One job of a chain as `status` shows it: its state and times, and what became of its successor."""

    job_id: str
    state: str
    index: int = 1
    predecessor: str = ""
    successor: str = ""
    successor_state: str = ""
    successor_reason: str = ""
    started_at: float = 0.0
    ends_at: float = 0.0
    stopped_at: float = 0.0
    note: str = ""

    @property
    def next(self) -> str:
        """The successor column: its id and state (why it waits, when pending), or why there is none."""
        if self.successor:
            text = f"{self.successor} {self.successor_state}".rstrip()
            if self.successor_state == JobState.PENDING:
                text = f"successor {self.successor} pending: {self.successor_reason or 'no reason given'}"
                if self.state in (JobState.STARTING, JobState.READY):
                    text += f"; {self.job_id} serves until its end"
            return text
        return self.note or "-"

    def row(self) -> str:
        return (
            f"  {self.job_id:<10} {self.state:<11} {_clock(self.started_at):<19} {_clock(self.ends_at):<19} {self.next}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else "-"


def chain_links(target: Target, statuses: dict[str, JobStatus] | None = None) -> list[ChainLink]:
    """Every job of the deployment's chains, oldest first (none when it does not renew): the jobs with a chain
    record, and the successors they name that have none yet (still pending). `statuses`: states already known."""
    refs = serving_jobs(target)
    records = {ref.job_id: read_chain(ref.paths) for ref in refs}
    named = {r.successor for r in records.values() if r is not None and r.successor}
    chained = [ref for ref in refs if records[ref.job_id] is not None or ref.job_id in named]
    if not chained:
        return []
    known = dict(statuses or {})
    missing = [ref for ref in chained if ref.job_id not in known]
    watch(missing)  # one sacct for all of them
    known.update({ref.job_id: job_status(ref) for ref in missing})
    links = []
    for ref in chained:
        record = records[ref.job_id] or ChainRecord(job_id=ref.job_id)
        status = known[ref.job_id]
        links.append(
            ChainLink(
                job_id=ref.job_id,
                state=status.state,
                index=record.index,
                predecessor=record.predecessor,
                successor=record.successor,
                started_at=record.started_at,
                ends_at=record.ends_at,
                stopped_at=record.stopped_at,
                note=record.note,
            )
        )
    by_id = {link.job_id: link for link in links}
    for link in links:
        if link.successor in by_id:
            link.successor_state = by_id[link.successor].state
            link.successor_reason = known[link.successor].reason or ""
        if link.job_id in named and not link.predecessor:  # pending: its own record is not written yet
            link.predecessor = next(p.job_id for p in links if p.successor == link.job_id)
    return sorted(links, key=lambda link: (link.started_at or float("inf"), link.job_id))


def chain_lines(links: list[ChainLink]) -> list[str]:
    """The chain as `status` prints it (the newest `SHOWN` jobs)."""
    if not links:
        return []
    count = f"{len(links)} job" + ("s" if len(links) != 1 else "")
    lines = [f"chain ({count})" + (f", the last {SHOWN}:" if len(links) > SHOWN else ":")]
    lines.append(f"  {'job':<10} {'state':<11} {'started':<19} {'ends':<19} successor")
    lines += [link.row() for link in links[-SHOWN:]]
    return lines


def stop_renewals(target: Target) -> None:
    """The marker no renewer of a job older than it submits after (every folder of the deployment)."""
    for folder in deployment_folders(target):
        RenewStop(at=time.time()).write(Deployment(folder).renew_stop)


@dataclass
class DeploymentCancel:
    """What `cancel_deployment` came to: the last status of each job it cancelled, and a line for each job it could
    not cancel (which job, of which cluster, and why), whose failure stopped none of the others."""

    statuses: list[JobStatus]
    not_cancelled: list[str]


def cancel_deployment(target: Target, grace_s: float = CANCEL_GRACE_S) -> DeploymentCancel:
    """Stop the whole deployment: no renewer submits anything more, and every serving job still under way is
    cancelled (pending ones first, so that none starts meanwhile; then the others, each an ordered stop). Its
    gateway job goes with the last one (hpc/jobs/track.py `after_cancel`), or after them when none was left.
    A job that cannot be cancelled (of a cluster that cannot be asked from here, or one whose scancel Slurm
    refused) is left and named; the others are cancelled all the same. Jobs are told apart by their folder: job
    ids are unique per Slurm cluster only, and a deployment's folders may hold the jobs of two clusters."""
    stop_renewals(target)
    done: dict[Path, JobStatus] = {}
    refused: dict[Path, str] = {}
    for _ in range(CANCEL_ROUNDS):
        refs = [ref for ref in serving_jobs(target) if ref.job_dir not in done and ref.job_dir not in refused]
        watch(refs)
        statuses = {ref.job_dir: job_status(ref) for ref in refs}
        live = [ref for ref in refs if not statuses[ref.job_dir].done]
        if not live:
            break
        live.sort(key=lambda ref: statuses[ref.job_dir].state != JobState.PENDING)
        for ref in live:
            status = statuses[ref.job_dir]
            if status.unreachable:  # nothing can be sent to it from here (hpc.jobs.track.cancel would refuse)
                refused[ref.job_dir] = _not_cancelled(ref, status.reason or "its cluster cannot be asked from here")
                continue
            try:
                done[ref.job_dir] = cancel(ref, grace_s)
            except SlurmError as exc:  # scancel refused (not the owner …), or its cluster went away meanwhile
                refused[ref.job_dir] = _not_cancelled(ref, str(exc))
    _cancel_gateways(target, grace_s, done, refused)
    return DeploymentCancel(list(done.values()), list(refused.values()))


def _cancel_gateways(target: Target, grace_s: float, done: dict[Path, JobStatus], refused: dict[Path, str]) -> None:
    """The gateway jobs still under way once the serving jobs are stopped: those of a deployment whose serving jobs
    had all ended before (FAILED, TIMEOUT), which no serving job's cancel took along (track.py `after_cancel`)."""
    for ref in gateway_jobs_to_stop(target):
        try:
            done[ref.job_dir] = cancel(ref, grace_s)
        except SlurmError as exc:
            refused[ref.job_dir] = _not_cancelled(ref, str(exc))


def _not_cancelled(ref: JobRef, why: str) -> str:
    """`job 33 of cluster 'twin' not cancelled: <why>`: what `cancel` of the deployment prints of such a job."""
    where = f" of cluster '{ref.cluster}'" if ref.cluster else ""
    return f"job {ref.job_id}{where} not cancelled: {why}"


def successor_under_way(ref: JobRef) -> str | None:
    """The successor a job's renewer submitted, when that one is still under way (cancel of the job leaves it)."""
    record = read_chain(ref.paths)
    if record is None or not record.successor:
        return None
    successor = JobRef(record.successor, ref.paths.deployment.job(record.successor).folder)
    status = job_status(successor)
    return None if status.done else f"{record.successor} ({status.state})"


def job_chain_line(ref: JobRef) -> str | None:
    """One job's place in its chain, for `status JOB`: its predecessor, and its successor or why it has none."""
    record = read_chain(ref.paths)
    if record is None:
        return None
    parts = [f"renewal: job {record.index} of its chain"]
    if record.predecessor:
        parts.append(f"predecessor {record.predecessor}")
    if record.ends_at:
        parts.append(f"ends {_clock(record.ends_at)}")
    if record.successor:
        successor = job_status(JobRef(record.successor, ref.paths.deployment.job(record.successor).folder))
        link = ChainLink(ref.job_id, job_status(ref).state, successor=record.successor)
        link.successor_state, link.successor_reason = successor.state, successor.reason or ""
        parts.append(link.next if successor.state == JobState.PENDING else f"successor {link.next}")
    elif record.note:
        parts.append(record.note)
    elif record.renew_at:
        parts.append(f"successor at {_clock(record.renew_at)}")
    return "; ".join(parts)


def _indexed_at(ref: JobRef) -> float:
    """When the job's index entry was made: at submit, and again when it started (the .sub links it)."""
    try:
        return entry_of(ref.paths).lstat().st_mtime
    except OSError:
        return 0.0


def current_job(target: Target) -> JobRef | None:
    """The deployment's job that started last (a renewal chain's current one), else its newest; None: no job."""
    jobs = serving_jobs(target)
    watch(jobs)
    started = [ref for ref in jobs if job_status(ref).state not in (JobState.PENDING, JobState.UNKNOWN)]
    return max(started or jobs, key=_indexed_at, default=None)
