"""README.md's "Talking to a deployment" runs as written: its shell block (a gateway by hand, the endpoints as
environment variables, the token) and then its Python block (the openai package, hpc-serve's client), against a
local job of the embedded default, the spec's path and name put in for the README's."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e import module_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
ROOT = Path(__file__).resolve().parent.parent
README_SPEC, README_MODEL = "configs/llama3-8b.yaml", "llama3-8b"


def blocks(section: str) -> tuple[str, str]:
    """The section's first bash and first python code blocks."""
    text = (ROOT / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    bash = re.search(r"```bash\n(.*?)```", body, re.S)
    python = re.search(r"```python\n(.*?)```", body, re.S)
    assert bash and python, f"README.md's {section!r} lost its examples"
    return bash.group(1), python.group(1)


@pytest.fixture(scope="module")
def job(tritonserver, tiny_gpt2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    with module_job(folder, "readme", tiny_gpt2, executor="local") as (job, _):
        yield folder, folder / "readme.yaml"


def test_talking_to_a_deployment_runs_as_written(job, tmp_path):
    folder, spec = job
    assert spec.is_file()
    shell, python = (
        b.replace(README_SPEC, str(spec)).replace(f'"{README_MODEL}"', '"readme"')
        for b in blocks("Talking to a deployment")
    )
    gateway_line, rest = shell.split("\n", 1)
    assert gateway_line.startswith("hpc-serve gateway ") and "&" in gateway_line, gateway_line
    bin_dir = tmp_path / "bin"  # `hpc-serve` as the installed entry point runs it, with this checkout's code
    bin_dir.mkdir()
    entry = bin_dir / "hpc-serve"
    entry.write_text(f'#!/bin/sh\nexec {sys.executable} -m hpc.cli.main "$@"\n')
    entry.chmod(entry.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "example.py").write_text(python)
    script = "\n".join(
        [
            "set -euo pipefail",
            gateway_line.replace("&", "> gateway.log 2>&1 &", 1),
            "trap 'kill %1' EXIT",
            # the user reads the next lines a few seconds later; the script waits for the gateway's record instead
            f"until hpc-serve endpoints {spec} --format env | grep -q '^GATEWAY_URL='; do sleep 0.2; done",
            rest,
            f"{sys.executable} example.py",
        ]
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    env.pop("OPENAI_BASE_URL", None)
    env.pop("OPENAI_API_KEY", None)
    proc = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    log = (tmp_path / "gateway.log").read_text() if (tmp_path / "gateway.log").exists() else ""
    # each block raises on any failure (an HTTP error, no gateway, a refused token): exit 0 is both answered
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{log}"
