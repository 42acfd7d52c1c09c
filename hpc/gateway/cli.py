"""`hpc-serve gateway TARGET` and `hpc-serve token TARGET`.

Why a module apart from hpc/jobs_cli.py: these are the only commands that import the web stack; hpc/cli.py
registers them through `add_commands` and imports this module's body (FastAPI, uvicorn) only when one runs.
"""

from __future__ import annotations

import argparse
import sys

from hpc.cli_support import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, err

DEFAULT_PORT = 9000


def _target(text: str):
    """The deployment TARGET names, or exit 2 (bad spec) / 3 (unknown job)."""
    from hpc.jobs import JobNotFound
    from hpc.routing.deployment import resolve_target
    from hpc.spec import SpecError

    try:
        return resolve_target(text)
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    except JobNotFound as exc:
        err(str(exc))
        raise SystemExit(EXIT_NOT_FOUND) from None


def cmd_gateway(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from hpc.gateway.app import create_app

    target = _target(args.target)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health check otherwise
    print(f"hpc-serve gateway for {target.name} in {target.workdir}: http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(create_app(target, refresh_s=args.refresh), host=args.host, port=args.port, log_level="warning")
    return EXIT_OK


def cmd_token(args: argparse.Namespace) -> int:
    from hpc.gateway.auth import ensure_token
    from hpc.routing.deployment import deployment_folders

    target = _target(args.target)
    folders = deployment_folders(target)
    if not folders:
        err(f"{target.name}: no deployment folder in {target.workdir} yet; submit it first")
        return EXIT_NOT_FOUND
    print(ensure_token(folders[-1]))
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gateway", help="OpenAI API and Triton passthrough in front of every ready replica of a deployment"
    )
    p.add_argument("target", help="a spec file, or a job id of the deployment")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--refresh", type=float, default=5.0, help="seconds between looks for new or lost replicas")
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("token", help="print the deployment's access token (made on first use, 0600)")
    p.add_argument("target", help="a spec file, or a job id of the deployment")
    p.set_defaults(func=cmd_token)
