"""The probe job's checks on a compute node (inside the spec's container when it names one). Stdlib only.

`hpc-serve doctor --probe` carries this file and `launcher/server.py` in its job script, unpacks them into a
node-local folder (mounted into the container at the same path) and runs `python node.py RESULTS [--server S] [--gpus N] [--trtllm VERSION]` in the job, the way a rank runs:
through the same srun flags and container wrapper. tritonserver is found by `launcher.server.resolve`, the one
place that decides which binary a rank starts, so what passes here is what the job will run.

It writes RESULTS (JSON, one entry per check: ok, detail) and exits with a bit per failed check (2:
tritonserver, 4: GPUs, 8: TensorRT-LLM), so the login node learns the verdict from the job's exit code even
when it cannot read RESULTS (a workdir that is not shared).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

BITS = {"tritonserver": 2, "gpus": 4, "tensorrt_llm": 8}


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def check_server(configured: str | None) -> dict:
    """Resolve tritonserver as the launcher does and run `--help` (it prints its usage, exit code 1 or 0)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "python"))
    from launcher.server import ServerNotFound, merge_env, resolve

    try:
        server = resolve(configured)
    except ServerNotFound as exc:
        return {"ok": False, "detail": str(exc).replace("\n", " ")}
    env = merge_env(os.environ, server.env)
    try:
        proc = subprocess.run(
            [server.argv0, "--help"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "detail": f"{server.argv0} ({server.source}): {exc}"}
    output = proc.stdout + proc.stderr
    if "Usage: tritonserver" in output or "--model-repository" in output:
        return {"ok": True, "detail": f"{server.argv0} ({server.source}) starts"}
    return {"ok": False, "detail": f"{server.argv0} ({server.source}) exit {proc.returncode}: {_tail(output)}"}


def check_gpus(wanted: int) -> dict:
    """`nvidia-smi -L` lists at least `wanted` GPUs (what the job's allocation makes visible)."""
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "detail": f"nvidia-smi -L: {exc}"}
    gpus = [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    seen = f"{len(gpus)} GPU(s) visible" + (f" ({_tail(proc.stderr, 1)})" if proc.returncode else "")
    return {"ok": len(gpus) >= wanted, "detail": f"{seen}, {wanted} asked for", "count": len(gpus)}


def check_trtllm(expected: str) -> dict:
    """The installed tensorrt_llm (its package metadata: importing it takes seconds and a GPU) against the
    version the engine was built with."""
    try:
        found = importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        return {"ok": False, "detail": f"tensorrt_llm is not installed for {sys.executable}", "version": None}
    same = found == expected
    detail = f"tensorrt_llm {found}" + (" = the engine's" if same else f", the engine was built with {expected}")
    return {"ok": same, "detail": detail, "version": found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results")
    parser.add_argument("--server", default=None)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--trtllm", default=None, help="the engine's TensorRT-LLM version: check the installed one")
    args = parser.parse_args(argv)
    results: dict = {
        "host": socket.gethostname(),
        "node": os.environ.get("SLURMD_NODENAME", ""),
        "python": sys.executable,
        "tritonserver": check_server(args.server),
    }
    if args.gpus:
        results["gpus"] = check_gpus(args.gpus)
    if args.trtllm:
        results["tensorrt_llm"] = check_trtllm(args.trtllm)
    rc = sum(bit for name, bit in BITS.items() if name in results and not results[name]["ok"])
    try:
        Path(args.results).write_text(json.dumps(results, indent=1) + "\n")
    except OSError as exc:
        print(f"hpc-serve doctor: cannot write {args.results}: {exc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
