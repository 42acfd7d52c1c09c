"""A doctor's findings: one `Check` each (what, result, the exact fix), the table, the exit code.

Why four results and not two: a check that cannot apply (no account in the spec, no GPUs asked for) is
`skip` with its reason, and something that works but costs you (accounting off: finished jobs are known only
for Slurm's MinJobAge) is `warn`. Only `fail` makes the exit code 1, and every `fail` carries a fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

Status = Literal["ok", "warn", "fail", "skip"]
_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


@dataclass(frozen=True)
class Check:
    """One finding: `name` (what was checked), `status`, `detail` (what was found), `fix` (for warn and fail:
    what to change, naming the spec field or the command)."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status == "fail" and not self.fix:
            raise ValueError(f"check {self.name!r} fails without a fix")


def ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name, "warn", detail, fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, "fail", detail, fix)


def skip(name: str, why: str) -> Check:
    return Check(name, "skip", why)


def exit_code(checks: Iterable[Check]) -> int:
    """0 when nothing failed, else 1."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def table(checks: list[Check], title: str) -> Table:
    """check | result | what was found | fix (the column only when a check has one)."""
    out = Table(title=title, show_lines=False, expand=False)
    out.add_column("check", no_wrap=True)
    out.add_column("result", no_wrap=True)
    out.add_column("found", overflow="fold")
    fixes = any(c.fix for c in checks)
    if fixes:
        out.add_column("fix", overflow="fold")
    for c in checks:
        row: list[str | Text] = [c.name, Text(c.status, style=_STYLE[c.status]), c.detail]
        out.add_row(*row, *([c.fix] if fixes else []))
    return out


def print_report(checks: list[Check], title: str, console: Console | None = None) -> None:
    """The table, then the fixes again as plain lines (a terminal too narrow for the table still shows them
    whole, and they can be copied)."""
    console = console or Console()
    console.print(table(checks, title))
    failed = [c for c in checks if c.status == "fail"]
    for c in failed:
        console.print(f"FAIL {c.name}: {c.detail}\n  fix: {c.fix}", markup=False, highlight=False, soft_wrap=True)
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail", "skip")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    console.print(f"doctor: {summary}", markup=False, highlight=False)
