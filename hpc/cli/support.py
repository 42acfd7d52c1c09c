"""What every `hpc-serve` command module shares: the exit-code table, error printing, loading a spec or exiting,
finding the job or deployment a command names or exiting.

Why a module of its own: the command modules (cli, jobs_cli, query_cli, launch) used to import these from each other,
which made an import cycle; now they all import from here and from nothing of each other.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpc.scheduler.index import JobRef
    from hpc.spec import Spec

#: Exit codes of every command: 0 ok, 1 the job failed / was cancelled / timed out, 2 bad input (spec,
#: flags), 3 not found.
EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3


def err(message: str) -> None:
    print(f"hpc-serve: {message}", file=sys.stderr)


def load_spec_or_exit(path: str, preview: bool = False) -> Spec:
    """The spec, or exit 2 listing its problems. `preview` (render, submit --dry-run): model folders that do
    not exist yet are printed as notes, not refused, and so is a checkpoint that `model.init` will create."""
    from hpc.spec import SpecError, load_spec, preview_spec

    try:
        spec, notes = preview_spec(path) if preview else (load_spec(path), [])
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    for note in notes:
        print(f"note: {note} (validate and submit refuse this until it exists)", file=sys.stderr)
    if preview:
        note_model_to_create(spec)
    return spec


def note_model_to_create(spec: Spec) -> None:
    """Say what will create the checkpoint `model.init` asks for, since a preview does not."""
    from hpc.jobs.model_init import init_command

    command = init_command(spec)
    if command:
        print(
            f"note: model.checkpoint_dir {spec.model.checkpoint_dir} does not exist yet; `hpc-serve submit` "
            f"creates it (model.init), or create it now with: {command}",
            file=sys.stderr,
        )


def find_job_or_exit(job: str) -> JobRef:
    """The job, looked up once per command (its folder from the index, else scontrol/sacct), or exit 3."""
    from hpc.scheduler.index import JobNotFound, find_job

    try:
        return find_job(job)
    except JobNotFound as exc:
        print(f"hpc-serve: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_NOT_FOUND) from None


def job_or_deployment(targets: list[str]):
    """(the deployment or None, the jobs named): one job id or folder is looked up as a job first (its folder
    need not hold a readable spec); anything else as a TARGET (hpc/serving/deployment.py `resolve`)."""
    from hpc.serving.deployment import names_indexed_job

    if len(targets) == 1 and names_indexed_job(targets[0]):
        return None, [find_job_or_exit(targets[0])]
    return resolve_or_exit(targets)


def resolve_or_exit(targets: list[str]):
    """(the deployment, the jobs named) TARGET names, or exit 2 (bad spec, ambiguous) / 3 (not found)."""
    from hpc.scheduler.index import JobNotFound
    from hpc.serving.deployment import TargetError, resolve
    from hpc.spec import SpecError

    try:
        return resolve(targets)
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    except TargetError as exc:
        err(str(exc))
        raise SystemExit(EXIT_USAGE if exc.ambiguous else EXIT_NOT_FOUND) from None
    except JobNotFound as exc:
        err(str(exc))
        raise SystemExit(EXIT_NOT_FOUND) from None
