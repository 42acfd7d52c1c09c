"""The code's layout (DEVELOPERS.md "Who owns what"): one subpackage per role, and no two subpackages that import
each other, at any depth of the import (a module-level import or one inside a function alike), so a file's place
says which process runs it and a subpackage can be read without the ones above it."""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = ("hpc", "launcher", "backend")


def _modules() -> dict[str, Path]:
    found = {}
    for top in TOP:
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules `path` imports (absolute imports: the tree uses no relative ones outside backend/)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return {name for name in names if name in modules}


def _package(module: str) -> str:
    """The role a module belongs to: its second-level subpackage (`hpc.jobs`), or the top package for a module
    directly in it (`hpc.compat` counts as `hpc`)."""
    parts = module.split(".")
    return ".".join(parts[:2])


@pytest.mark.slow
def test_no_two_subpackages_import_each_other():
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for target in _imports(path, modules):
            a, b = _package(module), _package(target)
            if a != b:
                edges[a].add(b)
    mutual = sorted(
        {
            tuple(sorted(pair))
            for pair in itertools.permutations(edges, 2)
            if pair[1] in edges[pair[0]] and pair[0] in edges[pair[1]]
        }
    )
    assert mutual == [], f"subpackages that import each other: {mutual}"


def test_launcher_contracts_import_no_other_launcher_subpackage():
    """The shared names and records load without the rank's machinery (the models and `hpc` import them)."""
    modules = _modules()
    wrong = {
        (module, target)
        for module, path in modules.items()
        if module.startswith("launcher.contracts")
        for target in _imports(path, modules)
        if target.startswith("launcher.") and not target.startswith("launcher.contracts")
    }
    assert wrong == set()
