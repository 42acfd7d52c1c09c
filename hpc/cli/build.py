"""`hpc-serve build SPEC [--wait]`: build the spec's engine as a job of its own, or say that it is built already."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, TextIO

from hpc.cli.support import EXIT_JOB_FAILED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, TIMEOUT_HELP, load_spec_or_exit

if TYPE_CHECKING:
    from hpc.jobs.submit import JobsPlan
    from hpc.scheduler.index import JobRef


def cmd_build(args: argparse.Namespace) -> int:
    from hpc.jobs.build import BuildFailed, prepare, start
    from hpc.jobs.executors import executor_named
    from hpc.jobs.submit import new_deployment_dir
    from hpc.scheduler.slurm import SlurmError

    spec = load_spec_or_exit(args.spec)
    if not spec.workflow_strategy.builds_engines:  # a build: section is an error there (hpc/spec/llmapi.py)
        print(
            f"{args.spec}: model.workflow llmapi serves the Hugging Face checkpoint {spec.model.checkpoint_dir} "
            "as it is (TensorRT-LLM's LLM API loads it when the job starts): no engine to build; "
            f"`hpc-serve submit {args.spec}` serves it"
        )
        return EXIT_OK
    if spec.build is None:
        print(f"hpc-serve: {args.spec} has no build: section; nothing to build", file=sys.stderr)
        return EXIT_USAGE
    from hpc.spec.site import profile_summary

    print(profile_summary(spec, explained=True), file=sys.stderr)  # the build job's script holds its values
    started = time.monotonic()
    try:
        runner = executor_named(args.executor)
        prepared = prepare(spec)
        if prepared.plan.cached is not None:
            print(f"{prepared.plan.cached} is built already for this spec: nothing to build")
            return EXIT_OK
        notes: list[str] = []
        ref = start(prepared, runner, new_deployment_dir(spec), notes.append)
    except BuildFailed as exc:  # the local executor waits for its build
        print(f"hpc-serve: the build failed: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except (SlurmError, ValueError) as exc:
        print(f"hpc-serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for line in notes:
        print(line, file=sys.stderr)
    if ref is None:  # local: built already, in the foreground
        print(f"{prepared.plan.engine_dir} built in {time.monotonic() - started:.1f} s")
        return EXIT_OK
    print(f"{ref.job_id} {ref.job_dir}")
    if not args.wait:
        return EXIT_OK
    from hpc.jobs.track import wait

    status = wait(ref, until=(), timeout=args.timeout, on_change=lambda s: print(s.summary(), file=sys.stderr))
    print(status.summary())
    if not status.done:
        return EXIT_TIMEOUT
    return EXIT_OK if status.state == "COMPLETED" else EXIT_JOB_FAILED


def build_scripts(jobs: JobsPlan) -> dict[str, str]:
    """`submit --dry-run`: the build job's script of a submission's plan, by name, when it builds an engine not
    built yet; else none."""
    prepared = jobs.build
    if prepared is None or prepared.plan.cached is not None:
        return {}
    from hpc.jobs.build_script import render_build_script
    from launcher.contracts.layout import BUILD_SUB_NAME

    return {BUILD_SUB_NAME: render_build_script(prepared.spec, prepared.plan, jobs.deployment.deploy_dir)}


def print_builds(ref: JobRef, file: TextIO | None = None) -> None:
    """A serving job not (yet) READY: the engine build job of its folder, waited for or failed (its status)."""
    from hpc.jobs.build import build_jobs
    from hpc.jobs.track import job_status

    for build in build_jobs(ref.deploy_dir):
        print(job_status(build).summary(), file=file)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build the spec's engine (build: section) as a job of its own, unless built")
    p.add_argument("spec", help="the spec file (YAML) with a build: section")
    p.add_argument("--wait", action="store_true", help="wait for the build's end; exit 1 if it failed")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="with --wait: " + TIMEOUT_HELP)
    p.add_argument("--executor", choices=["slurm", "local"], help="default: slurm where sbatch exists")
    p.set_defaults(func=cmd_build)
