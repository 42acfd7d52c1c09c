"""The job commands of `hpc-serve`: submit, status, list, wait, endpoints, logs, cancel, generate.

All of them work from a fresh shell with only the job id (hpc/scheduler/index.py finds the folder), for jobs
submitted by `hpc-serve submit` and by hand with `sbatch tensorrt_llm_triton.sub`. `add_commands` registers
them all, in the order `hpc-serve --help` lists them; the ones that submit, wait for, stop or talk to a job
run here, the ones that only look (status, list, endpoints, logs) in hpc/cli/query.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hpc.cli.query import cmd_endpoints, cmd_list, cmd_logs, cmd_status, print_endpoints_or_exit
from hpc.cli.support import (
    EXIT_INTERRUPTED,
    EXIT_JOB_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    SEED_HELP,
    TIMEOUT_HELP,
    add_target,
    bounded,
    job_or_deployment,
    load_spec_or_exit,
    one_job_or_exit,
    sampling_flag,
)
from launcher.contracts import model_names
from launcher.contracts.config import CANCEL_GRACE_S
from launcher.contracts.model_names import INT32_MAX, UINT64_MAX


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _wait_and_report(ref, timeout: float | None) -> int:
    """Live status line until READY or the end; print endpoints; exit code says how it went."""
    from hpc.jobs.track import wait

    console = _console()
    with console.status(f"{ref.job_id} submitted") as line:

        def show(status) -> None:
            text = status.summary().splitlines()[0]
            line.update(f"{text}  [dim]({time.strftime('%H:%M:%S')})[/dim]")
            console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")

        try:
            status = wait(ref, until=("READY",), timeout=timeout, on_change=show)
        except KeyboardInterrupt:
            line.stop()
            _left_running(ref)
            return EXIT_INTERRUPTED
    if status.state == "READY":
        print_endpoints_or_exit([ref], "text")
        console.print(
            f'[dim]next: hpc-serve generate {ref.job_id} "Hello"  ·  hpc-serve status {ref.job_id}  ·  '
            f"hpc-serve cancel {ref.job_id}[/dim]",
            soft_wrap=True,
        )
        return EXIT_OK
    print(status.summary(), file=sys.stderr)
    from hpc.cli.build import print_builds  # the build a serving job waited for (or that failed)

    print_builds(ref, file=sys.stderr)
    if not status.done:
        print(f"hpc-serve: gave up waiting after {timeout}s; the job is still {status.state}", file=sys.stderr)
        return EXIT_TIMEOUT
    return EXIT_JOB_FAILED


def _say_if_random(target) -> None:
    """A model of random weights (model.init's, the embedded default) writes random text, byte tokens that decode
    to U+FFFD among them: said once on stderr, so it does not read as a bug (stdout stays the text alone)."""
    model = getattr(target, "model", None)
    if model is not None and model.init is not None and model.backend_strategy.init_makes_random_weights:
        print(
            f"note: {target.name} serves random weights (model.init): its text is random, '\ufffd' included; "
            "point model.checkpoint_dir at a trained checkpoint for real text",
            file=sys.stderr,
        )


def _left_running(ref) -> None:
    """What a Ctrl-C during a wait leaves: the job, which goes on (a newcomer takes 130 for a cancel)."""
    from hpc.jobs.track import job_status

    try:
        state = job_status(ref).state
    except Exception:  # the answer is the advice below; a Slurm hiccup must not hide it
        state = "under way"
    print(
        f"hpc-serve: stopped waiting; job {ref.job_id} is {state} and goes on.\n"
        f"  follow it: hpc-serve wait {ref.job_id}  ·  stop it: hpc-serve cancel {ref.job_id}",
        file=sys.stderr,
    )


def cmd_submit(args: argparse.Namespace) -> int:
    from hpc.jobs.submit import SubmitError, submit

    spec = load_spec_or_exit(args.spec, preview=args.dry_run)
    if args.dry_run:
        from hpc.cli.build import build_scripts
        from hpc.jobs.submit import new_deployment_dir, plan_jobs
        from hpc.render.jobfiles import plan_scripts
        from hpc.spec.site import profile_summary

        # the line `submit` says first: the scripts below hold the profile's values
        print(profile_summary(spec, explained=True), file=sys.stderr)
        deploy_dir = new_deployment_dir(spec)
        jobs = plan_jobs(spec, deploy_dir)  # what `submit` plans, once
        scripts = build_scripts(jobs)  # a build: section's script first (hpc/jobs/)
        scripts.update(plan_scripts(jobs.deployment))
        for name, text in scripts.items():
            print(f"# ==> {deploy_dir / name} <==")
            print(text)
        print(
            f"# (dry run: nothing written, nothing submitted; the model repository goes to {deploy_dir}/"
            "triton_model_repo)",
            file=sys.stderr,
        )
        return EXIT_OK
    from hpc.doctor.preflight import check_before_submit
    from hpc.jobs.build import BuildFailed
    from hpc.spec import SpecError

    try:
        check_before_submit(spec, args.executor)
        ref = submit(spec, executor=args.executor, note=lambda line: print(line, file=sys.stderr, flush=True))
    except SpecError as exc:  # a job Slurm would queue and never start: none is submitted
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_USAGE
    except BuildFailed as exc:  # the local executor waits for its build
        print(f"hpc-serve: the build failed: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except SubmitError as exc:
        print(f"hpc-serve: sbatch refused the job: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"hpc-serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{ref.job_id} {ref.job_dir}")
    if spec.gateway is not None and spec.gateway.enabled:
        from hpc.jobs.gateway import deployment_gateway
        from hpc.serving.deployment import target_of_folder

        line = deployment_gateway(target_of_folder(ref.deploy_dir))
        print(line.summary() if line else "gateway: none", flush=True)
    if args.wait:
        return _wait_and_report(ref, args.timeout)
    return EXIT_OK


def cmd_wait(args: argparse.Namespace) -> int:
    return _wait_and_report(one_job_or_exit(args.target), args.timeout)


def cmd_cancel(args: argparse.Namespace) -> int:
    """A job: its ordered stop (a successor its renewer already submitted goes on). A deployment: every job of it,
    and no renewal submits another (hpc/jobs/chain.py)."""
    from hpc.jobs.chain import cancel_deployment, successor_under_way
    from hpc.jobs.track import cancel
    from hpc.scheduler.slurm import SlurmError

    target, refs = job_or_deployment(args.target)
    not_cancelled: list[str] = []
    try:
        if refs:
            statuses = [cancel(ref, grace_s=args.grace) for ref in refs]
        else:  # each job that cannot be cancelled is named, and the others are cancelled all the same
            result = cancel_deployment(target, args.grace)
            statuses, not_cancelled = result.statuses, result.not_cancelled
    except SlurmError as exc:  # scancel refused (not the owner …): its words, not a traceback
        print(f"hpc-serve: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
    if not statuses and not not_cancelled:
        print(f"{target.name}: no job under way; no renewal will submit another")
    for status in statuses:
        print(status.summary())
    for line in not_cancelled:
        print(f"hpc-serve: {line}", file=sys.stderr)
    for ref in refs:
        successor = successor_under_way(ref)
        if successor:
            print(
                f"note: its successor {successor} goes on; `hpc-serve cancel` of the spec file or the deployment's "
                "name stops the whole deployment",
                file=sys.stderr,
            )
    return EXIT_OK if all(status.done for status in statuses) and not not_cancelled else EXIT_JOB_FAILED


def _prompts(args: argparse.Namespace) -> list[str]:
    """The prompt argument, or one prompt per non-empty line of --file (`-`: stdin)."""
    if args.file is None:
        return [args.prompt]
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def cmd_generate(args: argparse.Namespace) -> int:
    from hpc.client import Client, ClientError, NotReady, RequestError, TargetError
    from hpc.client.transport import Sampling
    from hpc.spec import SpecError

    if (args.prompt is None) == (args.file is None):
        which = "not both" if args.prompt is not None else "none was given"
        print(f"hpc-serve generate: give a PROMPT or --file FILE (one prompt per line); {which}", file=sys.stderr)
        return EXIT_USAGE
    try:
        prompts = _prompts(args)
    except OSError as exc:
        print(f"hpc-serve generate: --file: {exc}", file=sys.stderr)
        return EXIT_USAGE
    named = {name: getattr(args, name) for name in Sampling.__annotations__}  # one flag per sampling parameter
    sampling = {name: value for name, value in named.items() if value is not None}
    options = {"model": args.model, "gateway": False if args.direct else None}
    try:
        if args.replica is not None:
            client = Client.from_job(one_job_or_exit(args.target), replica=args.replica, **options)
        else:
            client = Client(args.target, **options)
        with client:
            _say_if_random(client.target)
            if args.file is not None:  # JSON lines: a completion may span lines
                texts = client.generate_batch(prompts, args.max_tokens, args.concurrency, **sampling)
                for prompt, text in zip(prompts, texts, strict=True):
                    print(json.dumps({"prompt": prompt, "text": text}, ensure_ascii=False))
            elif args.stream:
                for piece in client.stream(prompts[0], args.max_tokens, **sampling):
                    print(piece, end="", flush=True)
                print()
            else:
                print(client.generate(prompts[0], args.max_tokens, **sampling))
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_USAGE
    except ClientError as exc:  # nothing to send to: 3; the request refused: 2; it failed on the server: 1
        print(f"hpc-serve: {exc}", file=sys.stderr)
        if isinstance(exc, TargetError | NotReady):
            return EXIT_NOT_FOUND
        return EXIT_USAGE if isinstance(exc, RequestError) else EXIT_JOB_FAILED
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="render a spec into a new job folder and submit it")
    p.add_argument("spec", help="the spec file (YAML)")
    p.add_argument("--wait", action="store_true", help="show the job's progress until READY, then its endpoints")
    p.add_argument(
        "--timeout",
        type=bounded(float, 0, more_than=False),
        default=None,
        metavar="S",
        help="with --wait: " + TIMEOUT_HELP,
    )
    p.add_argument(
        "--executor", choices=["slurm", "local"], default=None, help="default: slurm where sbatch exists, else local"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the exact sbatch and per-rank scripts that would run; write and submit nothing",
    )
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "status",
        help="a job's or a deployment's state: PENDING (reason), STARTING, READY, FAILED (rank) …, its gateway",
    )
    add_target(p, several=True, default="the newest serving job, and its gateway")
    p.add_argument("--json", action="store_true", help="the records as JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("list", help="jobs this user submitted, newest first")
    p.add_argument("--limit", type=int, default=20, help="at most N jobs")
    p.add_argument("--json", action="store_true", help="each job's status as JSON")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "wait", help="wait until a job (of a deployment: its current one) is READY (exit 0) or has ended (exit 1)"
    )
    add_target(p)
    p.add_argument("--timeout", type=bounded(float, 0, more_than=False), default=None, metavar="S", help=TIMEOUT_HELP)
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser(
        "endpoints", help="where a job or deployment serves: its gateway first, then each replica's leader"
    )
    add_target(p, several=True)
    p.add_argument("--json", action="store_true", help="the same as --format json")
    p.add_argument("--format", choices=["text", "env", "json"], default="text", help="env: shell variables to `eval`")
    p.set_defaults(func=cmd_endpoints)

    p = sub.add_parser("logs", help="a rank's log (stdout, or --err)")
    add_target(p)
    p.add_argument("--rank", type=bounded(int, 0, more_than=False), default=0, help="the rank whose log to print")
    p.add_argument("--err", action="store_true", help="stderr instead of stdout")
    p.add_argument("-f", "--follow", action="store_true", help="print what the rank writes until the job ends")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser(
        "cancel",
        help="stop a job (graceful stop of every rank first, then scancel), or a deployment: all its jobs, no renewal",
    )
    add_target(p, several=True)
    p.add_argument(
        "--grace", type=float, default=CANCEL_GRACE_S, metavar="S", help="seconds to wait for a graceful stop"
    )
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser(
        "generate",
        help="send prompts to a deployment: through its gateway when one runs, else balanced over its replicas",
    )
    add_target(p)
    p.add_argument("prompt", nargs="?", help="the prompt (or --file)")
    p.add_argument("--file", help="one prompt per line (- for stdin); prints one JSON line per prompt, in order")
    p.add_argument("--max-tokens", type=bounded(int, most=INT32_MAX), default=64, help="tokens to generate at most")
    p.add_argument("--stream", action="store_true", help="print the text as it is generated")
    p.add_argument(
        "--temperature", type=sampling_flag("temperature"), help="sampling temperature (default: the model's)"
    )
    p.add_argument(
        "--top-p", type=sampling_flag("top_p"), help="nucleus sampling: keep the tokens of this much probability"
    )
    p.add_argument("--top-k", type=bounded(int, most=INT32_MAX), help="sample among the k likeliest tokens")
    p.add_argument("--seed", type=bounded(int, 0, UINT64_MAX, more_than=False), help=SEED_HELP)
    p.add_argument("--presence-penalty", type=sampling_flag("presence_penalty"), help="-2..2, as OpenAI's")
    p.add_argument("--frequency-penalty", type=sampling_flag("frequency_penalty"), help="-2..2, as OpenAI's")
    p.add_argument("--stop", action="append", help="stop before this text (repeatable)")
    p.add_argument("--concurrency", type=bounded(int), default=8, help="with --file: requests in flight at once")
    p.add_argument("--direct", action="store_true", help="go to the replicas even when a gateway runs")
    p.add_argument(
        "--model",
        help=f"send to this model instead of each replica's own ({model_names.ENSEMBLE} on the engine workflow, "
        f"{model_names.TENSORRT_LLM} on llmapi): {model_names.TENSORRT_LLM_BLS}, the engine workflow's BLS "
        "pipeline (replicas only)",
    )
    p.add_argument(
        "--replica", type=bounded(int, 0, more_than=False), help="only this replica of the job TARGET (no balancing)"
    )
    p.set_defaults(func=cmd_generate)
