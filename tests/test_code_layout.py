"""The code's layout (DEVELOPERS.md "Who owns what"): one subpackage per role; no two subpackages that import each
other, and no circle of imports among the modules of one subpackage, at any depth of the import (a module-level
import or one inside a function alike), so a file's place says which process runs it and a subpackage can be read
without the ones above it, and its modules bottom up. `hpc/` (the login side) reads what it shares with the ranks
and the models from `launcher/contracts/`, never from their code."""

from __future__ import annotations

import ast
import functools
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = ("hpc", "launcher", "backend")

#: code that runs on a rank or inside tritonserver: `hpc` imports none of it (what both sides need is a contract)
RANK_SIDE = (
    "launcher.node",
    "launcher.jobscript",
    "backend.models",
    "backend.cpu_engine",
    "backend.sim_engine",
    "backend.standin",
    "backend.engines",
)
#: libraries of that code `hpc` uses where it runs itself, each with its reason
HPC_MAY_IMPORT = {
    "backend.models.tokenizer": "the tokenizer: the gateway detokenizes streamed tokens, the bench and doctor count "
    "tokens as the model does",
    "backend.cpu_engine.init_model": "`hpc-serve init-model` and `submit` create the random-weight checkpoint a "
    "spec's model.init asks for on the login node",
    "backend.cpu_engine.checkpoint": "the spec's checks read a checkpoint's config.json as the CPU engine will "
    "(its architectures, its parse errors)",
    "backend.sim_engine.profiles": "the spec's choices of a simulated GPU and model (model.sim.gpu, model.init.model) "
    "are the simulated engine's table",
    "backend.sim_engine.checkpoint": "`hpc-serve init-model --sim-model` and `submit` write the weightless checkpoint "
    "a spec's model.init asks for with backend sim",
    "launcher.node.server": "`hpc-serve doctor --node` runs on a compute node and asks the launcher's own "
    "resolution of the tritonserver binary, so it checks what a rank would run",
}


def _modules() -> dict[str, Path]:
    found = {}
    for top in TOP:
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:`: imported for the type checker, never at run time."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return skipped


def _imports(module: str, path: Path, modules: dict[str, Path], run_time_only: bool = False) -> set[str]:
    """The project's modules `module` (at `path`) imports, relative imports resolved; `run_time_only`: not those
    under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree) if run_time_only else set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            names |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return {name for name in names if name in modules and name != module}


@functools.cache
def _graph(run_time_only: bool = False) -> dict[str, frozenset[str]]:
    modules = _modules()
    return {module: frozenset(_imports(module, path, modules, run_time_only)) for module, path in modules.items()}


def _package(module: str) -> str:
    """The role a module belongs to: its second-level subpackage (`hpc.jobs`), or, for a module directly in a top
    package, itself (`hpc.compat`)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _home(module: str) -> str:
    """The package whose modules a circle must not join: a module's second-level subpackage (`hpc.jobs`), or the top
    package for a module directly in it (`hpc.compat` and `hpc.api` are both `hpc`'s)."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (ROOT / parts[0] / parts[1]).is_dir()):
        return ".".join(parts[:2])
    return parts[0]


def _cycles(graph: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


@pytest.mark.slow
def test_no_two_subpackages_import_each_other():
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in _graph().items():
        for target in targets:
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


def test_no_circle_of_imports_inside_a_subpackage():
    """No circle of any length among the modules of one subpackage (imports the type checker alone sees aside):
    a circle is held together by imports inside functions, and its modules can only be read together."""
    graph = _graph(run_time_only=True)
    inside = {
        module: frozenset(t for t in targets if _package(t) == _package(module)) for module, targets in graph.items()
    }
    circles = sorted(sorted(cycle) for cycle in _cycles(inside))
    assert circles == [], f"modules of one subpackage that import each other in a circle: {circles}"


def test_hpc_imports_no_rank_side_code():
    """`hpc` reads names and records it shares with the ranks and the models from `launcher.contracts`; it
    imports rank-side or in-server code only where it uses a library of it itself (HPC_MAY_IMPORT, each with
    its reason)."""
    wrong = sorted(
        (module, target)
        for module, targets in _graph().items()
        if module.split(".")[0] == "hpc"
        for target in targets
        if target.startswith(RANK_SIDE) and not target.startswith(tuple(HPC_MAY_IMPORT))
    )
    assert wrong == [], f"hpc modules that import rank-side or in-server code: {wrong}"


def test_launcher_contracts_import_no_other_launcher_subpackage():
    """The shared names and records load without the rank's machinery (the models and `hpc` import them)."""
    wrong = {
        (module, target)
        for module, targets in _graph().items()
        if module.startswith("launcher.contracts")
        for target in targets
        if target.startswith("launcher.") and not target.startswith("launcher.contracts")
    }
    assert wrong == set()


def test_every_state_enum_prints_its_value():
    """A str-valued Enum is a TextEnum (launcher/contracts/text_enum.py): a plain `(str, Enum)` prints its member's
    name in an f-string from Python 3.11 on and its value on 3.10, so a record or log line would depend on the image."""
    plain = []
    for module, path in _modules().items():
        if module == "launcher.contracts.text_enum":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base) for base in node.bases]
                if "str" in bases and any(b.endswith("Enum") for b in bases):
                    plain.append(f"{module}.{node.name}")
    assert plain == [], f"str Enums that are not TextEnum: {plain}"
