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
from hpc.jobs.track import wait
from hpc.scheduler.index import JobRef
from hpc.spec import Spec
from launcher.contracts.build_records import BuildingMarker
from launcher.contracts.job_states import JobState
from launcher.contracts.layout import Deployment, building_marker, building_markers

#: a build in these states makes the engine a second submission needs: that one waits for it instead of building
#: again (STOPPING: Slurm's COMPLETING, its end not known yet; a build being cancelled is not waited for)
UNDER_WAY = (JobState.PENDING, JobState.BUILDING, JobState.STOPPING)


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
        status = wait(ref, until=())
        if status.state != JobState.COMPLETED:
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
