"""The documentation (README.md, DEVELOPERS.md, docs/): the README stays a front door, docs/spec.md is what the
schema says now, every spec field says what it does, and no link or path in the docs points at nothing.

Why: the docs name files, lines and sections of a tree that moves under them; a reader who follows a dead link
stops trusting the rest. `UPDATE_GOLDEN=1` rewrites docs/spec.md (as for tests/test_build_golden.py)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from hpc.spec.reference import fields, render, sections

ROOT = Path(__file__).resolve().parent.parent
SPEC_DOC = ROOT / "docs" / "spec.md"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
#: the tree's top folders: a backticked reference that starts with one of them must exist
TOP = ("hpc", "launcher", "backend", "tests", "scripts", "configs", "ci", "benchmarks", "docs")
PATH_REF = re.compile(rf"^(?:{'|'.join(TOP)})/[\w./*\-]*(?::(\d+))?$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
#: a README section named from code: README, then a quoted section name, or a colon and a capitalised one
README_SECTION = re.compile(r"\bREADME(?:\.md)?(?: \"|: [A-Z])")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "DEVELOPERS.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a markdown file outside fenced code blocks: what a reader sees as text."""
    fence = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        marker = re.match(r"^\s*(```+|~~~+)", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * 3
            elif marker.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation (backticks, colons, parentheses, ...) dropped,
    spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, a repeated heading's as GitHub numbers them (`-1`, `-2`, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose(path):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return found


def broken_link(source: Path, target: str) -> str | None:
    """Why a relative link from `source` leads nowhere, or None when it leads somewhere."""
    if re.match(r"^[a-z][a-z0-9+.\-]*:", target):  # http:, https:, mailto:
        return None
    file_part, _, anchor = target.partition("#")
    path = (source.parent / file_part).resolve() if file_part else source
    if not path.exists():
        return f"link to {target}: {file_part} does not exist"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"link to {target}: {path.relative_to(ROOT)} has no heading #{anchor}"
    return None


def broken_path(reference: str) -> str | None:
    """Why a backticked tree path (`path`, `path:LINE`, `dir/*.yaml`) names nothing, or None."""
    match = PATH_REF.match(reference)
    if match is None:
        return None
    name = reference.split(":")[0]
    found = sorted(ROOT.glob(name)) if "*" in name else [ROOT / name] if (ROOT / name).exists() else []
    if not found:
        return f"`{reference}`: {name} does not exist"
    if match.group(1) is not None and found[0].is_file():
        lines = len(found[0].read_text(errors="replace").splitlines())
        if lines < int(match.group(1)):
            return f"`{reference}`: {name} has {lines} lines"
    return None


def broken_references(path: Path) -> list[str]:
    """FILE:LINE: what is broken, for every link and backticked path of one markdown file."""
    problems = []
    where = path.relative_to(ROOT)
    for number, line in prose(path):
        spans = [span for _, span in CODE_SPAN.findall(line)]
        outside = CODE_SPAN.sub("", line)
        for problem in [broken_link(path, target) for target in LINK.findall(outside)] + [
            broken_path(span.strip()) for span in spans
        ]:
            if problem:
                problems.append(f"{where}:{number}: {problem}")
    return problems


def test_readme_is_a_front_door():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines; move a concern to docs/ (at most 250)"


def test_links_and_paths_in_the_docs_exist():
    problems = [problem for path in doc_files() for problem in broken_references(path)]
    assert not problems, "broken references in the docs:\n" + "\n".join(problems)


def test_code_names_no_readme_section():
    """README is a front door: a comment or docstring that sends a reader to a section names the docs page."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for top in ("hpc", "launcher", "backend", "tests")
        for path in sorted((ROOT / top).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if README_SECTION.search(line) and "TensorRT-LLM's README" not in line
    ]
    assert not found, "README sections named in code (name the docs/ page instead):\n" + "\n".join(found)


def test_every_spec_field_has_a_description():
    missing = [
        dotted
        for path, model in sections()
        for dotted, field in fields(model, path)
        if not (field.description or "").strip()
    ]
    assert not missing, f"spec fields without Field(description=...): {missing}"


def test_spec_reference_is_what_the_schema_says():
    text = render()
    if UPDATE:
        SPEC_DOC.write_text(text)
    assert SPEC_DOC.read_text() == text, (
        "docs/spec.md is not what the schema says: `python -m hpc.spec.reference > docs/spec.md` "
        "(or UPDATE_GOLDEN=1 pytest tests/test_docs.py)"
    )


#: a file of the tree named in code (a docstring, a comment, a message): `hpc/x.py`, `launcher/y.py:12`
SOURCE_REF = re.compile(
    rf"(?<![\w/.])((?:{'|'.join(TOP)})/[\w/\-]+\.(?:py|md|sh|j2|yaml|c|txt|pbtxt))(?![\w.])(?::(\d+))?"
)


def test_every_file_the_code_names_exists():
    """The code's own references (`see launcher/contracts/layout.py`, `hpc/jobs/chain.py:40`) lead somewhere,
    even after the file they name moved or lost the line."""
    sources = [
        p
        for folder in ("hpc", "launcher", "backend", "tests", "scripts", "benchmarks")
        for p in (ROOT / folder).rglob("*")
        if p.is_file()
        and p.suffix in (".py", ".sh", ".j2")
        and "golden" not in p.parts
        and p != Path(__file__).resolve()  # this file's examples of broken references
    ]
    broken = []
    for source in sources:
        for number, line in enumerate(source.read_text().splitlines(), 1):
            for match in SOURCE_REF.finditer(line):
                target = ROOT / match.group(1)
                where = f"{source.relative_to(ROOT)}:{number}: {match.group(0)}"
                if not target.exists():
                    broken.append(f"{where} does not exist")
                elif match.group(2) and int(match.group(2)) > len(target.read_text().splitlines()):
                    broken.append(f"{where} is past its end")
    assert not broken, "\n".join(broken)
