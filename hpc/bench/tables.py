"""Terminal tables that fit: a column whose every cell is empty (or `-`, nothing measured) is left out before
any word is cut, and the headers are never cut (a column narrower than its header is wrapped in its cells).
Why: at 80 columns rich shrinks every column alike, so `metrics --watch` printed `repl…`, `requ…` and columns of
`-` on a workflow that has no such figure; `list` likewise. Used by `metrics` and `list`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Column, Table

#: a cell that says nothing was measured
EMPTY_CELLS = frozenset({"", "-"})


def compact_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    keep: int = 1,
    styles: Sequence[str | None] = (),
    **kw: Any,
) -> Table:
    """A rich Table of `rows` without the columns (after the first `keep`) that are empty in every row; `styles`:
    one row style each (or none). `kw` go to Table (title, caption)."""
    shown = [
        i for i, _ in enumerate(headers) if i < keep or any(i < len(row) and row[i] not in EMPTY_CELLS for row in rows)
    ]
    columns = [Column(headers[i], min_width=min(len(headers[i]), 12), overflow="fold") for i in shown]
    table = Table(*columns, **kw)
    for n, row in enumerate(rows):
        table.add_row(*(row[i] if i < len(row) else "" for i in shown), style=styles[n] if n < len(styles) else None)
    return table
