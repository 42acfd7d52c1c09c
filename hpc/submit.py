"""Submit a spec: render it into a fresh deployment folder, then hand exactly that `.sub` to sbatch (or run it
with the local executor). Also `cancel`, the other end of a job's life."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path

from hpc.jobs import JobRef, register
from hpc.model_init import ensure_model
from hpc.render import render
from hpc.spec import Spec


class SubmitError(RuntimeError):
    """sbatch refused the job; the message is sbatch's own."""


def default_executor() -> str:
    """Slurm where there is a Slurm, else this machine."""
    return "slurm" if shutil.which("sbatch") else "local"


def new_deployment_dir(spec: Spec) -> Path:
    """`<workdir>/<name>-<time>`: a new folder per submission, so a job never runs from files that a later
    submission rewrote."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = spec.workdir / f"{spec.name}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def sbatch(sub: Path) -> str:
    """Submit a rendered `.sub` as it is; return the job id."""
    proc = subprocess.run(["sbatch", "--parsable", str(sub)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SubmitError(proc.stderr.strip() or f"sbatch exited with {proc.returncode}")
    return proc.stdout.strip().split(";")[0]


def submit(spec: Spec, executor: str | None = None, deploy_dir: Path | None = None) -> JobRef:
    """Create the model `model.init` asks for (the explicit step render leaves out), render, then submit.
    Nothing is submitted if either fails."""
    executor = executor or default_executor()
    ensure_model(spec)
    rendered = render(spec, deploy_dir or new_deployment_dir(spec))
    if executor == "local":
        from hpc.local import submit_local

        return submit_local(rendered.deploy_dir)
    if executor != "slurm":
        raise ValueError(f"--executor {executor!r}: use slurm or local")
    try:
        job_id = sbatch(rendered.sub)
    except SubmitError:
        if deploy_dir is None:  # a folder made for this submission only: nothing half-done is left behind
            shutil.rmtree(rendered.deploy_dir, ignore_errors=True)
        raise
    job_dir = rendered.deploy_dir / "jobs" / job_id
    (job_dir / "endpoints").mkdir(parents=True, exist_ok=True)
    (job_dir / "ranks").mkdir(exist_ok=True)
    register(job_id, job_dir)
    return JobRef(job_id, job_dir)


def cancel(ref: JobRef, grace_s: float = 30.0) -> None:
    """Ordered stop first, then scancel for whatever is left.

    `scancel --signal=TERM` reaches every process of the job's steps at once (as Slurm's time limit does): each
    leader's tritonserver stops taking requests, drains those in flight (launch.json drain_s) and unloads, which
    releases its followers; followers wait for that release (bounded) instead of leaving first. Once every rank
    has written its exit record (or `grace_s` passed), plain `scancel` ends the job. The marker records that the
    user asked for this: the job reads CANCELLING until no rank process is left, then CANCELLED (not COMPLETED
    or FAILED, however its ranks ended)."""
    from hpc.track import job_status

    stoppable = job_status(ref).state in ("STARTING", "READY", "CANCELLING")  # before the marker changes it
    ref.cancel_marker.write_text(json.dumps({"at": time.time()}))
    if ref.is_local:
        from hpc.local import cancel_local

        cancel_local(ref, grace_s)
        return
    if stoppable:
        subprocess.run(["scancel", "--signal=TERM", ref.job_id], capture_output=True)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            ranks = list(ref.ranks_dir.glob("rank-*.json"))
            if len(ranks) >= ref.world_size or job_status(ref).done:
                break
            time.sleep(0.25)
    subprocess.run(["scancel", ref.job_id], capture_output=True)
