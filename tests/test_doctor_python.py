"""`hpc-serve doctor --probe`'s check of the python that runs the ranks (the container's python3): its version
against what the rank-side code needs, and its imports of that code, from the bundle the probe script carries.
node.py is run here by other interpreters (3.7, 3.8: too old, 3.10: the oldest supported) where this machine
has them (tests/_pythons.py), and the verdicts are read as the login node reads them."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from hpc.doctor.probe import node_bundle
from hpc.doctor.verdicts import ProbeJob, verdicts
from hpc.spec import Spec
from launcher.contracts.layout import SOURCE_ROOT
from tests._pythons import find_python, where_looked


def spec(tmp_path: Path, **extra) -> Spec:
    data = {
        "name": "t",
        "workdir": str(tmp_path / "work"),
        "model": {"backend": "cpu", "workflow": "engine", "checkpoint_dir": "."},
    }
    return Spec.model_validate({**data, **extra})


def test_verdicts_of_the_python_that_runs_the_ranks(tmp_path):
    """Too old: the version is named and the fix is a newer image; tritonserver is then not checked (a skip,
    not a second failure). New enough but an import fails: the fix names what it lacks. From the exit code
    alone: both fixes."""
    s = spec(tmp_path, container={"type": "pyxis", "image": "nvcr.io#nvidia/tritonserver:21.08-py3"})
    old = {
        "ok": False,
        "version": "3.8.10",
        "detail": "python3 in the container is 3.8.10 (/usr/bin/python3); hpc-serve's rank-side code needs >= 3.10",
    }
    server = {"ok": False, "skip": True, "detail": "not checked: Python 3.8.10 cannot import launcher.node.server"}
    job = ProbeJob("11", state="FAILED", exit_code=32, node="n1", saw_node_file=True,
                   results={"node": "n1", "python": old, "tritonserver": server})  # fmt: skip
    checks = {c.name: c for c in verdicts(s, job, tmp_path)}
    assert checks["python"].status == "fail" and "python3 in the container is 3.8.10" in checks["python"].detail
    assert "needs >= 3.10" in checks["python"].detail
    assert checks["python"].fix.startswith("use an image whose python3 is Python 3.10 or newer")
    assert checks["tritonserver"].status == "skip"
    no_numpy = {
        "ok": False,
        "version": "3.10.12",
        "detail": "python3 in the container (3.10.12) cannot import backend.models.bls: ModuleNotFoundError: No "
        "module named 'numpy'",
    }
    job.results["python"] = no_numpy
    fix = {c.name: c for c in verdicts(s, job, tmp_path)}["python"].fix
    assert fix == "use an image whose python3 has what the error names (numpy for the python models)"
    blind = ProbeJob("12", state="FAILED", exit_code=32, node="n1", saw_node_file=True)
    python = {c.name: c for c in verdicts(s, blind, tmp_path)}["python"]
    assert python.status == "fail" and "not readable here" in python.detail
    assert "Python 3.10 or newer" in python.fix and "numpy" in python.fix


def test_node_needs_what_pyproject_requires():
    """node.py cannot read pyproject.toml on a node: its NEEDED is requires-python, kept equal here."""
    from hpc.doctor import node

    text = (SOURCE_ROOT / "pyproject.toml").read_text()
    (requires,) = re.findall(r'^requires-python = ">=(\d+)\.(\d+)"$', text, re.M)
    assert node.NEEDED == tuple(map(int, requires))


def _unpacked_bundle(folder: Path) -> Path:
    """The probe's bundle, unpacked as the job script does on the node."""
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(node_bundle()))) as tar:
        tar.extractall(folder, filter="data")
    return folder / "node.py"


@pytest.mark.slow
@pytest.mark.parametrize("minor", [7, 8])
def test_node_names_an_old_python_by_its_version(tmp_path, minor):
    """node.py under a python older than the rank-side code needs (an older image's python3): it runs, and its
    verdict names the version (bit 32), rather than a traceback that ends the step."""
    python = find_python(3, minor)
    if python is None:
        pytest.skip(where_looked(3, minor))
    node_py = _unpacked_bundle(tmp_path / "local")
    results = tmp_path / "node.json"
    args = [str(results), "--python-label", "python3 in the container", "--import", "backend.models.bls"]
    proc = subprocess.run([python, "-I", str(node_py), *args], capture_output=True, text=True, timeout=120)
    found = json.loads(results.read_text())
    assert proc.returncode & 32 and not proc.returncode & ~(32 | 2), proc.stderr
    assert found["python"] == {
        "ok": False,
        "version": found["python"]["version"],
        "detail": f"python3 in the container is {found['python']['version']} ({python}); hpc-serve's rank-side "
        "code needs >= 3.10",
    }
    assert found["python"]["version"].startswith(f"3.{minor}.")


@pytest.mark.slow
def test_node_under_310_imports_the_launcher_and_names_a_missing_package(tmp_path):
    """3.10 (NGC's images): the whole launcher imports from the bundle; a python model's module that needs a
    package this interpreter lacks (numpy, here) is named."""
    python = find_python(3, 10)
    if python is None:
        pytest.skip(where_looked(3, 10))
    node_py = _unpacked_bundle(tmp_path / "local")
    results = tmp_path / "node.json"
    launcher_only = subprocess.run([python, "-I", str(node_py), str(results)], capture_output=True, text=True)
    found = json.loads(results.read_text())["python"]
    assert found["ok"] and found["version"].startswith("3.10."), (found, launcher_only.stderr)
    assert not launcher_only.returncode & 32
    has_numpy = subprocess.run([python, "-I", "-c", "import numpy"], capture_output=True).returncode == 0
    with_model = subprocess.run(
        [python, "-I", str(node_py), str(results), "--import", "backend.models.bls"], capture_output=True, text=True
    )
    found = json.loads(results.read_text())["python"]
    if has_numpy:
        assert found["ok"], found
    else:
        assert with_model.returncode & 32
        assert "cannot import backend.models.bls: ModuleNotFoundError: No module named 'numpy'" in found["detail"]
