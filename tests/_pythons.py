"""Other Python interpreters on this machine, for the tests that run the rank-side code the way a container's
python3 would: 3.10 (NGC's tritonserver images, and pyproject's requires-python) and older ones (what doctor's
probe must name rather than crash on).

Found on PATH (`python3.10`) or under pyenv's versions folder ($PYENV_ROOT, else ~/.pyenv), and each one run
once to prove it is that version: a pyenv shim for a version that is not selected is on PATH but only prints
"command not found".
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        proc = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    parts = proc.stdout.split()
    return (int(parts[0]), int(parts[1])) if proc.returncode == 0 and len(parts) == 2 else None


@functools.cache
def find_python(major: int, minor: int) -> str | None:
    """A working `pythonMAJOR.MINOR`, or None."""
    name = f"python{major}.{minor}"
    candidates = [shutil.which(name)]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates += [str(p / "bin" / name) for p in sorted(pyenv.glob(f"{major}.{minor}.*"), reverse=True)]
    return next((c for c in candidates if c and _version_of(c) == (major, minor)), None)


def where_looked(major: int, minor: int) -> str:
    """The skip reason's list of places."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    return f"no working python{major}.{minor} on PATH or in {pyenv}/{major}.{minor}.*/bin"
