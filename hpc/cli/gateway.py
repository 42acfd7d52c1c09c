"""`hpc-serve gateway TARGET` and `hpc-serve token TARGET`.

Why a module apart from hpc/cli/jobs.py: these are the only commands that import the web stack; hpc/cli/main.py
registers them through `add_commands` and imports this module's body (FastAPI, uvicorn) only when one runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hpc.cli.support import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, add_target, err, resolve_or_exit
from hpc.spec.limits import MAX_BODY_MB, MAX_OUTSTANDING, PREFIX_CHARS
from launcher.contracts.config import DISCOVERY_REFRESH_S

DEFAULT_PORT = 9000


def port_arg(text: str) -> int:
    """`--port N`, or `auto`/0 for a free one (the address record says which)."""
    if text == "auto":
        return 0
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number or 'auto'") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535, or 0/auto for a free one)")
    return port


def _count(text: str) -> int:
    """A whole number >= 0 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, 0 or more")
    return value


def _positive(text: str) -> int:
    """A whole number >= 1 (argparse type)."""
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, 1 or more")
    return value


def cmd_gateway(args: argparse.Namespace) -> int:
    import logging

    from hpc.gateway.accesslog import log_to_stderr
    from hpc.gateway.serve import GatewayRunning, run

    target, _ = resolve_or_exit(args.target)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health check otherwise
    log_to_stderr()  # the access log: one bare JSON line per request
    limit = args.max_outstanding or None
    try:
        run(
            target,
            args.host,
            args.port,
            refresh_s=args.refresh,
            job_id=args.job_id,
            max_outstanding=limit,
            prefix_chars=args.prefix_chars,
            renew_from=args.renew_from,
            max_body_mb=args.max_body_mb,
            workers=args.workers,
        )
    except GatewayRunning as exc:
        err(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        err(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; pick another --port (or auto)")
        return EXIT_USAGE
    return EXIT_OK


def cmd_token(args: argparse.Namespace) -> int:
    from hpc.serving.auth import deployment_token
    from hpc.serving.deployment import deployment_folders

    target, _ = resolve_or_exit(args.target)
    folders = deployment_folders(target)
    if not folders:
        err(f"{target.name}: no deployment folder in {target.workdir} yet; submit it first")
        return EXIT_NOT_FOUND
    token = deployment_token(folders)
    if token is None:
        # an answer, not an error: a script that sends `Bearer $(hpc-serve token X)` works on both policies
        err(f"{target.name}: {folders[-1].name} serves with `auth: none`: no token is needed (nor checked)")
        return EXIT_OK
    print(token)
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gateway", help="OpenAI API and Triton passthrough in front of every ready replica of a deployment"
    )
    add_target(p, several=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=port_arg, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; auto: a free one")
    p.add_argument(
        "--refresh", type=float, default=DISCOVERY_REFRESH_S, help="seconds between looks for new or lost replicas"
    )
    p.add_argument(
        "--max-outstanding",
        type=_count,
        default=MAX_OUTSTANDING,
        help=f"requests in flight per replica before the gateway answers 429 (default {MAX_OUTSTANDING}; 0: no bound)",
    )
    p.add_argument(
        "--prefix-chars",
        type=_count,
        default=PREFIX_CHARS,
        help=f"prompt characters that key prefix affinity (default {PREFIX_CHARS}; 0: affinity off)",
    )
    p.add_argument(
        "--max-body-mb",
        type=_count,
        default=MAX_BODY_MB,
        help=f"the largest request body taken, in MiB; a larger one is 413 (default {MAX_BODY_MB}; 0: no bound)",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="processes serving the one port, each with its own event loop (default 1): more when one core "
        "cannot relay what the replicas stream; they share the per-replica counts",
    )
    p.add_argument("--job-id", default="", help=argparse.SUPPRESS)  # set by the gateway's own job script
    # ... and, when the deployment renews, its folder: the job renews itself (hpc/jobs/renewal.py)
    p.add_argument("--renew-from", type=Path, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("token", help="print the deployment's access token (auth: token; a 0600 file in its folders)")
    add_target(p, several=True)
    p.set_defaults(func=cmd_token)
