"""What the golden-file tests share (tests/test_configs.py: rendered deployments; tests/test_build_golden.py: engine
build scripts): machine-specific text made placeholders, and the check that a script is sound shell."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from hpc import __version__


def normalise(text: str, tmp: Path, more: dict[str, str] | None = None) -> str:
    """The tmp tree → <TMP>, sys.executable → <PYTHON>, each of `more` (text → placeholder), the version →
    <VERSION>. Longest first: one path may hold another (the tmp tree may hold the interpreter)."""
    pairs = {str(tmp): "<TMP>", sys.executable: "<PYTHON>", **(more or {})}
    for real, token in sorted(pairs.items(), key=lambda pair: -len(pair[0])):
        text = text.replace(real, token)
    return text.replace(f"hpc-serve {__version__}", "hpc-serve <VERSION>")


def check_script(script: Path) -> None:
    """bash can parse it, and shellcheck (where installed) finds nothing at warning level."""
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    if shutil.which("shellcheck"):
        check = subprocess.run(
            ["shellcheck", "-S", "warning", "-s", "bash", str(script)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout
