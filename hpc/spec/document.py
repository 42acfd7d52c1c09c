"""A spec document, or a site profile, as YAML read with every key located (`Sources`: key path → FILE:LINE), its
problems (`Problem`, `SpecError`), the merge of a spec over a profile (`merge`), the schema's checks of a merged
document (`validated`), and where a loaded spec's values came from (`Provenance`).

Every key knows where it was written: the spec file, or the site profile merged under it (hpc/spec/site.py).
Errors, relative paths and `render --explain` all go by that one map. Why a module of its own: loading a spec
(hpc/spec/load.py) and loading a site profile (hpc/spec/site.py) both read documents so, and the spec's loading
merges the profile: both sit above this.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hpc.envvars import expand, unset_message
from hpc.spec.autoscale import AutoscaleSpec
from hpc.spec.build import BuildSpec
from hpc.spec.llmapi import CudaGraphConfig, KvCacheConfig, LlmApiSpec, workflow_findings
from hpc.spec.model import ModelInit, ModelSpec, SimSpec
from hpc.spec.parameters import parameter_findings
from hpc.spec.schema import (
    ContainerSpec,
    GatewaySpec,
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


#: yaml.safe_load's loader; libyaml's C one where PyYAML was built with it (the same values and marks, faster)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

KeyPath = tuple[str | int, ...]
Sources = dict[KeyPath, tuple[str, int]]
"""Where each key path of a (merged) document was written: (file, 1-based line of the key)."""


def _line_index(root: yaml.Node | None, file: str) -> Sources:
    """Map every key path in the YAML document to its file and 1-based line (keys point at the key's line)."""
    index: Sources = {}

    def walk(node: yaml.Node, path: KeyPath) -> None:
        index.setdefault(path, (file, node.start_mark.line + 1))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                child = path + (key.value,)
                index[child] = (file, key.start_mark.line + 1)
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                index[path + (i,)] = (file, item.start_mark.line + 1)
                walk(item, path + (i,))

    if root is not None:
        walk(root, ())
    return index


def _compose_and_construct(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for the line index) and its value, from one parse (libyaml's when present)."""
    loader = _LOADER(text)
    try:
        root = loader.get_single_node()
        return root, (loader.construct_document(root) if root is not None else None)
    finally:
        loader.dispose()


def _origin(index: Sources, loc: tuple, fallback: str) -> tuple[str, int]:
    """The file and line of the nearest written key on `loc`'s path (line 1 of `fallback` when none is)."""
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in index:
            return index[loc[:cut]]
        alt = tuple(int(p) if isinstance(p, str) and p.isdigit() else p for p in loc[:cut])
        if alt in index:  # findings name list items by str(i), the index by i
            return index[alt]
    return fallback, 1


def read_document(text: str, file: str, what: str) -> tuple[dict, Sources]:
    """A YAML mapping and where each of its keys is; SpecError for text that is not one (`what` names the
    mapping in the message: what it must hold)."""
    try:
        root, data = _compose_and_construct(text)
        index = _line_index(root, file)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise SpecError([Problem(file, line, "", f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from None
    if not isinstance(data, dict):
        raise SpecError([Problem(file, 1, "", f"must be a YAML mapping {what}")])
    return data, index


def merge(low: dict, low_sources: Sources, high: dict, high_sources: Sources) -> tuple[dict, Sources]:
    """`high` over `low`, key by key: mappings merge (each key of either), any other value of `high` (a scalar,
    a list, null) replaces `low`'s whole. The sources follow the values: a replaced value's keys point at `high`."""
    replaced: list[KeyPath] = []

    def walk(lo: dict, hi: dict, path: KeyPath) -> dict:
        out = dict(lo)
        for key, value in hi.items():
            if isinstance(value, dict) and isinstance(lo.get(key), dict):
                out[key] = walk(lo[key], value, path + (key,))
            else:
                out[key] = value
                replaced.append(path + (key,))
        return out

    data = walk(low, high, ())
    sources = {p: where for p, where in low_sources.items() if p and not any(p[: len(r)] == r for r in replaced)}
    sources.update(high_sources)
    return data, sources


_SECTIONS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Spec,
    ("slurm",): SlurmSpec,
    ("container",): ContainerSpec,
    ("model",): ModelSpec,
    ("model", "init"): ModelInit,
    ("model", "sim"): SimSpec,
    ("triton",): TritonSpec,
    ("triton", "ports"): PortsSpec,
    ("gateway",): GatewaySpec,
    ("autoscale",): AutoscaleSpec,
    ("build",): BuildSpec,
    ("llm_api",): LlmApiSpec,
    ("llm_api", "kv_cache_config"): KvCacheConfig,
    ("llm_api", "cuda_graph_config"): CudaGraphConfig,
}


def _problem_from_error(file: str, index: Sources, err: Any) -> Problem:
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
    return Problem(*_origin(index, loc, file), path, message)


def _resolve_paths(spec: Spec, base: Path, file: str, index: Sources) -> tuple[Spec, list[Problem]]:
    """Make every local path absolute, relative to the file that wrote it (the spec's folder, or the site
    profile's for a value the profile gave; like docker compose), so rendered scripts never depend on the
    directory `sbatch` was called from. Path fields may use `~` and `$VARS` (e.g. `$SCRATCH`,
    `${MODELS:-~/models}`); an unset variable without a default is a problem, not a literal `$` in a path."""
    problems: list[Problem] = []

    def folder(loc: tuple[str, ...]) -> Path:
        where, _ = _origin(index, loc, file)
        return base if where == file else Path(where).resolve().parent

    def text(value: str, loc: tuple[str, ...]) -> str:
        expanded, missing = expand(value)
        for name in missing:
            where = _origin(index, loc, file)
            message = unset_message(name, "the spec" if where[0] == file else "the site profile")
            problems.append(Problem(*where, ".".join(loc), message))
        return expanded

    def path(value: Path | None, loc: tuple[str, ...]) -> Path | None:
        if value is None:
            return None
        expanded = Path(text(str(value), loc))
        return (expanded if expanded.is_absolute() else folder(loc) / expanded).resolve()

    def mount_path(value: str, loc: tuple[str, ...]) -> str:
        """SRC[:DST[:FLAGS]] with SRC made absolute like the other paths (DST is inside the container)."""
        src, sep, rest = text(value, loc).partition(":")
        if not os.path.isabs(src):
            src = str((folder(loc) / src).resolve())
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
    update: dict[str, Any] = {"workdir": path(spec.workdir, ("workdir",)), "model": model, "container": container}
    if spec.build is not None:  # the build's source and where its engines go (hpc/spec/build.py)
        b = spec.build
        update["build"] = b.model_copy(
            update={
                "checkpoint_dir": path(b.checkpoint_dir, ("build", "checkpoint_dir")),
                "output_dir": path(b.output_dir, ("build", "output_dir")),
            }
        )
    spec = spec.model_copy(update=update)
    return spec, problems


RESOLVED_MARK = "# hpc-serve resolved spec"
"""First line of a rendered `spec.yaml`: it holds every value already, so loading it merges no site profile."""


@dataclass(frozen=True)
class Provenance:
    """Where a loaded spec's values came from: `sources` for every key written in the spec or the site profile
    (a key in neither is the schema's default); `profile_sources`: every key of the profile, those the spec
    overrode too."""

    spec_file: str
    profile: str | None
    sources: Sources
    profile_sources: Sources

    def problem(self, dotted: str, message: str) -> Problem:
        """A problem with the spec's value at `dotted` (e.g. slurm.time), at the line that wrote it (the nearest
        written key above it when none did: the value is a default)."""
        return Problem(*_origin(self.sources, tuple(dotted.split(".")), self.spec_file), dotted, message)

    def given_by_profile(self) -> list[str]:
        """The keys whose value is the profile's (a list as one key, a section only through its keys)."""
        paths = {_until_item(p) for p, (f, _) in self.sources.items() if f == self.profile and p}
        return sorted(_dotted(p) for p in paths if not any(len(q) > len(p) and q[: len(p)] == p for q in paths))


class _Aside:
    """What is known about a spec without being part of its value: equal to anything, so two specs with the same
    values are equal wherever they were loaded from (pydantic compares private attributes too)."""

    __slots__ = ("provenance",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, provenance: Provenance) -> None:
        self.provenance = provenance

    def __eq__(self, other: object) -> bool:
        return True


def provenance(spec: Spec) -> Provenance | None:
    """How `spec` was loaded (None for a Spec made in code). Kept by `model_copy`."""
    aside = spec._provenance
    return aside.provenance if isinstance(aside, _Aside) else None


def validated(data: dict, index: Sources, file: str, base: Path) -> tuple[Spec | None, list[Problem]]:
    """The schema's checks of a (merged) document, the paths resolved, and its tensorrt_llm parameters: the spec
    (None when the schema refuses it) and every problem, located by `index` (`file`: where an unlocated one is)."""
    spec, _, problems = checked(data, index, file, base)
    return spec, problems


def checked(data: dict, index: Sources, file: str, base: Path) -> tuple[Spec | None, Repaired | None, list[Problem]]:
    """`validated`, and when the schema refuses the document, what its repair reached (`Repaired`: the spec as
    the fixes make it, whose files can be checked too, so that every problem is said at once)."""
    spec, problems = _validated_once(data, index, file, base)
    if spec is not None:
        return spec, None, problems
    repaired = repaired_problems(data, index, file, base, problems)
    return None, repaired, problems + repaired.found


def _validated_once(data: dict, index: Sources, file: str, base: Path) -> tuple[Spec | None, list[Problem]]:
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        problems = [_problem_from_error(file, index, e) for e in exc.errors()]
        # A value that fits no member of a union (`int | "auto"`) is reported once per member: keep the first.
        unique = {(p.file, p.line, p.path): p for p in reversed(problems)}
        return None, sorted(unique.values(), key=lambda p: (p.line, p.path))
    spec, problems = _resolve_paths(spec, base, file, index)
    problems += [
        Problem(*_origin(index, loc, file), ".".join(loc), message)
        for loc, message in parameter_findings(spec) + workflow_findings(spec)
    ]
    return spec, problems


#: how many times a refused document is checked again with its refused keys left out (each round can only
#: remove keys, so a few rounds reach what the schema takes)
REPAIR_ROUNDS = 4


class Repaired:
    """What `repaired_problems` reached: the spec as the first problems' fixes make it (None when none is
    reached) and the problems behind the first ones; `new(problem)` says whether a later problem (its files'
    too) is one to add."""

    def __init__(self, named: set[str]) -> None:
        self.spec: Spec | None = None
        self.found: list[Problem] = []
        self.named = named
        self.dropped: set[str] = set()

    def new(self, p: Problem) -> bool:
        """Not at a field already named (or under it), and naming no value left out (it may be its doing)."""
        leaf = p.path.split(".")[-1]
        return (
            p.path not in self.named
            and not any(p.path.startswith(n + ".") for n in self.named)
            and not any(d in p.message or d.split(".")[-1] == leaf for d in self.dropped)
        )


def repaired_problems(data: dict, index: Sources, file: str, base: Path, problems: list[Problem]) -> Repaired:
    """The problems behind the first ones: the document checked again as the first problems' fixes would make
    it (a mistyped key given the name its did-you-mean offers, a refused value left out for its default), so
    that `validate` gives every problem at once rather than one round per run."""
    out = Repaired({p.path for p in problems})
    current = data
    for _ in range(REPAIR_ROUNDS):
        trimmed, left_out = _as_fixed(current, problems)
        if trimmed == current:
            return out
        current = trimmed
        out.dropped |= left_out
        spec, problems = _validated_once(current, index, file, base)
        out.found += [p for p in problems if out.new(p)]
        out.named |= {p.path for p in problems}
        if spec is not None:
            out.spec = spec
            return out
    return out


_DID_YOU_MEAN = re.compile(r"^unknown [^']*'[^']+'; did you mean '([^']+)'\?$")


def _as_fixed(data: dict, problems: list[Problem]) -> tuple[dict, set[str]]:
    """A copy of `data` as the problems' fixes make it, and the dotted paths of the values left out."""
    out = copy.deepcopy(data)
    left_out: set[str] = set()
    for problem in problems:
        parts = problem.path.split(".") if problem.path else []
        node: Any = out
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not parts or not isinstance(node, dict) or parts[-1] not in node:
            continue
        value = node.pop(parts[-1])
        suggestion = _DID_YOU_MEAN.search(problem.message)
        if suggestion is not None and suggestion.group(1) not in node:
            node[suggestion.group(1)] = value
        else:
            left_out.add(problem.path)
    return out, left_out


def _until_item(path: KeyPath) -> KeyPath:
    """A list item's path cut to its list's."""
    for i, part in enumerate(path):
        if isinstance(part, int):
            return path[:i]
    return path


def _dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path)
