"""What every `hpc-serve` command module shares: the exit-code table, error printing, loading a spec or exiting,
finding the job or deployment a command names or exiting.

Why a module of its own: the command modules (main, jobs, query, views, launch, gateway, build, bench, doctor)
take these from here rather than from each other, so sharing them makes no import cycle.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpc.scheduler.index import JobRef
    from hpc.spec import Spec

#: Exit codes of every command (docs/cli.md lists EXIT_CODES; tests/test_cli_grammar.py keeps the two equal).
EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_TIMEOUT = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # the shell's for SIGINT (128 + 2): what a user who pressed Ctrl-C expects
EXIT_CODES = {
    EXIT_OK: "it worked (READY, answered, cancelled, printed)",
    EXIT_JOB_FAILED: "the job or the request failed: FAILED, TIMEOUT, a build that failed, a doctor check that failed",
    EXIT_USAGE: "bad input: the spec, a flag or a request, named in the message with the fix",
    EXIT_NOT_FOUND: "not found: no such job or deployment, or nothing ready to answer yet",
    EXIT_TIMEOUT: "--timeout ran out while the job was still under way (PENDING, STARTING): it goes on",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C): the command says what it left running (a job waited for goes on)",
}

#: What TARGET means, for every command that takes one (hpc/serving/deployment.py `resolve` reads it).
TARGET_HELP = (
    "a spec file, a deployment folder or a deployment name (the deployment), or a job id (1234, 1234@cluster) "
    "or a job folder (that job)"
)
#: --seed and --timeout mean one thing on every command that has them
SEED_HELP = "the sampling seed: the same seed, prompt and settings give the same text"
TIMEOUT_HELP = f"give up waiting after S seconds, 0 or more (exit {EXIT_TIMEOUT}: the job goes on)"
TARGETS_HELP = TARGET_HELP + "; several job ids of one deployment name those jobs"


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default when there is one to say (not None, not a false switch) and
    the help does not already say it: a user reads what leaving the flag out means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if text == argparse.SUPPRESS or not action.option_strings or default is None or default is False:
            return text
        if default == argparse.SUPPRESS or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def err(message: str) -> None:
    print(f"hpc-serve: {message}", file=sys.stderr)


def bounded(kind: type, least: float = 0, most: float | None = None, more_than: bool = True):
    """An argparse `type` for a number in a range: a flag out of it is argparse's usage error (exit 2) naming
    the flag, before anything is sent (a gateway's 400 would name its body's field, not the flag typed).
    `more_than`: `least` itself is out (a count, a duration); else it is in (a rank, an index)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        low_ok = value is not None and (value > least if more_than else value >= least)
        if not low_ok or (most is not None and value > most):
            bound = f"more than {least:g}" if more_than else f"at least {least:g}"
            raise argparse.ArgumentTypeError(f"{text!r}: a number {bound}" + (f", at most {most}" if most else ""))
        return value

    return parse


def sampling_flag(name: str):
    """The argparse type of a sampling flag: its range is the gateway's and the client's (hpc/spec/limits.py), and
    a value out of it is argparse's error naming the flag, before anything is sent."""
    from hpc.spec.limits import SAMPLING_BOUNDS

    bound = SAMPLING_BOUNDS[name]

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or not bound.holds(value):
            raise argparse.ArgumentTypeError(f"{text!r}: a number {bound.words()}")
        return value

    return parse


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


def add_target(parser: argparse.ArgumentParser, *, several: bool = False, default: str = "", url: bool = False) -> None:
    """The TARGET positional, the same on every command: one (`generate`, `wait`, `logs`, `bench`) or several
    (the commands that look at or stop a deployment's jobs); `default`: what no TARGET means (several only);
    `url`: a gateway URL is a TARGET too (`bench`)."""
    if several:
        help_text = TARGETS_HELP + (f" (default: {default})" if default else "")
        nargs = "*" if default else "+"
        parser.add_argument("target", nargs=nargs, metavar="TARGET", help=help_text)
        return
    help_text = TARGET_HELP + ("; or a gateway URL http://host:port" if url else "")
    parser.add_argument("target", metavar="TARGET", help=help_text)


def one_job_or_exit(target: str) -> JobRef:
    """The job TARGET names, or of a deployment its current job (hpc/jobs/chain.py `current_job`): what the
    commands that follow one job (`wait`, `logs`, `generate --replica`) act on."""
    from hpc.jobs.chain import current_job

    found, refs = job_or_deployment([target])
    if refs:
        return refs[0]
    ref = current_job(found)
    if ref is None:
        err(f"{target}: the deployment has no job yet")
        raise SystemExit(EXIT_NOT_FOUND)
    err(f"job {ref.job_id} of {found.name}")
    return ref


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
