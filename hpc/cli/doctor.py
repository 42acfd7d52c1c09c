"""`hpc-serve doctor [SPEC] [--probe] [--serve] [--write-profile [PATH]]`: is this cluster ready for the spec?

Exit 0 when every check passes (warnings allowed), 1 when one fails, 2 for a spec with problems. `--serve`
submits the spec and runs a battery against it (hpc/doctor/serve.py); a SPEC is needed for it. Without a
SPEC the checks are those of hpc-serve in general: the schema's defaults (the default partition, pmix, no
container, no GPUs, workdir ./runs).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from hpc.cli.support import EXIT_USAGE, err, load_spec_or_exit
from hpc.doctor.serve_options import MODEL_CHOICES, SERVE_TIMEOUT_S

if TYPE_CHECKING:
    from hpc.spec import Spec


def general_spec() -> Spec:
    """What hpc-serve needs in general: the schema's defaults, workdir ./runs."""
    from hpc.spec import Spec

    return Spec.model_validate(
        {"name": "doctor", "workdir": str(Path.cwd() / "runs"), "model": {"backend": "cpu", "checkpoint_dir": "."}}
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hpc.doctor.login import login_checks
    from hpc.doctor.report import exit_code, print_report, skip

    console = Console()
    if args.serve and not args.spec:
        err("--serve needs a SPEC: it submits that spec and runs requests against it")
        return EXIT_USAGE
    # --serve submits the spec: loaded as `submit` loads it (model folders must exist)
    spec = load_spec_or_exit(args.spec, preview=not args.serve) if args.spec else general_spec()
    source = args.spec or "hpc-serve's defaults (no SPEC)"
    checks, facts = login_checks(spec)
    folder = None
    if args.probe:
        if any(c.status == "fail" for c in checks):
            checks.append(skip("probe", "not submitted: fix the failures above first"))
        else:
            from hpc.doctor.probe import run_probe

            probe_checks, folder = run_probe(spec, facts, args.probe_timeout, say=console.print)
            checks += probe_checks
    if args.serve:
        if any(c.status == "fail" for c in checks):
            checks.append(skip("serve", "not submitted: fix the failures above first"))
        else:
            from hpc.doctor.serve import run_serve

            say = lambda line: console.print(line, markup=False, highlight=False)  # noqa: E731
            checks += run_serve(spec, args.serve_timeout, args.models, say=say)
    title = f"hpc-serve doctor: {source}" + (f" (Slurm {facts.slurm_version})" if facts.slurm_version else "")
    print_report(checks, title, console)
    code = exit_code(checks)
    if folder is not None:
        if code == 0:
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                folder.parent.rmdir()  # <workdir>/.doctor, when no other probe is in it
        else:
            console.print(f"probe folder kept for a look: {folder}", markup=False, highlight=False)
    if args.write_profile is not None:
        from hpc.doctor.profile import write_doctor_profile
        from hpc.spec import SpecError

        try:
            path = write_doctor_profile(args.write_profile or None, spec, facts, checks, source)
        except FileExistsError as exc:
            err(f"--write-profile: {exc}")
            return EXIT_USAGE
        except SpecError as exc:
            for problem in exc.problems:
                err(f"--write-profile: {problem}")
            return EXIT_USAGE
        console.print(f"wrote site profile {path}", markup=False, highlight=False)
    return code


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this cluster against a spec (or hpc-serve's needs): a table of checks with fixes; exit 1 on a failure",
    )
    p.add_argument("spec", nargs="?", help="the spec to check for (default: what hpc-serve needs in general)")
    p.add_argument(
        "--probe",
        action="store_true",
        help="also submit a tiny job: shared workdir, tritonserver starts, GPUs, TensorRT-LLM version on a node",
    )
    p.add_argument("--probe-timeout", type=float, default=180.0, metavar="S", help="seconds to wait for the probe job")
    p.add_argument(
        "--serve",
        action="store_true",
        help="also submit the spec (one replica), run a battery of requests against it and cancel it: "
        "the first run with a new image or cluster",
    )
    p.add_argument(
        "--serve-timeout",
        type=float,
        default=SERVE_TIMEOUT_S,
        metavar="S",
        help="--serve: seconds the job may take to be READY (queue included) before it is cancelled",
    )
    p.add_argument(
        "--models",
        choices=MODEL_CHOICES,
        default="spec",
        help="--serve: the llmapi model(s) to run the battery on: the spec's, hpc-serve's, the image's, or both "
        "in turn (backend tensorrtllm; backend cpu has only hpc-serve's)",
    )
    p.add_argument(
        "--write-profile",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="write a starting site profile from what was found (default ~/.config/hpc-serve/site.yaml)",
    )
    p.set_defaults(func=cmd_doctor)
