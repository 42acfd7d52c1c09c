"""The probe job's checks on a compute node (inside the spec's container when it names one). Stdlib only.

`hpc-serve doctor --probe` carries this file and hpc-serve's rank-side code (`launcher/`, `backend/`: what
render ships into `D/python`) in its job script, unpacks them into a node-local folder (mounted into the
container at the same path) and runs `python node.py RESULTS [--server S] [--gpus N] [--trtllm VERSION]
[--import MODULE]...` in the job, the way a rank runs: through the same srun flags and container wrapper, with
the python that runs the ranks. That python must import the rank-side code (the launcher, and the python models
tritonserver's stub loads), so its version and those imports are checked first. tritonserver is found by
`launcher.node.server.resolve`, the one place that decides which binary a rank starts, so what passes here is what
the job will run.

It writes RESULTS (JSON, one entry per check: ok, detail) and exits with a bit per failed check (2:
tritonserver, 4: GPUs, 8: TensorRT-LLM, 32: python), so the login node learns the verdict from the job's exit
code even when it cannot read RESULTS (a workdir that is not shared). It runs on Pythons older than the one the
rank-side code needs (3.7 and newer), so that a container's old python3 is reported by its version rather
than by a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

BITS = {"tritonserver": 2, "gpus": 4, "tensorrt_llm": 8, "python": 32}
#: the oldest Python the rank-side code runs on: pyproject.toml's requires-python (a test keeps them equal)
NEEDED = (3, 10)
#: where the bundle's rank-side packages are unpacked, beside this file
PYTHON_DIR = Path(__file__).resolve().parent / "python"


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _version() -> str:
    return ".".join(str(part) for part in sys.version_info[:3])


def rank_modules(extra: list[str]) -> list[str]:
    """Every module of the bundle's `launcher/` (a rank runs the package whole), then `extra`: the python
    models' modules the probe names (those tritonserver's stub imports when it starts)."""
    names = sorted(p.stem for p in (PYTHON_DIR / "launcher").glob("*.py") if p.stem != "__init__")
    return ["launcher", *(f"launcher.{name}" for name in names), *extra]


def check_python(label: str, modules: list[str]) -> dict:
    """This python (the one that runs the launcher on every rank, and whose libpython tritonserver's python
    stubs load) is NEEDED or newer, and imports `modules` from the bundle: a version check alone would miss
    a package the models import (numpy) that the image lacks."""
    version = _version()
    needed = ".".join(map(str, NEEDED))
    if sys.version_info < NEEDED:
        where = "" if sys.executable in label else f" ({sys.executable})"
        detail = f"{label} is {version}{where}; hpc-serve's rank-side code needs >= {needed}"
        return {"ok": False, "detail": detail, "version": version}
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - SyntaxError, ImportError, whatever its top level raises
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    if failed:
        more = f" (and {len(failed) - 2} more)" if len(failed) > 2 else ""
        detail = f"{label} ({version}) cannot import {'; '.join(failed[:2])}{more}"
        return {"ok": False, "detail": detail, "version": version}
    return {
        "ok": True,
        "detail": f"{label} is {version}, imports the {len(modules)} rank-side modules",
        "version": version,
    }


def check_server(configured: str | None) -> dict:
    """Resolve tritonserver as the launcher does and run `--help` (it prints its usage, exit code 1 or 0).
    Not checked (`skip`) when this python cannot import the launcher: the python check says why."""
    try:
        from launcher.node.server import ServerNotFound, merge_env, resolve
    except Exception as exc:  # noqa: BLE001 - a python too old for the launcher's code
        detail = f"not checked: Python {_version()} cannot import launcher.node.server ({type(exc).__name__})"
        return {"ok": False, "skip": True, "detail": detail}
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
    import importlib.metadata  # 3.8: imported here, so that an older python still reports its version

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
    parser.add_argument("--import", dest="modules", action="append", default=[], help="a python model's module")
    parser.add_argument("--python-label", default="python", help="how the report names this python")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(PYTHON_DIR))  # the bundle's launcher/ and backend/, first: what the ranks import
    results: dict = {
        "host": socket.gethostname(),
        "node": os.environ.get("SLURMD_NODENAME", ""),
        "executable": sys.executable,
        "python": check_python(args.python_label, rank_modules(args.modules)),
        "tritonserver": check_server(args.server),
    }
    if args.gpus:
        results["gpus"] = check_gpus(args.gpus)
    if args.trtllm:
        results["tensorrt_llm"] = check_trtllm(args.trtllm)
    failed = [name for name in BITS if name in results and not (results[name]["ok"] or results[name].get("skip"))]
    rc = sum(BITS[name] for name in failed)
    try:
        Path(args.results).write_text(json.dumps(results, indent=1) + "\n")
    except OSError as exc:
        print(f"hpc-serve doctor: cannot write {args.results}: {exc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
