"""`hpc-serve bench TARGET` and `hpc-serve metrics TARGET [--watch S]`: size a deployment by measuring it.

Why a module of its own, registered by hpc/cli/main.py through `add_commands`: these commands import the load
generator, rich's live display and (for `--output-dir`) matplotlib, none of which `--help` should pay for.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpc.cli.support import (
    EXIT_JOB_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    add_target,
    bounded,
    err,
    resolve_or_exit,
    sampling_flag,
)

if TYPE_CHECKING:
    from launcher.contracts.records import EndpointRecord


def _sweep(text: str) -> tuple[str, tuple[float, ...]]:
    """`rate=1,2,4` or `concurrency=1,8,32`."""
    kind, _, values = text.partition("=")
    if kind not in ("rate", "concurrency") or not values:
        raise argparse.ArgumentTypeError(f"{text!r}: write rate=1,2,4 (requests/s) or concurrency=1,8,32")
    try:
        numbers = tuple(float(v) for v in values.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the values must be numbers, comma-separated") from None
    if any(not n > 0 for n in numbers):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be more than 0")
    return kind, numbers


def cmd_bench(args: argparse.Namespace) -> int:
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hpc.bench.report import summary_table
    from hpc.bench.run import BenchSettings, bench
    from hpc.bench.workloads import WorkloadSpec
    from hpc.client import ClientError
    from hpc.spec import SpecError

    if args.num_requests is None and args.duration is None:
        args.num_requests = 100
    try:
        workload = WorkloadSpec(
            kind=args.workload,
            input_mean=args.input_tokens,
            input_stdev=args.input_stdev,
            output_mean=args.output_tokens,
            output_stdev=args.output_stdev,
            dataset=Path(args.dataset) if args.dataset else None,
            prefix_tokens=args.prefix_tokens,
            num_prefixes=args.num_prefixes,
        )
    except ValueError as exc:
        err(str(exc))
        return EXIT_USAGE
    settings = BenchSettings(
        target=args.target,
        workload=workload,
        num_requests=args.num_requests,
        request_rate=args.request_rate,
        arrivals=args.arrivals,
        concurrency=args.concurrency,
        duration_s=args.duration,
        sweep=args.sweep,
        seed=args.workload_seed,
        slo_ttft_ms=args.slo_ttft,
        slo_itl_ms=args.slo_itl,
        temperature=args.temperature,
        tokenizer=Path(args.tokenizer) if args.tokenizer else None,
        model=args.model,
        token=args.token,
        timeout_s=args.request_timeout,
        warmup=args.warmup,
    )
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    )

    def hook(label: str, total: int | None):
        task = progress.add_task(label, total=total)
        return lambda record: progress.advance(task)

    try:
        with progress:
            points, written, described = bench(
                settings,
                Path(args.output_dir) if args.output_dir else None,
                hook,
                warn=lambda why: console.print(f"hpc-serve: {why}", markup=False),
            )
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_USAGE
    except (ClientError, LookupError) as exc:
        err(str(exc))
        return EXIT_NOT_FOUND
    except PermissionError as exc:  # a gateway URL that asks for a token: the flag that gives it
        err(str(exc))
        return EXIT_USAGE
    except httpx.HTTPError as exc:  # a gateway URL that does not answer (or refuses /v1/models)
        err(f"{args.target}: {type(exc).__name__}: {exc}")
        return EXIT_NOT_FOUND
    except (ValueError, OSError, ImportError) as exc:
        err(str(exc))
        return EXIT_USAGE
    out = Console()
    table = summary_table([(label, summary) for label, summary, _ in points], f"hpc-serve bench {args.target}")
    table.caption = f"workload {args.workload}, seed {args.workload_seed}, tokens counted with {described}"
    out.print(table)
    for path in written:
        out.print(f"wrote {path}")
    return EXIT_OK if all(s["completed"] for _, s, _ in points) else EXIT_JOB_FAILED


def cmd_metrics(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hpc.bench import metrics_view
    from hpc.bench.replica_metrics import take

    if args.autoscale_plot:  # the record, not the replicas: a deployment at zero has none
        return _autoscale_plot(args.target, Path(args.autoscale_plot))
    endpoints = endpoints_or_exit(args.target)
    if args.replica is not None:
        endpoints = [e for e in endpoints if e.replica == args.replica]
    if not endpoints:
        err(f"{' '.join(args.target)}: no ready replica publishes an endpoint; see `hpc-serve status`")
        return EXIT_NOT_FOUND
    gateway_url = _gateway_url(args.target)
    if args.watch is None:
        snapshot = take(endpoints, everything=args.all, gateway_url=gateway_url)
        if args.json:
            import json

            print(json.dumps(snapshot.to_json(), indent=2))
            for replica, why in snapshot.errors.items():
                err(f"replica {replica}: {why}")
        else:
            Console().print(metrics_view.snapshot_table(snapshot))
        return EXIT_OK if snapshot.values else EXIT_JOB_FAILED
    metrics_view.watch(endpoints, args.watch, Console(), args.count, gateway_url)
    return EXIT_OK


def _autoscale_plot(targets: Sequence[str], path: Path) -> int:
    """`metrics TARGET --autoscale-plot PNG`: the controller's record (jobs over time, load, decisions) as a picture
    (hpc/bench/plots.py)."""
    from hpc.bench import plots
    from hpc.jobs.autoscale import autoscale_record

    target, _ = resolve_or_exit(list(targets))
    record = autoscale_record(target) if target is not None else None
    if record is None or not (record.decisions or record.samples):
        err(f"{' '.join(targets)}: no autoscaling decisions recorded (a spec with autoscale: and its gateway job)")
        return EXIT_NOT_FOUND
    try:
        plots.autoscale_timeline(list(record.decisions), path, f"{target.name}: autoscaling", list(record.samples))
    except ImportError as exc:
        err(str(exc))
        return EXIT_USAGE
    print(f"wrote {path}")
    return EXIT_OK


def _gateway_url(targets: Sequence[str]) -> str | None:
    """The URL of the deployment's live gateway, when TARGET names a deployment that has one."""
    from hpc.serving.gateway_record import live_gateway

    target, _ = resolve_or_exit(list(targets))
    record = live_gateway(target) if target is not None else None
    return record.url if record is not None else None


def add_commands(sub: argparse._SubParsersAction) -> None:
    from hpc.bench.workloads import KINDS, WorkloadSpec  # stdlib only: the workload's defaults, written once

    p = sub.add_parser(
        "bench",
        help="load-test a deployment, job or gateway URL: throughput, latency, TTFT, ITL, goodput (docs/bench-and-metrics.md)",
    )
    add_target(p, url=True)
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default=WorkloadSpec.kind, choices=KINDS, help="what the prompts look like")
    w.add_argument(
        "--input-tokens",
        type=int,
        default=WorkloadSpec.input_mean,
        help="mean prompt length in tokens (default %(default)s)",
    )
    w.add_argument(
        "--input-stdev", type=int, default=WorkloadSpec.input_stdev, help="its standard deviation (token-norm-dist)"
    )
    w.add_argument(
        "--output-tokens",
        type=int,
        default=WorkloadSpec.output_mean,
        help="mean max_tokens asked for (default %(default)s)",
    )
    w.add_argument(
        "--output-stdev", type=int, default=WorkloadSpec.output_stdev, help="its standard deviation (token-norm-dist)"
    )
    w.add_argument("--dataset", help="JSONL of prompts (`prompt`, `text` or ShareGPT `conversations`)")
    w.add_argument(
        "--prefix-tokens",
        type=int,
        default=WorkloadSpec.prefix_tokens,
        help="shared-prefix: length of each shared prefix",
    )
    w.add_argument(
        "--num-prefixes", type=int, default=WorkloadSpec.num_prefixes, help="shared-prefix: how many distinct prefixes"
    )
    w.add_argument("--tokenizer", help="the model's tokenizer folder (default: the deployment's model.tokenizer)")
    w.add_argument(
        "--temperature",
        type=sampling_flag("temperature"),
        default=None,
        help="sampling temperature (default: the model's)",
    )
    a = p.add_argument_group("load")
    a.add_argument("--num-requests", type=bounded(int), default=None, help="requests per run (default 100)")
    a.add_argument("--duration", type=bounded(float), default=None, help="stop sending after S seconds")
    a.add_argument(
        "--request-rate", type=bounded(float), default=math.inf, help="requests/s (default inf: all at once)"
    )
    a.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson", help="the gaps between requests")
    a.add_argument("--concurrency", type=bounded(int), default=None, help="at most N requests in flight")
    a.add_argument("--sweep", type=_sweep, default=None, help="rate=1,2,4 or concurrency=1,8,32: one run each")
    a.add_argument(
        "--workload-seed", type=int, default=0, help="the same seed sends the same requests at the same times"
    )
    a.add_argument("--warmup", type=int, default=1, help="requests sent first and not counted (default 1)")
    a.add_argument(
        "--request-timeout", type=bounded(float), default=300.0, help="seconds a request may wait for each piece"
    )
    o = p.add_argument_group("output")
    o.add_argument("--slo-ttft", type=bounded(float), default=None, help="goodput: TTFT at most MS milliseconds")
    o.add_argument("--slo-itl", type=bounded(float), default=None, help="goodput: mean inter-token gap at most MS")
    o.add_argument("--output-dir", help="write summary.json, requests.csv and PNG plots here")
    o.add_argument(
        "--model", help="the model the requests name (default: a gateway URL's first at /v1/models, a replica's own)"
    )
    o.add_argument("--token", help="access token (default: the deployment's; gateway URL: none)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "metrics", help="every replica's nv_trt_llm_* and nv_inference_* metrics, summed; --watch: live rates"
    )
    add_target(p, several=True)
    p.add_argument("--watch", type=bounded(float), default=None, metavar="S", help="refresh a rate table every S s")
    p.add_argument("--count", type=int, default=None, help="with --watch: stop after N refreshes")
    p.add_argument("--replica", type=int, default=None, help="only this replica number")
    p.add_argument("--all", action="store_true", help="every metric family, not only the LLM-serving ones")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    p.add_argument(
        "--autoscale-plot",
        metavar="PNG",
        help="draw the autoscaling controller's record (its jobs over time by phase, its load signal against its "
        "target, each job it submitted, cancelled, drained) to this file, and stop",
    )
    p.set_defaults(func=cmd_metrics)


def endpoints_or_exit(targets: Sequence[str]) -> list[EndpointRecord]:
    """Every published replica of the jobs TARGET names, or of every job of the deployment it names."""
    from hpc.client import job_endpoints
    from hpc.serving.deployment import published

    target, refs = resolve_or_exit(list(targets))
    if refs:
        return [e for ref in refs for e in job_endpoints(ref)]
    return list(published(target))
