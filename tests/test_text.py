"""No tracked text points outside the repository: not at this machine's folders, a notes folder, a shared reference
folder beside the checkout, or a private issue or session number.

Why: a reader of the repository has none of those; a pointer to one is a dead end, and the fact behind it is lost.
The fact goes into docs/decisions.md (with upstream links at pinned commits), and the text cites that section or
says what the issue was. Upstream's own issues and pull requests stay citable ("TensorRT-LLM#1667", "PR #408").
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: what no tracked file may say, each with the reason a reader would give. The patterns are spelt so that this
#: file does not match them itself.
OUTSIDE = {
    "a path on this machine": re.compile(r"(?<![\w<>.~-])/w[o]rk/"),
    "a folder beside the checkout": re.compile(r"\.\./shar[e]d\b|\bshared/refer[e]nce\b"),
    "a notes folder": re.compile(r"(?<![\w.-])not[e]s/"),
    "a private issue number": re.compile(r"\bissues?[ -]?#?\d+|\bissue\d+", re.IGNORECASE),
    "a section of a reference file": re.compile(r"\b(?:reference|facts)(?:\.md)? §", re.IGNORECASE),
    "a private session number": re.compile(r"\bsess[i]on \d+\b", re.IGNORECASE),
}


def tracked_text_files() -> list[Path]:
    try:
        names = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
        ).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    files = []
    for name in filter(None, names):
        path = ROOT / name
        if path.is_file() and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def test_no_text_points_outside_the_repository() -> None:
    found = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for why, pattern in OUTSIDE.items():
                match = pattern.search(line)
                if match:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {why}: {match.group(0)!r}")
    assert not found, "text that points outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "reference: /w" + "ork/no" + "tes/x.md",
        "see ../sha" + "red/reference/a.md",
        "(iss" + "ue 12)",
        "iss" + "ue23-facts",
        "(refe" + "rence §4)",
        "(2026-11-23, sess" + "ion 8)",
    ],
)
def test_the_patterns_catch_pointers(line: str) -> None:
    assert any(pattern.search(line) for pattern in OUTSIDE.values())


@pytest.mark.parametrize(
    "line",
    [
        "workdir: <TMP>/work/runs",
        "TensorRT-LLM#1667; nccl#129, #324; python_backend PR #408",
        "an issue of upstream's tracker",
        "release notes of v1.3.0rc20",
    ],
)
def test_the_patterns_leave_upstream_citations(line: str) -> None:
    assert not any(pattern.search(line) for pattern in OUTSIDE.values())


def test_the_gateway_package_names_each_of_its_modules() -> None:
    """hpc/gateway/__init__.py's docstring is the package's map: a module added or moved changes it too."""
    package = ROOT / "hpc" / "gateway"
    doc = (package / "__init__.py").read_text().split('"""')[1]
    words = set(re.findall(r"\w+", doc))
    missing = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__" and p.stem not in words)
    assert not missing, f"hpc/gateway/__init__.py does not name: {missing}"
