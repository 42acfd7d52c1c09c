"""The job commands of `hpc-serve` that only look: status, list, endpoints, logs.

Why a module apart from hpc/cli/jobs.py (submit, wait, cancel, generate, and every job command's arguments):
these read a job's or a deployment's state and change nothing; jobs_cli imports `print_endpoints_or_exit`
from here (what `submit --wait` and `wait` print once READY), never the other way round.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from hpc.cli.support import (
    EXIT_JOB_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    err,
    job_or_deployment,
    one_job_or_exit,
)

if TYPE_CHECKING:
    from hpc.scheduler.index import JobRef


def _latest_job() -> JobRef:
    """The newest job that is not a gateway's: a submit with `gateway:` indexes its gateway job last, and the
    gateway job's `status` is one line, where the serving job's shows the job and the gateway."""
    from hpc.jobs.kinds import GatewayJob, job_class_of
    from hpc.scheduler.index import list_jobs

    jobs = list_jobs()
    if not jobs:
        print("hpc-serve: no jobs yet; submit one with `hpc-serve submit SPEC`", file=sys.stderr)
        raise SystemExit(EXIT_NOT_FOUND)
    return next((ref for ref in jobs if job_class_of(ref.job_dir) is not GatewayJob), jobs[0])


def cmd_status(args: argparse.Namespace) -> int:
    from hpc.jobs.kinds import job_class_of
    from hpc.jobs.track import job_status
    from launcher.contracts.job_states import JobState

    target, refs = job_or_deployment(args.target) if args.target else (None, [_latest_job()])
    if target is None or len(refs) == 1:
        from hpc.jobs.chain import job_chain_line

        status = job_status(refs[0], with_gateway=True)
        chain = None if args.json else job_chain_line(refs[0])
        print(json.dumps(status.to_json(), indent=2) if args.json else status.summary())
        if chain:
            print(chain)
        if not args.json and job_class_of(refs[0].job_dir).after_builds and status.state != JobState.READY:
            from hpc.cli.build import print_builds

            print_builds(refs[0])
        return EXIT_JOB_FAILED if status.state in ("FAILED", "TIMEOUT") else EXIT_OK
    from hpc.cli.views import deployment_status

    view = deployment_status(target, refs)
    print(json.dumps(view.to_json(), indent=2) if args.json else view.summary())
    return EXIT_JOB_FAILED if any(s.state in ("FAILED", "TIMEOUT") for s in view.jobs) else EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hpc.bench.tables import compact_table
    from hpc.jobs.executors import watch
    from hpc.jobs.kinds import job_class_of
    from hpc.jobs.track import job_status
    from hpc.scheduler.index import list_jobs
    from hpc.serving.deployment import spec_name

    cells = []
    rows = []
    refs = list_jobs()[: args.limit]
    watch(refs)  # one sacct (and squeue) for all of them, not one per job
    for ref in refs:
        status = job_status(ref)
        detail = status.reason or status.url or ", ".join(f"{e.address}:{e.http_port}" for e in status.endpoints)
        # a job of another cluster than SLURM_CONF's reads `33@twin`: ids are per cluster (launcher/contracts/job_index.py)
        label = job_class_of(ref.job_dir).list_label(status)
        cells.append((label, spec_name(ref.deploy_dir) or "?", status.state, detail or "", str(ref.deploy_dir)))
        rows.append(status.to_json())
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        Console().print(compact_table(("job", "deployment", "state", "reason / endpoint", "folder"), cells, keep=3))
    return EXIT_OK


def print_endpoints_or_exit(refs: list[JobRef], fmt: str, target=None, what: str = "") -> int:
    """The deployment's gateway first when one answers, then the replicas (hpc/cli/views.py)."""
    from hpc.cli.views import print_endpoints

    if print_endpoints(target, refs, fmt):
        return EXIT_OK
    what = what or refs[0].job_id
    print(f"hpc-serve: {what} has no ready endpoint yet; see `hpc-serve status {what}`", file=sys.stderr)
    return EXIT_NOT_FOUND


def cmd_endpoints(args: argparse.Namespace) -> int:
    target, refs = job_or_deployment(args.target)
    return print_endpoints_or_exit(refs, "json" if args.json else args.format, target, " ".join(args.target))


def _world_size(ref: JobRef) -> int | None:
    """The job's ranks, from its deployment's launch.json; None when that cannot be read (a folder half gone)."""
    from launcher.contracts.plan import PlanError

    try:
        return ref.world_size
    except (OSError, PlanError, ValueError):
        return None


def cmd_logs(args: argparse.Namespace) -> int:
    from hpc.jobs.kinds import BuildJob, job_class_of

    ref = one_job_or_exit(args.target)
    # a build job has one log, its steps' output (hpc/jobs/)
    is_build = job_class_of(ref.job_dir) is BuildJob
    if not is_build and (world := _world_size(ref)) is not None and args.rank >= world:
        ranks = "only rank 0" if world == 1 else f"ranks 0 to {world - 1}"
        err(f"--rank {args.rank}: job {ref.job_id} has {ranks}")
        return EXIT_NOT_FOUND  # as a job that does not exist: the request was well formed
    path = ref.paths.build_log if is_build else ref.rank_log(args.rank, "err" if args.err else "out")
    while not path.exists():
        if not args.follow:
            print(f"hpc-serve: no log yet at {path}", file=sys.stderr)
            return EXIT_NOT_FOUND
        time.sleep(0.5)
    with open(path, errors="replace") as log:
        sys.stdout.write(log.read())
        sys.stdout.flush()
        if not args.follow:
            return EXIT_OK
        from hpc.jobs.track import job_status

        last_check = 0.0
        while True:
            chunk = log.read()
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
                continue
            if time.monotonic() - last_check > 5:
                last_check = time.monotonic()
                if job_status(ref).done:
                    sys.stdout.write(log.read())
                    return EXIT_OK
            time.sleep(0.3)
