"""Starting a build job and reading its state: `hpc-serve build`, and `submit` of a spec with a `build:` section.

`submit` serves the built engine: it renders the deployment for the engine folder the build will make (or the
cached one), submits the build job first and the serving job after it with `--dependency=afterok:<build>` and
`--kill-on-invalid-dep=yes` (a failed build cancels the serving job instead of leaving it pending forever). An
engine already built for the same request and inputs is served at once: no build job. A build of the same
request that is still pending or running (another submission's) is waited on, not started twice.

A build job's state (`hpc-serve status`; the machine is hpc/jobs/kinds.py's, `BuildJob`): PENDING (Slurm's reason)
→ BUILDING (the step) → COMPLETED (the engine folder) | FAILED (the step, its command, its exit status and the last
lines of its output) | CANCELLED | TIMEOUT; CANCELLING while `hpc-serve cancel` stops it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpc.jobs.build_plan import BuildPlan, plan_build, served_spec
from hpc.jobs.build_script import write_build
from hpc.jobs.executors import Executor, LocalExecutor
from hpc.jobs.kinds import BuildJob, job_class_of
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import TERMINAL
from hpc.spec import Spec
from launcher.contracts.build_records import BuildingMarker, BuildRequest, BuildStep
from launcher.contracts.layout import Deployment, JobPaths, building_marker, building_markers

#: lines of a failed build's output that `status` shows
TAIL_LINES = 12
#: a build in these states makes the engine a second submission needs: that one waits for it instead of building
#: again (STOPPING: Slurm's COMPLETING, its end not known yet; a build being cancelled is not waited for)
UNDER_WAY = ("PENDING", "BUILDING", "STOPPING")


@dataclass(frozen=True)
class PreparedBuild:
    """A spec with a `build:` section, split: what is built, and the spec that serves the result."""

    spec: Spec  # with its build: section
    plan: BuildPlan
    served: Spec  # the engine folder in place of the build (hpc/jobs/build_plan.py served_spec)


def prepare(spec: Spec) -> PreparedBuild:
    plan = plan_build(spec)
    return PreparedBuild(spec, plan, served_spec(spec, plan.served_dir))


def start(
    prepared: PreparedBuild, runner: Executor, deploy_dir: Path, note: Callable[[str], object] = lambda _: None
) -> JobRef | None:
    """Submit the build job into `deploy_dir` (unless the engine is cached, or a build of it is under way: then
    that job); the job the serving job must come after, or None. Local jobs cannot depend on each other: the
    local executor's build is waited for here."""
    plan = prepared.plan
    if plan.cached is not None:
        note(f"engine {plan.cached} is built already for this spec: no build job")
        return None
    ref = _build_under_way(plan)
    if ref is not None:
        note(f"build {ref.job_id} of {plan.engine_dir} is under way already; serving waits for it")
    else:
        write_build(prepared.spec, plan, deploy_dir)
        ref = runner.submit(BuildJob, deploy_dir)
        _mark_building(plan, ref)
        note(f"build {ref.job_id} → {plan.engine_dir}")
    if isinstance(runner, LocalExecutor):
        from hpc.jobs.track import wait

        status = wait(ref, until=())
        if status.state != "COMPLETED":
            raise BuildFailed(status.summary())
        return None
    return ref


class BuildFailed(RuntimeError):
    """A build the serving job needed did not complete (its status summary: the step and its last lines)."""


def _mark_building(plan: BuildPlan, ref: JobRef) -> None:
    """The marker that `ref` builds the plan's engine (launcher/contracts/layout.py building_marker), written whole (a
    reader never sees half of it, so one it cannot read is broken, not being written). The job's EXIT trap
    removes it (build.sub.j2); a job that ended without running its script (cancelled while pending), or before
    the marker was written, leaves it: `_build_under_way` removes it."""
    marker = building_marker(plan.engine_dir.parent, plan.key, ref.job_id)
    marker.parent.mkdir(parents=True, exist_ok=True)
    BuildingMarker(job_id=ref.job_id, job_dir=str(ref.job_dir)).write(marker)


def _build_under_way(plan: BuildPlan) -> JobRef | None:
    """The job that builds the plan's engine now (PENDING or BUILDING), named by its marker; the markers of
    jobs that ended (or whose folder is gone, or that cannot be read) are stale: removed on the way."""
    for marker in building_markers(plan.engine_dir.parent, plan.key):
        if not os.access(marker, os.R_OK):  # gone (its job ended just now), or not ours to read: not known stale
            continue
        record = BuildingMarker.read(marker)
        ref = JobRef(record.job_id, Path(record.job_dir)) if record and record.job_id and record.job_dir else None
        if ref is not None and ref.job_dir.is_dir() and BuildJob(ref).status().state in UNDER_WAY:
            return ref
        with contextlib.suppress(OSError):  # a cache folder we may not write: the marker is ignored all the same
            marker.unlink()
    return None


def build_jobs(deploy_dir: Path) -> list[JobRef]:
    """The build jobs submitted into a deployment folder."""
    jobs = Deployment(deploy_dir).jobs_dir
    found = sorted(jobs.iterdir()) if jobs.is_dir() else []
    return [JobRef(folder.name, folder) for folder in found if job_class_of(folder) is BuildJob]


def build_reason(ref: JobRef, state: str, reason: str | None) -> str | None:
    """What `status` says beside a build job's state (hpc/jobs/kinds.py `BuildJob`): the step it is at (or that a
    stop interrupts), the engine it built, the step that failed with its command, or Slurm's reason."""
    paths = ref.paths
    if state == "FAILED" and paths.build_failure.exists():
        return describe_build_failure(ref)
    if state in ("BUILDING", "CANCELLING", "STOPPING"):
        return _current_step(ref)
    if state == "COMPLETED":
        return _built(ref)
    if state in TERMINAL:  # COMPLETED, above: what it built
        return (reason or "") + _tail_text(paths)
    return reason


def _request(ref: JobRef) -> BuildRequest:
    return BuildRequest.read(Deployment(ref.deploy_dir).build_request) or BuildRequest()


def _built(ref: JobRef) -> str | None:
    from launcher.jobscript.build_record import read_record

    engine = _request(ref).engine_dir
    if not engine:
        return None
    record = read_record(Path(engine))
    took = record.took_s if record is not None else None
    return f"engine {engine}" + (f" (built in {took:.0f} s)" if took is not None else "")


def _current_step(ref: JobRef) -> str | None:
    """`step 1 (trtllm-build): <its command>`: the step the job's script runs now, from its record (never from the
    log's text: launcher/contracts/build_records.py); None before the first."""
    step = BuildStep.read(ref.paths.build_step)
    if step is None:
        return None
    command = _command(ref, step.step)
    return step.describe() + (f": {command}" if command else "")


def _command(ref: JobRef, number: int) -> str | None:
    """Step `number`'s command line, as the build request lists it."""
    return _request(ref).command(number)


def _tail(paths: JobPaths) -> list[str]:
    try:
        return paths.build_log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    except OSError:
        return []


def _tail_text(paths: JobPaths) -> str:
    lines = _tail(paths)
    return ("; last lines:\n" + "\n".join(f"  | {line}" for line in lines)) if lines else ""


def describe_build_failure(ref: JobRef) -> str:
    """`step 1 (trtllm-build) failed with exit status 1: <command>` and the last lines of the steps' output."""
    failure = BuildStep.read(ref.paths.build_failure)
    if failure is None:  # there, but no record of a step (written by hand?): its output may say more
        return "a step failed" + _tail_text(ref.paths)
    command = _command(ref, failure.step)
    text = f"{failure.describe()} failed with exit status {failure.exit_code}"
    return text + (f": {command}" if command else "") + _tail_text(ref.paths)
