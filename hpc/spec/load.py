"""Loading a spec, with every problem located at its YAML line: ``FILE:LINE: field.path: message``.

Errors are collected, not raised one at a time, so `hpc-serve validate` lists every problem at once. A spec
that loads is a spec that renders. The spec file is merged over the site profile (hpc/spec/site.py); reading,
merging and checking a document is hpc/spec/document.py's.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

from hpc.spec.document import (
    RESOLVED_MARK,
    Problem,
    Provenance,
    SpecError,
    _Aside,
    _origin,
    checked,
    merge,
    provenance,
    read_document,
    validated,
)
from hpc.spec.files import conflicts, missing_inputs
from hpc.spec.schema import Spec
from hpc.spec.site import applicable, current_profile, profile_problems

AUTO = "auto"
"""`site=AUTO`: the site profile is looked up ($HPC_SERVE_SITE, ~/.config, /etc: hpc/spec/site.py)."""


def load_spec(path: str | Path, *, check_files: bool = True, site: str | Path | None = AUTO) -> Spec:
    """Read, validate and resolve a spec file over the site profile (`site`: AUTO looks it up, a path names
    one, None: none); raise SpecError listing every problem with its file and line."""
    spec, _ = _load(path, check_files=check_files, require_inputs=True, site=site)
    return spec


def preview_spec(path: str | Path, *, site: str | Path | None = AUTO) -> tuple[Spec, list[Problem]]:
    """Load a spec for `render` / `submit --dry-run`: like load_spec, except that model folders, images and
    mount sources that do not exist yet are returned as notes instead of raised, so the scripts of a job can
    be looked at before its engine is built. `validate` and `submit` stay strict."""
    return _load(path, check_files=True, require_inputs=False, site=site)


def _load(
    path: str | Path, *, check_files: bool, require_inputs: bool, site: str | Path | None
) -> tuple[Spec, list[Problem]]:
    path = Path(path)
    file = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError([Problem(file, 1, "", f"cannot read the spec: {exc.strerror}")]) from None
    return _parse(text, file, path.resolve().parent, check_files, require_inputs, site)


def parse_spec(
    text: str,
    *,
    file: str = "<spec>",
    base: Path | None = None,
    check_files: bool = True,
    site: str | Path | None = None,
) -> Spec:
    """Validate spec text; `base` is the folder relative paths are resolved against. No site profile unless
    `site` names one (or is AUTO)."""
    spec, _ = _parse(text, file, base or Path.cwd(), check_files, require_inputs=True, site=site)
    return spec


def _parse(
    text: str, file: str, base: Path, check_files: bool, require_inputs: bool, site: str | Path | None = None
) -> tuple[Spec, list[Problem]]:
    """The spec and the missing inputs it was let off with (only when not `require_inputs`)."""
    data, index = read_document(text, file, "the spec must be a YAML mapping with at least `name` and `model`")
    profile_file, profile_sources = None, {}
    if site is not None and not text.startswith(RESOLVED_MARK):
        profile = current_profile(None if site == AUTO else Path(site))
        if profile is not None:
            profile = applicable(profile, data)
            profile_file, profile_sources = profile.file, profile.sources
            alone = (data, index)
            data, index = merge(profile.data, profile.sources, data, index)
    spec, repaired, problems = checked(data, index, file, base)
    if (spec is None or problems) and profile_file is not None:
        problems = profile_problems(problems, validated(*alone, file, base)[1], file, profile_file, index)

    def located(findings: list[tuple[tuple[str, ...], str]]) -> list[Problem]:
        return [Problem(*_origin(index, loc, file), ".".join(loc), message) for loc, message in findings]

    if spec is None or problems:
        if check_files and repaired is not None and repaired.spec is not None:  # its files too: every problem
            fixed = repaired.spec
            problems += [p for p in located(missing_inputs(fixed) + conflicts(fixed)) if repaired.new(p)]
        raise SpecError(_by_line(problems, file))
    spec._provenance = _Aside(Provenance(file, profile_file, index, profile_sources))

    if not check_files:
        return spec, []
    missing, problems = located(missing_inputs(spec)), located(conflicts(spec))
    if require_inputs:
        problems, missing = missing + problems, []
    if problems:
        raise SpecError(_by_line(problems, file))
    return spec, _by_line(missing, file)


def _by_line(problems: list[Problem], file: str) -> list[Problem]:
    """In file order, as a reader goes through the spec, then the site profile's (stable: same-line problems keep
    their order)."""
    return sorted(problems, key=lambda p: (p.file != file, p.line))


def dump_spec(spec: Spec) -> str:
    """The resolved spec as YAML (what `render` writes beside the scripts, and what `status` reads back). Its
    header names the site profile it was merged with and the keys that came from it: the folder is
    self-contained (loading it again merges no profile, RESOLVED_MARK) and says where its values came from."""
    header = [f"{RESOLVED_MARK}: every value filled in; loading it again merges no site profile."]
    origin = provenance(spec)
    if origin is not None and origin.profile:
        header.append(f"# site profile: {' '.join(str(Path(origin.profile).resolve()).splitlines())}")
        given = ", ".join(origin.given_by_profile()) or "nothing (the spec set every key it has)"
        header += textwrap.wrap(given, 110, initial_indent="#   gave: ", subsequent_indent="#   ")
    data = spec.model_dump(mode="json")
    if spec.llm_api is not None:  # only the arguments given: loaded again, the rest stays TensorRT-LLM's default
        data["llm_api"] = spec.llm_api.arguments()
    body = yaml.safe_dump(data, sort_keys=False)
    return "\n".join(header) + "\n" + body
