"""Site profiles: one cluster's defaults under the spec's own schema, so the same spec runs unchanged on
clusters that differ.

A profile is a spec without the deployment: any key of hpc/spec/schema.py except what is served and how it
is shaped (`DEPLOYMENT_KEYS`), checked by the same schema (there is one definition of every field). It is
found at `$HPC_SERVE_SITE` (set but empty: no profile), else `~/.config/hpc-serve/site.yaml`, else
`/etc/hpc-serve/site.yaml`, and merged under the spec by `hpc.spec.document.merge`: mappings key by key, any
other value of the spec (a scalar, a list, null) replaces the profile's whole, so a spec can always drop a
site's mounts or modules (`mounts: []`) or its account (`account: null`). The spec overrides the profile,
the profile overrides the schema's defaults, and every value keeps where it came from (`Provenance`:
`validate` and `render --explain` print it). Paths in a profile are relative to the profile's folder. A section
whose presence turns something on (`gateway:`, `renew:`, `build:`) gives defaults to a spec that has it, and
never adds it to one that has not.

Rendering bakes the values into the scripts and names the profile in `D/spec.yaml`; a rendered folder never
reads a profile again.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from hpc.spec.document import (
    RESOLVED_MARK,
    KeyPath,
    Problem,
    Sources,
    SpecError,
    _problem_from_error,
    merge,
    provenance,
    read_document,
    validated,
)
from hpc.spec.schema import Spec

SITE_ENV = "HPC_SERVE_SITE"
USER_PROFILE = Path("~/.config/hpc-serve/site.yaml")
SYSTEM_PROFILE = Path("/etc/hpc-serve/site.yaml")
DEPLOYMENT_KEYS = ("name", "model", "mode", "replicas", "replica_policy", "requeue")
"""Top-level spec keys a profile may not hold: they say what is served and its shape, not where."""


def _opt_in_sections() -> dict[str, type[BaseModel]]:
    """The spec's sections that turn something on by being there (`gateway:`, `renew:`, `build:`: a field whose
    default is None and whose type is a section). A profile's holds defaults for a spec that has the section
    (e.g. the gateway job's partition) and never adds one to a spec without it."""
    found: dict[str, type[BaseModel]] = {}
    for name, field in Spec.model_fields.items():
        section = [arg for arg in get_args(field.annotation) if isinstance(arg, type) and issubclass(arg, BaseModel)]
        if field.default is None and section:
            found[name] = section[0]
    return found


OPT_IN = _opt_in_sections()

# The profile alone is checked merged under this placeholder deployment; only problems at keys the profile
# wrote are its own (the rest are about the placeholder, and come back located in the real spec).
_PLACEHOLDER_FILE = "<placeholder deployment>"
_PLACEHOLDER = {"name": "site-profile", "model": {"backend": "cpu", "checkpoint_dir": "."}}

HEADER = """\
# hpc-serve site profile: this cluster's defaults for every spec, under the spec's own keys.
# Looked up at $HPC_SERVE_SITE, else ~/.config/hpc-serve/site.yaml, else /etc/hpc-serve/site.yaml.
# A spec's own value wins; mappings (slurm:, container:, slurm.env) merge key by key; a spec's list replaces
# this file's. `hpc-serve validate SPEC` shows what came from here; `hpc-serve render SPEC -o D --explain` all.
"""


@dataclass(frozen=True)
class Profile:
    """A site profile as read: its file, its mapping, and each key's line (hpc.spec.document.Sources)."""

    file: str
    data: dict[str, Any]
    sources: Sources


def find_profile(
    environ: Mapping[str, str] | None = None, home: Path | None = None, system: Path | None = None
) -> tuple[Path | None, str]:
    """The profile to use and what named it: `$HPC_SERVE_SITE` when set (empty: none), else the first of
    `home`/.config/hpc-serve/site.yaml and `system` (default /etc/hpc-serve/site.yaml; tests pass their own)
    that exists. A file named by the variable is returned whether it exists or not (a typo is an error)."""
    environ = os.environ if environ is None else environ
    if SITE_ENV in environ:
        named = environ[SITE_ENV]
        return (Path(named).expanduser() if named else None), f"${SITE_ENV}"
    user = Path(home) / ".config/hpc-serve/site.yaml" if home is not None else USER_PROFILE.expanduser()
    for candidate in (user, system if system is not None else SYSTEM_PROFILE):
        if candidate.is_file():
            return candidate, str(candidate)
    return None, ""


def current_profile(path: Path | None = None) -> Profile | None:
    """The checked profile at `path`, or the one `find_profile` finds; None when there is none. SpecError for a
    profile with problems (each at its FILE:LINE) or a named file that cannot be read."""
    named = ""
    if path is None:
        path, named = find_profile()
        if path is None:
            return None
    try:
        text = path.read_text()
    except OSError as exc:
        what = f"the site profile named by {named}" if named.startswith("$") else "the site profile"
        fix = "fix the path" if named.startswith("$") or not path.exists() else "make it readable"
        raise SpecError(
            [
                Problem(
                    str(path),
                    1,
                    "",
                    f"cannot read {what}: {exc.strerror}; {fix}, or set {SITE_ENV}= (empty) to use none",
                )
            ]
        ) from None
    profile = parse_profile(text, str(path))
    problems = check_profile(profile)
    if problems:
        raise SpecError(problems)
    return profile


def parse_profile(text: str, file: str) -> Profile:
    """Read a profile's text (SpecError for YAML that is not a mapping); `check_profile` checks its values."""
    try:
        empty = yaml.safe_load(text) is None  # empty, or only comments: a profile that sets nothing
    except yaml.YAMLError:
        empty = False  # read_document reports it, with its line
    if empty:
        return Profile(file, {}, {})
    data, sources = read_document(text, file, "a site profile must be a YAML mapping of spec keys (slurm:, container:)")
    return Profile(file, data, sources)


def check_profile(profile: Profile) -> list[Problem]:
    """Every problem of the profile alone, at its line: keys that belong to a deployment, and whatever the
    schema refuses at a key the profile wrote."""
    problems = [
        Problem(
            *profile.sources[(key,)],
            key,
            f"`{key}` is the deployment's (what is served and its shape), not the site's; move it to the spec",
        )
        for key in profile.data
        if key in DEPLOYMENT_KEYS
    ]
    own = {k: v for k, v in profile.data.items() if k not in DEPLOYMENT_KEYS and k not in OPT_IN}
    data, sources = merge(_PLACEHOLDER, {}, own, profile.sources)
    _, found = validated(data, sources, _PLACEHOLDER_FILE, Path(profile.file).resolve().parent)
    for key, section in OPT_IN.items():  # alone: their checks against the rest of a spec come with the spec
        if isinstance(profile.data.get(key), dict):
            try:
                section.model_validate(profile.data[key])
            except ValidationError as exc:
                found += [
                    _problem_from_error(profile.file, profile.sources, {**e, "loc": (key, *e["loc"])})
                    for e in exc.errors()
                ]
    written = {".".join(str(p) for p in path) for path in profile.sources}
    problems += [p for p in found if p.file == profile.file and p.path in written]
    return sorted(problems, key=lambda p: p.line)


def applicable(profile: Profile, spec: Mapping[str, Any]) -> Profile:
    """The profile as it applies to a spec's mapping: its opt-in sections (OPT_IN) only where the spec has one,
    and its `container:` only when the spec names no other container type (a pyxis image reference or a pyxis
    container name means nothing to apptainer: the spec's container is then the spec's alone)."""
    dropped = {key for key in OPT_IN if key in profile.data and not isinstance(spec.get(key), dict)}
    mine, theirs = (_container_type(d) for d in (spec, profile.data))
    if mine is not None and theirs is not None and mine != theirs:
        dropped.add("container")
    if not dropped:
        return profile
    data = {k: v for k, v in profile.data.items() if k not in dropped}
    return Profile(profile.file, data, {p: w for p, w in profile.sources.items() if not (p and p[0] in dropped)})


def write_profile(path: str | Path, values: Mapping[str, Any], *, header: str = "", overwrite: bool = False) -> Path:
    """Write `values` (plain YAML values under spec keys, e.g. {"slurm": {"partition": "gpu"}}) as a site profile
    at `path`, after checking it with the profile loader: SpecError (naming `path`, the line and the fix) for a
    value the schema refuses, and nothing is written; FileExistsError unless `overwrite`. `header`: comment lines
    of your own (e.g. "written by hpc-serve doctor on login1"), put above the standard explanation."""
    path = Path(path).expanduser()
    own = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    text = own + HEADER + "\n" + yaml.safe_dump(json.loads(json.dumps(dict(values))), sort_keys=False)
    problems = check_profile(parse_profile(text, str(path)))
    if problems:
        raise SpecError(problems)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; remove it or overwrite it explicitly")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(text)
    os.replace(staging, path)
    return path


def _container_type(data: Mapping[str, Any]) -> Any:
    container = data.get("container")
    return container.get("type") if isinstance(container, dict) else None


def profile_problems(
    problems: list[Problem], alone: list[Problem], file: str, profile: str, index: Sources
) -> list[Problem]:
    """A problem at the spec's line that the spec alone does not have comes from the profile's values (a cross-field
    check: the spec's tp_size against the profile's gpus_per_node): say so, and which values of those sections
    the profile gave."""
    known = {(p.path, p.message) for p in alone}
    given = sorted(
        (".".join(str(k) for k in path), line) for path, (f, line) in index.items() if f == profile and len(path) > 1
    )
    out = []
    for p in problems:
        if p.file == file and (p.path, p.message) not in known:
            sections = {p.path.split(".")[0]} | set(re.findall(r"\b(\w+)\.\w+", p.message))
            keys = ", ".join(f"{key} (line {line})" for key, line in given if key.split(".")[0] in sections)
            p = replace(p, message=f"{p.message} [with the site profile {profile}" + (f": {keys}]" if keys else "]"))
        out.append(p)
    return out


def explain(spec: Spec, everything: bool = True) -> list[str]:
    """One line per value of the spec: key, where it came from (spec FILE:LINE, profile FILE:LINE — with the
    profile's line it overrides — or default), value. `everything=False`: only what the profile gave or
    the spec took over from it (what `validate` prints)."""
    origin = provenance(spec)
    if origin is None:
        return []
    rows = []
    for path, value in _leaves(spec.model_dump(mode="json")):
        where = origin.sources.get(path)
        under = origin.profile_sources.get(path)
        if where is None:
            text = "default"
        elif where[0] == origin.profile:
            text = f"profile {where[0]}:{where[1]}"
        else:
            text = f"spec {where[0]}:{where[1]}" + (f" (over profile {under[0]}:{under[1]})" if under else "")
        if everything or under is not None:
            rows.append((".".join(str(p) for p in path), text, value if isinstance(value, str) else json.dumps(value)))
    width = [max((len(r[i]) for r in rows), default=0) for i in (0, 1)]
    return [f"{key:<{width[0]}}  {text:<{width[1]}}  {value}" for key, text, value in rows]


def profile_summary(spec: Spec, explained: bool = False) -> str:
    """One line: the profile the spec was merged with, or that none was and where it was looked for (a user who
    expected one sees which file to create, or that `$HPC_SERVE_SITE` is set empty); unless `explained` (the
    lines that follow list every value), how to see every value's origin. `submit` and `render` print it: the
    scripts hold the profile's values, so which profile is the first thing to know about a job."""
    origin = provenance(spec)
    if origin is None:
        return "site profile: none (the spec was not loaded from a file)"
    if origin.profile is None:
        return f"site profile: none ({_where_looked(origin.spec_file)})"
    more = "" if explained else "; --explain lists where every value came from"
    return f"site profile: {origin.profile} (gave {len(origin.given_by_profile())} values{more})"


def _where_looked(spec_file: str, environ: Mapping[str, str] | None = None) -> str:
    """Why no profile was merged: `find_profile`'s places in its order, or the reason it looked nowhere."""
    environ = os.environ if environ is None else environ
    try:
        resolved = Path(spec_file).read_text().startswith(RESOLVED_MARK)
    except OSError:
        resolved = False
    if resolved:
        return "a rendered spec.yaml holds every value already; its header names the profile it was made with"
    if SITE_ENV in environ:
        return f"${SITE_ENV} is set and empty"
    places = (USER_PROFILE.expanduser(), SYSTEM_PROFILE)
    return f"${SITE_ENV} is unset; no {' or '.join(str(p) for p in places)}"


def _leaves(value: Any, path: KeyPath = ()) -> list[tuple[KeyPath, Any]]:
    """Every value that is not a non-empty mapping, with its key path (a list is one value)."""
    if isinstance(value, dict) and value:
        return [leaf for key, item in value.items() for leaf in _leaves(item, path + (key,))]
    return [(path, value)]
