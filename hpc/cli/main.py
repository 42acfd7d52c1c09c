"""`hpc-serve` command line. Each sub-command is a thin shell over a module that does the work.

Exit codes: hpc/cli/support.py EXIT_CODES (docs/cli.md lists them). TARGET: support.add_target, for every command.
Imports are lazy so `hpc-serve --help` and `validate` stay fast on a login node.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from backend.sim_engine.profiles import MODELS as SIM_MODELS
from hpc.cli.support import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, HelpFormatter, load_spec_or_exit
from hpc.cli.support import err as _err

if TYPE_CHECKING:
    from hpc.spec import Spec


def cmd_validate(args: argparse.Namespace) -> int:
    from hpc.doctor.preflight import refusals
    from hpc.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_USAGE
    never_starts, notes = refusals(spec)  # what Slurm would take and never start (where Slurm answers)
    for line in [*map(str, never_starts), *notes]:
        print(line, file=sys.stderr)
    if never_starts:
        return EXIT_USAGE
    print(
        f"{args.spec}: ok — {spec.name}: backend {spec.model.backend}, workflow {spec.model.workflow}, "
        f"tp {spec.model.tp_size} × pp "
        f"{spec.model.pp_size} × replicas {spec.replicas} = {spec.world_size} ranks on {spec.slurm.nodes} node(s)"
    )
    from hpc.render.gpu_binding import describe

    print(describe(spec))
    if spec.build is not None:  # what `submit` would do about the engine (hpc/jobs/build_plan.py)
        from hpc.jobs.build_plan import plan_build

        plan = plan_build(spec)
        print(f"  build: {plan.cached} is built already" if plan.cached else f"  build: a job builds {plan.engine_dir}")
    _explain(spec, args.explain)
    return EXIT_OK


def _explain(spec: Spec, everything: bool) -> None:
    """The site profile, and where values came from: every value with `everything` (--explain), else those the
    profile gave or the spec took over from it (hpc/spec/site.py)."""
    from hpc.spec.site import explain, profile_summary

    print(profile_summary(spec, explained=everything))
    for line in explain(spec, everything=everything):
        print(f"  {line}")


def cmd_render(args: argparse.Namespace) -> int:
    from hpc.jobs.submit import plan_jobs
    from hpc.render.deployment_plan import deployment_folder
    from hpc.render.jobfiles import render_plan

    spec = load_spec_or_exit(args.spec, preview=True)
    if args.templates and not Path(args.templates).is_dir():
        _err(
            f"--templates {args.templates}: no such folder (it should hold some of hpc/render/templates/, e.g. _sbatch.j2)"
        )
        return EXIT_USAGE
    # what `submit` would run, planned once: with a build: section the deployment serves the engine the build
    # makes (hpc/jobs/), and both scripts are written
    jobs = plan_jobs(spec, deployment_folder(args.output))
    prepared, spec = jobs.build, jobs.served
    templates = Path(args.templates) if args.templates else None
    try:
        out = render_plan(jobs.deployment, templates=templates)
    except ValueError as exc:
        _err(str(exc))
        return EXIT_USAGE
    build_sub = None
    if prepared is not None and prepared.plan.cached is None:
        from hpc.jobs.build_script import write_build

        build_sub = write_build(prepared.spec, prepared.plan, out.deploy_dir, templates)
    print(f"rendered {out.deploy_dir}")
    print(jobs.deployment.gpu.line())
    for path in (out.sub, out.sh, out.model_repository, out.launch):
        print(f"  {path}")
    if spec.workflow_strategy.chooses_model_py:
        from hpc.render.llmapi import model_files_source

        print(f"  {model_files_source(spec)}")
    if out.gateway_sub is not None:
        print(f"  {out.gateway_sub}  (the gateway's own job: one per deployment, it serves every job of it)")
    from hpc.jobs.model_init import create_command

    first = create_command(jobs.model)
    if prepared is not None and build_sub is None:
        print(f"  (engine {prepared.plan.cached}: built already for this spec, no build job)")
    if build_sub is not None:  # the engine build first, serving after it (hpc/jobs/)
        print(f"  {build_sub}  (the engine build → {prepared.plan.engine_dir})")  # type: ignore[union-attr]
        print(
            f"submit with: BUILD=$(sbatch --parsable {build_sub}) && "
            f"sbatch --dependency=afterok:$BUILD --kill-on-invalid-dep=yes {out.sub}"
        )
    else:
        print(f"submit with: {first + ' && ' if first else ''}sbatch {out.sub}")
    if out.gateway_sub is not None:
        print(f"gateway: sbatch {out.gateway_sub}  (unless the deployment's gateway already runs: hpc-serve status)")
    _explain(spec, args.explain)
    return EXIT_OK


def cmd_init_model(args: argparse.Namespace) -> int:
    from backend.cpu_engine.init_model import create_checkpoint

    out = Path(args.dir).expanduser()
    if (out / "config.json").exists() and not args.force:
        _err(f"{out} already holds a checkpoint; pass --force to replace it")
        return EXIT_USAGE
    if args.sim_model:
        import shutil

        from backend.sim_engine.checkpoint import create_sim_checkpoint

        if args.force and out.exists():
            shutil.rmtree(out)
        create_sim_checkpoint(out, args.sim_model)
        print(f"wrote {args.sim_model}'s config.json and a tokenizer (no weights: backend sim) to {out}")
        return EXIT_OK
    create_checkpoint(out, family=args.family, size=args.size, seed=args.weights_seed, overwrite=args.force)
    print(f"wrote a random-weight {args.family} ({args.size}) checkpoint and tokenizer to {out}")
    return EXIT_OK


def cmd_launch(args: argparse.Namespace) -> int:
    from hpc.cli.launch import launch

    return launch(args.target)


_EXPLAIN = "list every value and where it came from: spec FILE:LINE, site profile FILE:LINE, or default"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpc-serve",
        description="Serve TensorRT-LLM models with Triton Inference Server on Slurm clusters.",
    )
    from hpc import __version__

    parser.add_argument("--version", action="version", version=f"hpc-serve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a spec; list every problem as FILE:LINE: field: message")
    p.add_argument("spec", help="the spec file (YAML)")
    p.add_argument("--explain", action="store_true", help=_EXPLAIN)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="write the sbatch script, per-rank script and model repository")
    p.add_argument("spec", help="the spec file (YAML)")
    p.add_argument("-o", "--output", required=True, help="deployment folder to write (on a shared filesystem)")
    p.add_argument("--templates", help="a folder of site templates overriding hpc/render/templates/")
    p.add_argument("--explain", action="store_true", help=_EXPLAIN)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("init-model", help="write a small random-weight checkpoint and tokenizer (no internet)")
    p.add_argument("dir", help="the folder to write (created)")
    p.add_argument("--family", choices=["gpt2", "llama"], default="gpt2", help="the architecture")
    p.add_argument("--size", choices=["tiny", "small"], default="tiny", help="tiny: seconds on a CPU; small: more")
    p.add_argument("--weights-seed", type=int, default=0, help="the random weights' seed (spec: model.init.seed)")
    p.add_argument("--force", action="store_true", help="replace an existing checkpoint")
    p.add_argument(
        "--sim-model",
        choices=sorted(SIM_MODELS),
        help="backend sim: write this model's config.json and a tokenizer, no weights (spec: model.init.model)",
    )
    p.set_defaults(func=cmd_init_model)

    p = sub.add_parser("launch", help="per-rank entry point: run under srun --mpi=pmix (DIR or SPEC)")
    p.add_argument("target", help="a rendered deployment folder, or a spec (rank 0 renders it first)")
    p.set_defaults(func=cmd_launch)

    from hpc.cli import bench as bench_cli
    from hpc.cli import doctor as doctor_cli
    from hpc.cli import gateway as gateway_cli
    from hpc.cli import jobs as jobs_cli

    jobs_cli.add_commands(sub)
    from hpc.cli import build as build_cli

    build_cli.add_commands(sub)
    gateway_cli.add_commands(sub)
    bench_cli.add_commands(sub)
    doctor_cli.add_commands(sub)
    for command in sub.choices.values():  # one rule for every command's help: defaults said
        command.formatter_class = HelpFormatter
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """argparse's parse, with a did-you-mean for a mistyped flag (`--temprature`: did you mean --temperature?),
    said by the command's own parser (its usage line) as argparse's error: exit 2."""
    args, extras = parser.parse_known_args(argv)
    if not extras:
        return args
    import difflib

    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    command = commands[args.command]
    flags = [flag for action in command._actions for flag in action.option_strings if flag.startswith("--")]
    hints = []
    for extra in extras:
        close = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1) if extra.startswith("-") else []
        hints.append(f"{extra} (did you mean {close[0]}?)" if close else extra)
    command.error(f"unrecognized arguments: {' '.join(hints)}")
    raise AssertionError("argparse's error exits")  # pragma: no cover


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # a command that leaves something running says so itself (e.g. a wait)
        print("hpc-serve: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
