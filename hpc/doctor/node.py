"""The probe job's checks on a compute node (inside the spec's container when it names one). Stdlib only.

`hpc-serve doctor --probe` carries this file and hpc-serve's rank-side code (`launcher/`, `backend/`: what
render ships into `D/python`) in its job script, unpacks them into a node-local folder (mounted into the
container at the same path) and runs `python node.py RESULTS [--server S] [--gpus N] [--trtllm VERSION]
[--import MODULE]... [--model-import KIND LABEL TARGET]...` in the job, the way a rank runs: through the same srun flags and container wrapper, with
the python that runs the ranks. That python must import the rank-side code (the launcher, and the python models
tritonserver's stub loads), so its version and those imports are checked first. tritonserver is found by
`launcher.node.server.resolve`, the one place that decides which binary a rank starts, so what passes here is what
the job will run.

On the llmapi workflow with TensorRT-LLM it also imports what tritonserver's stub imports when it loads the
`tensorrt_llm` model (`--model-import`): tensorrt_llm, the leader (and worker) node's module, the image's model.py
with its helpers.py, and hpc-serve's own model, each with every module its file names. Each import runs in a
child process of its own, all at once, bounded by IMPORT_TIMEOUT_S: importing tensorrt_llm takes seconds and
touches CUDA and MPI, and one that hangs or crashes must not take the probe down with it.

It writes RESULTS (JSON, one entry per check: ok, detail) and exits with a bit per failed check (2:
tritonserver, 4: GPUs, 8: TensorRT-LLM, its version or an import, 32: python, 64: the llmapi model files, 128: the
checkpoint), so the login node learns the verdict from the job's exit code even when it cannot read RESULTS (a
workdir that is not shared). It runs on Pythons older than the one the
rank-side code needs (3.7 and newer), so that a container's old python3 is reported by its version rather
than by a traceback.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

#: where the bundle's rank-side packages are unpacked, beside this file
PYTHON_DIR = Path(__file__).resolve().parent / "python"
if __name__ == "__main__":  # run from the probe's bundle: its launcher/ and backend/ first, what the ranks import
    sys.path.insert(0, str(PYTHON_DIR))

from launcher.contracts.trtllm_versions import (  # noqa: E402 - stdlib only, Python 3.7-clean
    WORKFLOW_RELEASES,
)

#: the exit bit of each check; `imports` shares TensorRT-LLM's (all 8 bits are taken): RESULTS tells them apart
BITS = {
    "tritonserver": 2,
    "gpus": 4,
    "tensorrt_llm": 8,
    "imports": 8,
    "python": 32,
    "llmapi_files": 64,
    "checkpoint": 128,
}
#: what tells the llmapi model.py's generations apart: the newer one deletes the MPI job's
#: variables at import (every stub an MPI singleton), the older one serves multi-rank by MPICommExecutor
NEW_MODEL_MARK, OLD_MODEL_MARK = "gpu_device_ids", "MPICommExecutor"
#: the oldest Python the rank-side code runs on: pyproject.toml's requires-python (a test keeps them equal)
NEEDED = (3, 10)
#: how long one import may take in its child process before it counts as hung: importing tensorrt_llm loads
#: torch, CUDA and MPI (seconds warm, tens of seconds from a cold file system); the probe job's time allows it
IMPORT_TIMEOUT_S = 90.0
#: what the import children do (`--model-import KIND LABEL TARGET`): import a module and the names after its `:`
#: (`tensorrt_llm:LLM,SamplingParams`); load a folder's model.py as the stub does, then every module it and its
#: helpers.py name; import a module, then every module its file names (imports inside functions included)
IMPORT_KINDS = ("module", "file", "source")
#: the python backend's module, which exists only inside the stub: its imports get a stand-in
PB_UTILS = "triton_python_backend_utils"
#: the traceback lines an import failure reports
TRACEBACK_LINES = 6


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


def workflows_of(version: str) -> list[str]:
    """The TensorRT-LLM workflows a version serves: the engine path until LAST_ENGINE, llmapi from FIRST_LLMAPI."""
    return [w for w, releases in WORKFLOW_RELEASES.items() if releases.serves(version)]


def check_trtllm_workflow(workflow: str) -> dict:
    """The installed tensorrt_llm (package metadata, as `check_trtllm`) has the spec's workflow: the engine path
    until LAST_ENGINE, the LLM API model from FIRST_LLMAPI."""
    import importlib.metadata

    try:
        found = importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        return {"ok": False, "detail": f"tensorrt_llm is not installed for {sys.executable}", "version": None}
    releases = WORKFLOW_RELEASES.get(workflow, WORKFLOW_RELEASES["llmapi"])
    ok = releases.serves(found)
    has = releases.has if ok else releases.has_not
    return {"ok": ok, "detail": f"tensorrt_llm {found} {has}", "version": found}


def check_llmapi_files(folder: str) -> dict:
    """The image's llmapi model files (model.py, helpers.py) are where the spec says (`model.model_files_from`),
    and which generation model.py is (NEW_MODEL_MARK)."""
    missing = [name for name in ("model.py", "helpers.py") if not os.access(os.path.join(folder, name), os.R_OK)]
    if missing:
        return {"ok": False, "detail": f"{folder} has no readable {' or '.join(missing)}"}
    try:
        with open(os.path.join(folder, "model.py"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        return {"ok": False, "detail": f"{folder}/model.py: {exc}"}
    if NEW_MODEL_MARK in text:
        generation = "the 2026 model.py (MPI job variables dropped at import, multi-instance)"
    elif OLD_MODEL_MARK in text:
        generation = "the 1.0-1.2 model.py (multi-rank through MPICommExecutor)"
    else:
        generation = "a model.py of no known generation"
    return {"ok": True, "detail": f"{folder}: model.py and helpers.py, {generation}", "generation": generation}


def check_pmix(mpi: str) -> dict:
    """The step runs under PMIx when the spec's srun --mpi asks for it (the ranks' MPI, mpi4py and TensorRT-LLM's
    workers, initialise through it), and the GDS the ranks will use: the launcher sets PMIX_MCA_gds=hash for
    every process it starts (launch.json `env`; NVIDIA's triton_task.sh calls it required:
    tensorrtllm_backend#553), whatever the site's environment says."""
    gds = os.environ.get("PMIX_MCA_gds")
    site = f"the step's PMIX_MCA_gds is {gds}" if gds else "the step sets no PMIX_MCA_gds"
    detail = f"{site}; the ranks run with hash (launch.json env)"
    if not mpi.startswith("pmix"):
        return {"ok": True, "skip": True, "detail": f"srun --mpi={mpi}: not PMIx; {detail}"}
    if not (os.environ.get("PMIX_RANK") or os.environ.get("PMIX_NAMESPACE")):
        return {"ok": False, "detail": f"srun --mpi={mpi} started this step without PMIx (no PMIX_RANK); {detail}"}
    return {"ok": True, "detail": f"PMIx namespace {os.environ.get('PMIX_NAMESPACE', '?')}; {detail}"}


def check_checkpoint(folder: str) -> dict:
    """The Hugging Face checkpoint folder is readable here: its config.json, and its weight files listed."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            json.load(f)
        names = os.listdir(folder)
    except (OSError, ValueError) as exc:
        return {"ok": False, "detail": f"{folder}: {type(exc).__name__}: {exc}"}
    weights = [n for n in names if n.endswith((".safetensors", ".bin"))]
    if not weights:
        return {"ok": False, "detail": f"{folder}: config.json but no *.safetensors or *.bin weights"}
    return {"ok": True, "detail": f"{folder}: config.json and {len(weights)} weight file(s) readable"}


class _Anything:
    """What the stand-in `triton_python_backend_utils` gives for any name: callable, with any attribute."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Anything:
        return _Anything()

    def __getattr__(self, name: str) -> _Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _StandIn(types.ModuleType):
    """A module whose every name is `_Anything`: the python backend's utilities, which exist only inside the
    stub (a model file uses them in its functions, not at import)."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(node: ast.Try) -> bool:
    names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(k is None or (isinstance(k, ast.Name) and k.id in names) for k in kinds):
            return True
    return False


def named_imports(path: str) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of every absolute import in the file at `path`, at any depth (a model imports
    tensorrt_llm in initialize()), in order; not those under `if TYPE_CHECKING:` (never run) or in a `try:` that
    catches ImportError (optional by design)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    found: list[tuple[str, tuple[str, ...]]] = []

    def visit(node: ast.AST) -> None:
        children: list[ast.AST]
        if isinstance(node, ast.Import):
            found.extend((alias.name, ()) for alias in node.names)
            return
        if isinstance(node, ast.ImportFrom):
            if not node.level and node.module and node.module != "__future__":
                found.append((node.module, tuple(alias.name for alias in node.names if alias.name != "*")))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            children = list(node.orelse)
        elif isinstance(node, ast.Try) and _catches_import_error(node):
            children = [*node.handlers, *node.orelse, *node.finalbody]
        else:
            children = list(ast.iter_child_nodes(node))
        for child in children:
            visit(child)

    visit(tree)
    return found


def import_names(module: str, names: tuple[str, ...] = ()) -> None:
    """`from module import names` as Python does it: a name the module lacks may be a submodule, and one that
    is neither is `ImportError: cannot import name ...` (a lazy module's own errors pass through)."""
    imported = importlib.import_module(module)
    for name in names:
        try:
            getattr(imported, name)
        except AttributeError:
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                where = getattr(imported, "__file__", None) or "unknown location"
                raise ImportError(f"cannot import name {name!r} from {module!r} ({where})") from None


def _import_file_imports(path: str, skip: tuple[str, ...] = ()) -> None:
    for module, names in named_imports(path):
        if module not in skip:
            import_names(module, names)


def _import_model_folder(folder: str) -> None:
    """The image's model.py as tritonserver's stub loads it: its folder on sys.path (so `from helpers import`
    works), `triton_python_backend_utils` a stand-in, model.py run as a module; then every module model.py and
    helpers.py name anywhere (the newer model.py imports tensorrt_llm in initialize())."""
    sys.path.insert(0, folder)
    sys.modules.setdefault(PB_UTILS, _StandIn(PB_UTILS))
    import importlib.util

    spec = importlib.util.spec_from_file_location("model", os.path.join(folder, "model.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {folder}/model.py")
    model = importlib.util.module_from_spec(spec)
    sys.modules["model"] = model
    spec.loader.exec_module(model)
    for name in ("model.py", "helpers.py"):
        if os.path.exists(os.path.join(folder, name)):
            _import_file_imports(os.path.join(folder, name), skip=(PB_UTILS, "helpers", "model"))


def _import_with_file_imports(module: str) -> None:
    """`module`, then every module its file names anywhere (hpc-serve's model imports tensorrt_llm, numpy and
    yaml inside its functions: backend/ imports no tensorrt_llm at import time)."""
    sys.modules.setdefault(PB_UTILS, _StandIn(PB_UTILS))
    imported = importlib.import_module(module)
    path = getattr(imported, "__file__", None)
    if path and path.endswith(".py"):
        _import_file_imports(path, skip=(PB_UTILS,))


def import_child(kind: str, target: str, out: str) -> int:
    """In a child process: do one import of IMPORT_KINDS and write what happened to `out` (JSON: ok, seconds;
    on failure the exception's type, message and last traceback lines)."""
    start = time.monotonic()
    result: dict = {"ok": True}
    try:
        if kind == "module":
            module, _, names = target.partition(":")
            import_names(module, tuple(n for n in names.split(",") if n))
        elif kind == "file":
            _import_model_folder(target)
        else:
            _import_with_file_imports(target)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: it is reported
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        kept = (line.rstrip() for chunk in lines for line in chunk.splitlines())
        tail = [line for line in kept if line.strip(" ^~") and "<frozen " not in line][:-1]  # the last: type, message
        result = {"ok": False, "type": type(exc).__name__, "message": str(exc), "traceback": tail[-TRACEBACK_LINES:]}
    result["seconds"] = round(time.monotonic() - start, 1)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


def _child_env() -> dict[str, str]:
    """tritonserver's environment on the llmapi workflow: without the MPI job's variables (a second process of
    the probe's MPI rank must not join its job); the bundle first on PYTHONPATH, as on a rank."""
    try:
        from launcher.contracts.llmapi import without_mpi

        env = without_mpi(os.environ)
    except Exception:  # noqa: BLE001 - a python too old for the launcher: the python check says why
        env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYTHON_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def check_imports(targets: list[tuple[str, str, str]], timeout_s: float = IMPORT_TIMEOUT_S) -> dict:
    """Run each (kind, label, target) import in a child process of its own, all at once, each bounded by
    `timeout_s` (then its process group is killed): one that hangs or crashes is reported, and the others
    still are. ok when every one imported."""
    if sys.version_info < NEEDED:
        return {"ok": False, "skip": True, "detail": f"not checked: Python {_version()} is too old (see python)"}
    folder = tempfile.mkdtemp(prefix="hpc-serve-imports-")
    env = _child_env()
    running = []
    for i, (kind, label, target) in enumerate(targets):
        out = os.path.join(folder, f"{i}.json")
        argv = [sys.executable, os.path.abspath(__file__), "--import-child", kind, target, out]
        log = open(os.path.join(folder, f"{i}.log"), "w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        running.append((kind, label, target, out, log, proc))
    deadline = time.monotonic() + timeout_s
    imports = []
    for kind, label, target, out, log, proc in running:
        entry: dict = {"label": label, "kind": kind, "target": target}
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            entry.update(ok=False, type="Timeout", message=f"still importing after {timeout_s:g} s; killed")
        log.seek(0)
        output = log.read()
        log.close()
        try:
            with open(out, encoding="utf-8") as f:
                entry.update(json.load(f))
        except (OSError, ValueError):
            if "type" not in entry:  # no result and no timeout: the child died (a signal, a crash in C)
                died = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
                entry.update(ok=False, type="Crash", message=f"the importing process ended by {died}")
            entry["traceback"] = [line for line in output.splitlines() if line.strip()][-TRACEBACK_LINES:]
        imports.append(entry)
    failed = [e for e in imports if not e["ok"]]
    if failed:
        detail = "; ".join(f"{e['label']}: {e['type']}: {e['message']}" for e in failed)
    else:
        detail = ", ".join(f"{e['label']} ({e.get('seconds', '?')} s)" for e in imports) + " import"
    return {"ok": not failed, "detail": detail, "imports": imports}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results")
    parser.add_argument("--server", default=None)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--trtllm", default=None, help="the engine's TensorRT-LLM version: check the installed one")
    parser.add_argument("--import", dest="modules", action="append", default=[], help="a python model's module")
    parser.add_argument("--workflow", default=None, help="the spec's TensorRT-LLM workflow: check the installed one")
    parser.add_argument("--llmapi-files", default=None, help="where the image keeps the llmapi model.py")
    parser.add_argument("--checkpoint", default=None, help="the Hugging Face checkpoint folder the ranks read")
    parser.add_argument("--mpi", default=None, help="the spec's srun --mpi: check the step runs under it")
    parser.add_argument("--python-label", default="python", help="how the report names this python")
    parser.add_argument(
        "--model-import",
        dest="model_imports",
        nargs=3,
        action="append",
        default=[],
        metavar=("KIND", "LABEL", "TARGET"),
        help=f"import in a child process, as the model's stub would; KIND: {', '.join(IMPORT_KINDS)}",
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--import-child"]:  # one import of check_imports, in its own process
        return import_child(*argv[1:4])
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
    elif args.workflow:
        results["tensorrt_llm"] = check_trtllm_workflow(args.workflow)
    if args.llmapi_files:
        results["llmapi_files"] = check_llmapi_files(args.llmapi_files)
    if args.checkpoint:
        results["checkpoint"] = check_checkpoint(args.checkpoint)
    if args.mpi:
        results["pmix"] = check_pmix(args.mpi)  # no exit bit (all 8 are taken): read from RESULTS only
    if args.model_imports:
        results["imports"] = check_imports([tuple(t) for t in args.model_imports])
    failed = [name for name in BITS if name in results and not (results[name]["ok"] or results[name].get("skip"))]
    rc = 0
    for name in failed:
        rc |= BITS[name]  # a bit two checks share counts once
    try:
        Path(args.results).write_text(json.dumps(results, indent=1) + "\n")
    except OSError as exc:
        print(f"hpc-serve doctor: cannot write {args.results}: {exc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
