"""Loading a spec, with every problem located at its YAML line: ``FILE:LINE: field.path: message``.

Errors are collected, not raised one at a time, so `hpc-serve validate` lists every problem at once. A spec
that loads is a spec that renders.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hpc.envvars import expand, unset_message
from hpc.spec.files import conflicts, missing_inputs
from hpc.spec.parameters import parameter_findings
from hpc.spec.schema import (
    ContainerSpec,
    GatewaySpec,
    ModelInit,
    ModelSpec,
    PortsSpec,
    SlurmSpec,
    Spec,
    TritonSpec,
    _did_you_mean,
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, located for a human: `FILE:LINE: field.path: message`."""

    file: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.file}:{self.line}: {where}{self.message}"


class SpecError(Exception):
    """A spec with one or more problems. Nothing may be rendered or submitted from it."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def _line_index(text: str) -> dict[tuple[str | int, ...], int]:
    """Map every key path in the YAML document to its 1-based line (keys point at the key's line)."""
    index: dict[tuple[str | int, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str | int, ...]) -> None:
        index.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                child = path + (key.value,)
                index[child] = key.start_mark.line + 1
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                index[path + (i,)] = item.start_mark.line + 1
                walk(item, path + (i,))

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return index


def _line_for(index: dict[tuple[str | int, ...], int], loc: tuple[str | int, ...]) -> int:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in index:
            return index[loc[:cut]]
    return 1


_SECTIONS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Spec,
    ("slurm",): SlurmSpec,
    ("container",): ContainerSpec,
    ("model",): ModelSpec,
    ("model", "init"): ModelInit,
    ("triton",): TritonSpec,
    ("triton", "ports"): PortsSpec,
    ("gateway",): GatewaySpec,
}


def _problem_from_error(file: str, index: dict, err: Any) -> Problem:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    # pydantic reports union members (e.g. `int` / `literal['auto']`) as extra loc parts; drop them.
    loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in {"int", "str", "float", "bool"})))
    message = err["msg"].removeprefix("Value error, ")
    if message.startswith("@"):  # a cross-field check names the field it is about: "@model.tp_size: ..."
        where, message = message[1:].split(": ", 1)
        loc = loc + tuple(where.split("."))
    path = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        parent = tuple(str(p) for p in loc[:-1])
        model = _SECTIONS.get(parent)
        fields = model.model_fields if model else {}
        message = f"unknown key {loc[-1]!r}{_did_you_mean(str(loc[-1]), fields)}"
    elif err["type"] == "missing":
        message = "required field is missing"
    return Problem(file, _line_for(index, loc), path, message)


def _resolve_paths(spec: Spec, base: Path, file: str, index: dict) -> tuple[Spec, list[Problem]]:
    """Make every local path absolute, relative to the spec file (like docker compose), so rendered scripts
    never depend on the directory `sbatch` was called from. Path fields may use `~` and `$VARS`
    (e.g. `$SCRATCH`, `${MODELS:-~/models}`); an unset variable without a default is a problem, not a literal
    `$` in a path."""
    problems: list[Problem] = []

    def text(value: str, loc: tuple[str, ...]) -> str:
        expanded, missing = expand(value)
        for name in missing:
            problems.append(Problem(file, _line_for(index, loc), ".".join(loc), unset_message(name)))
        return expanded

    def path(value: Path | None, loc: tuple[str, ...]) -> Path | None:
        if value is None:
            return None
        expanded = Path(text(str(value), loc))
        return (expanded if expanded.is_absolute() else base / expanded).resolve()

    def mount_path(value: str, loc: tuple[str, ...]) -> str:
        """SRC[:DST[:FLAGS]] with SRC made absolute like the other paths (DST is inside the container)."""
        src, sep, rest = text(value, loc).partition(":")
        if not os.path.isabs(src):
            src = str((base / src).resolve())
        return f"{src}{sep}{rest}"

    m, c = spec.model, spec.container
    model = m.model_copy(
        update={
            "engine_dir": path(m.engine_dir, ("model", "engine_dir")),
            "checkpoint_dir": path(m.checkpoint_dir, ("model", "checkpoint_dir")),
            "tokenizer_dir": path(m.tokenizer_dir, ("model", "tokenizer_dir")),
        }
    )
    container = c.model_copy(
        update={
            "image": text(c.image, ("container", "image")) if c.image else None,
            "mounts": [mount_path(mount, ("container", "mounts", str(i))) for i, mount in enumerate(c.mounts)],
        }
    )
    spec = spec.model_copy(update={"workdir": path(spec.workdir, ("workdir",)), "model": model, "container": container})
    return spec, problems


def load_spec(path: str | Path, *, check_files: bool = True) -> Spec:
    """Read, validate and resolve a spec file; raise SpecError listing every problem with its line."""
    spec, _ = _load(path, check_files=check_files, require_inputs=True)
    return spec


def preview_spec(path: str | Path) -> tuple[Spec, list[Problem]]:
    """Load a spec for `render` / `submit --dry-run`: like load_spec, except that model folders, images and
    mount sources that do not exist yet are returned as notes instead of raised, so the scripts of a job can
    be looked at before its engine is built. `validate` and `submit` stay strict."""
    return _load(path, check_files=True, require_inputs=False)


def _load(path: str | Path, *, check_files: bool, require_inputs: bool) -> tuple[Spec, list[Problem]]:
    path = Path(path)
    file = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError([Problem(file, 1, "", f"cannot read the spec: {exc.strerror}")]) from None
    return _parse(text, file, path.resolve().parent, check_files, require_inputs)


def parse_spec(text: str, *, file: str = "<spec>", base: Path | None = None, check_files: bool = True) -> Spec:
    """Validate spec text; `base` is the folder relative paths are resolved against."""
    spec, _ = _parse(text, file, base or Path.cwd(), check_files, require_inputs=True)
    return spec


def _parse(text: str, file: str, base: Path, check_files: bool, require_inputs: bool) -> tuple[Spec, list[Problem]]:
    """The spec and the missing inputs it was let off with (only when not `require_inputs`)."""
    try:
        data = yaml.safe_load(text)
        index = _line_index(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise SpecError([Problem(file, line, "", f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from None
    if not isinstance(data, dict):
        raise SpecError([Problem(file, 1, "", "the spec must be a YAML mapping with at least `name` and `model`")])
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        problems = [_problem_from_error(file, index, e) for e in exc.errors()]
        # A value that fits no member of a union (`int | "auto"`) is reported once per member: keep the first.
        unique = {(p.line, p.path): p for p in reversed(problems)}
        raise SpecError(sorted(unique.values(), key=lambda p: (p.line, p.path))) from None

    def located(findings: list[tuple[tuple[str, ...], str]]) -> list[Problem]:
        return [Problem(file, _line_for(index, loc), ".".join(loc), message) for loc, message in findings]

    spec, problems = _resolve_paths(spec, base, file, index)
    problems += located(parameter_findings(spec))
    if problems:
        raise SpecError(_by_line(problems))
    if not check_files:
        return spec, []

    missing, problems = located(missing_inputs(spec)), located(conflicts(spec))
    if require_inputs:
        problems, missing = missing + problems, []
    if problems:
        raise SpecError(_by_line(problems))
    return spec, _by_line(missing)


def _by_line(problems: list[Problem]) -> list[Problem]:
    """In file order, as a reader goes through the spec (stable: same-line problems keep their order)."""
    return sorted(problems, key=lambda p: p.line)


def dump_spec(spec: Spec) -> str:
    """The resolved spec as YAML (what `render` writes beside the scripts, and what `status` reads back)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
