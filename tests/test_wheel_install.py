"""hpc-serve installed from its wheel (not editable), the way users install it: render and a real job.

What this guards: a ranks' source root taken as ``Path(__file__).parent.parent`` is ``site-packages`` after a
wheel install; put first on every rank's PYTHONPATH and bind-mounted into containers, it would shadow the
container's own numpy and friends. Only hpc-serve's own packages are shipped to the ranks.
The venv sees this machine's other packages through a plain path (not a site dir), so the editable install's
import hook stays out of it, as in submitit's installable_wheel test target.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.e2e import cli, status, wait_for, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A venv with hpc-serve installed from a freshly built wheel; other packages come from this interpreter."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: setuptools leaves build/ and *.egg-info beside what it builds
    for name in ("hpc", "launcher", "backend"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "host-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # a path, not a site dir
    wheel = next((tmp / "dist").glob("hpc_serve-*.whl"))
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return venv


def _venv_cli(venv: Path, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "hpc-serve"), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd="/"
    )


def test_the_wheel_is_what_runs(wheel_venv: Path) -> None:
    where = subprocess.run(
        [
            str(wheel_venv / "bin" / "python"),
            "-c",
            "import hpc, launcher, backend; print(hpc.__file__, launcher.__file__, backend.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.split()
    assert all(str(wheel_venv) in path for path in where), where


def test_a_wheel_install_ships_only_its_own_packages_to_the_ranks(
    wheel_venv, tmp_path, tiny_gpt2, slurm_cluster, tritonserver, hpc_home
) -> None:
    spec = write_spec(tmp_path, "wheel", tiny_gpt2, tp=2, nodes=2, ntasks_per_node=1)
    env = {**os.environ, "HPC_SERVE_HOME": str(hpc_home)}
    proc = _venv_cli(wheel_venv, "submit", str(spec), "--wait", "--timeout", "200", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job, job_dir = proc.stdout.split()[:2]
    deploy = Path(job_dir).parent.parent
    try:
        script = (deploy / "tensorrt_llm_triton.sh").read_text()
        assert "site-packages" not in script, script
        assert "site-packages" not in (deploy / "launch.json").read_text()
        assert {p.name for p in (deploy / "python").iterdir()} == {"launcher", "backend"}
        assert cli("generate", job, "Once upon a time", "--max-tokens", "6").stdout.strip()
        environ = [Path(f"/proc/{pid}/environ") for pid in _pids_mentioning(str(deploy))]
        pythonpaths = {
            e.read_bytes().split(b"PYTHONPATH=")[1].split(b"\0")[0].decode()
            for e in environ
            if e.exists() and b"PYTHONPATH=" in e.read_bytes()
        }
        assert pythonpaths and not any("site-packages" in p for p in pythonpaths), pythonpaths
    finally:
        cli("cancel", job, check=False, timeout=120)
    wait_for(lambda: status(job).get("state") in ("CANCELLED", "COMPLETED"), 60, "the job to end")


def _pids_mentioning(path: str) -> list[int]:
    from hpc.jobs.local import processes_mentioning

    return [pid for pid, _ in processes_mentioning(path)]
