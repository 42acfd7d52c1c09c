"""The rank-side code under Python 3.10, as a container's python3 runs it.

Ranks run the container's python3: the launcher, and the python models inside tritonserver's stub. NGC's
tritonserver images are Ubuntu 22.04 with Python 3.10, and pyproject.toml claims `requires-python >= 3.10`,
so one name new in 3.11 (`typing.Self` in launcher/contracts/records.py, once) kills every rank at import. mypy at
3.10 (scripts/test.sh) catches the names typeshed knows; these tests run the code itself, exactly as render
ships it into `D/python`: every module of launcher/ and backend/ compiled and imported, and the launcher's
own command line run, by a real 3.10 interpreter. Skipped, saying where it looked, when there is none.

That interpreter has no numpy (nor tokenizers, mpi4py, triton_python_backend_utils: imported lazily, inside
the functions that need them). Where numpy is missing a stand-in object takes its place, so that what is
checked is each module's own top level under 3.10 (its imports of the standard library and of our modules,
its syntax, its module-level code); the stand-in is named in the output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.render.jobfiles import ship_packages
from launcher.contracts.layout import SHIPPED_PACKAGES
from launcher.contracts.rank import JOB_ID_ENV
from tests._pythons import find_python, where_looked

PYTHON310 = find_python(3, 10)
pytestmark = pytest.mark.skipif(PYTHON310 is None, reason=where_looked(3, 10))

#: run by 3.10 with the shipped folder as argv[1]: import every module under it, print what failed (JSON)
IMPORT_ALL = r"""
import importlib, importlib.util, json, sys, traceback
from pathlib import Path
from unittest import mock

root = Path(sys.argv[1])
sys.path.insert(0, str(root))
stood_in = [name for name in ("numpy",) if importlib.util.find_spec(name) is None]
for name in stood_in:
    sys.modules[name] = mock.MagicMock(name=name)
modules, failed = [], {}
for path in sorted(root.rglob("*.py")):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    name = ".".join(parts)
    modules.append(name)
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps({"version": list(sys.version_info[:3]), "stood_in": stood_in, "modules": modules, "failed": failed}))
"""


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """launcher/ and backend/ as render ships them into a deployment's `python/` folder."""
    folder = tmp_path_factory.mktemp("python310") / "python"
    ship_packages(folder)
    return folder


def _run310(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    assert PYTHON310 is not None
    # -I: none of this environment's site-packages or PYTHONPATH (what a container's python3 would not have)
    base = {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [PYTHON310, *args], capture_output=True, text=True, timeout=120, env={**base, **(env or {})}, cwd=cwd
    )


def _sources(folder: Path) -> list[Path]:
    return sorted(p for package in SHIPPED_PACKAGES for p in (folder / package).rglob("*.py"))


@pytest.mark.slow
def test_every_rank_side_file_compiles_under_310(shipped: Path) -> None:
    """py_compile: 3.10's grammar (no `except*`, no 3.12 f-strings) over every file, imported or not."""
    proc = _run310("-m", "py_compile", *map(str, _sources(shipped)))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_every_rank_side_module_imports_under_310(shipped: Path) -> None:
    """Every module of launcher/ and backend/, imported by 3.10: a `from typing import Self` (3.11), a
    `datetime.UTC`, a `tomllib` anywhere in them fails here with the module and its traceback."""
    proc = _run310("-I", "-c", IMPORT_ALL, str(shipped))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["version"][:2] == [3, 10]
    assert not found["failed"], "\n".join(f"{name}:\n{tb}" for name, tb in found["failed"].items())
    expected = {
        ".".join(p.relative_to(shipped).with_suffix("").parts).removesuffix(".__init__") for p in _sources(shipped)
    }
    assert set(found["modules"]) == expected  # every module was tried, none skipped
    assert {"launcher.contracts.records", "launcher.node.run", "backend.models.preprocessing"} <= expected
    assert set(found["stood_in"]) <= {"numpy"}


def _plan(folder: Path) -> Path:
    """A follower rank's plan (tests/test_launcher.py's dry run), with a tritonserver that is only a file."""
    exe = folder / "tritonserver"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    plan = {"version": 1, "model_repository": "repo", "tp_size": 2, "replicas": 1, "world_size_per_replica": 2,
            "tritonserver": str(exe), "follower_models": ["tensorrt_llm"], "server_args": ["--log-verbose=1"]}  # fmt: skip
    (folder / "launch.json").write_text(json.dumps(plan))
    return folder


@pytest.mark.slow
def test_the_launcher_runs_under_310(shipped: Path, tmp_path: Path) -> None:
    """`python -m launcher` as the per-rank script runs it (PYTHONPATH = the shipped folder): its usage, and a
    dry run of a rank's plan that prints the same tritonserver command as this interpreter's."""
    env = {"PYTHONPATH": str(shipped)}
    usage = _run310("-m", "launcher", "--help", env=env, cwd=tmp_path)
    assert usage.returncode == 0 and "--dry-run" in usage.stdout, usage.stderr
    deployment = _plan(tmp_path)
    rank = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", JOB_ID_ENV: "local-3"}
    dry = _run310("-m", "launcher", str(deployment), "--dry-run", env={**env, **rank}, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    here = subprocess.run(
        [sys.executable, "-m", "launcher", str(deployment), "--dry-run"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(shipped), **rank},
    )  # fmt: skip
    assert dry.stdout == here.stdout and "--load-model=tensorrt_llm" in dry.stdout, here.stderr
