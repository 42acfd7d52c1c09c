"""What `hpc-serve bench` shows and writes: a rich table on the terminal, and into `--output-dir` the summary
(`summary.json`: the run's settings and numbers, one entry per sweep point), every request
(`requests.csv`, one row each, the sweep point's value in its first column) and the plots (hpc/bench/plots.py).

Why JSON and CSV both: the JSON is what a script compares between runs (one file, nested numbers); the CSV is
what a person opens in a spreadsheet or pandas to look at single requests.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from hpc.bench.stats import PERCENTILES, RequestRecord
from hpc.serving.engine_timing import PARTS


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


#: the latency split's rows (hpc/serving/engine_timing.py PARTS)
PART_NAMES = ("  outside the engine", "  queueing", "  prefill", "  decode")


def _split(summary: dict[str, Any], part: str) -> str:
    found = summary.get("latency_split_ms")
    return "-" if not found else f"{_ms(found[part]['p50'])} / {_ms(found[part]['p90'])}"


def summary_table(points: list[tuple[str, dict[str, Any]]], title: str) -> Table:
    """One column per run (sweep point), one row per number."""
    table = Table(title=title, show_lines=False)
    table.add_column("", style="bold")
    for label, _ in points:
        table.add_column(label, justify="right")

    def row(name: str, cells: list[str]) -> None:
        table.add_row(name, *cells)

    summaries = [s for _, s in points]
    row("requests ok / sent", [f"{s['completed']} / {s['requests']}" for s in summaries])
    row("duration s", [f"{s['duration_s']:.2f}" for s in summaries])
    row("requests/s", [f"{s['requests_per_s']:.2f}" for s in summaries])
    row("output tokens/s", [f"{s['output_tokens_per_s']:,.1f}" for s in summaries])
    for key, name in (("latency_ms", "latency"), ("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT")):
        for stat in ("mean", *(f"p{p}" for p in PERCENTILES)):
            row(f"{name} {stat} ms", [_ms(s[key][stat]) for s in summaries])
    if any("latency_split_ms" in s for s in summaries):
        for part, name in zip(PARTS, PART_NAMES, strict=True):
            row(f"{name} p50 / p90 ms", [_split(s, part) for s in summaries])
    if any("goodput" in s for s in summaries):
        row(
            "goodput req/s (share)",
            [f"{g['requests_per_s']:.2f} ({g['share']:.0%})" if (g := s.get("goodput")) else "-" for s in summaries],
        )
    row(
        "errors",
        [", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "none" for s in summaries],
    )
    return table


def write_outputs(
    out: Path, settings: dict[str, Any], points: list[tuple[str, dict[str, Any], list[RequestRecord]]]
) -> list[Path]:
    """summary.json and requests.csv under `out` (made if missing); returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    summary = out / "summary.json"
    summary.write_text(
        json.dumps({"settings": settings, "runs": [{"point": p, **s} for p, s, _ in points]}, indent=2) + "\n"
    )
    rows = out / "requests.csv"
    with rows.open("w", newline="") as handle:
        writer: csv.DictWriter | None = None
        for point, _, records in points:
            for record in records:
                row = {"point": point, **record.to_row()}
                if writer is None:
                    writer = csv.DictWriter(handle, fieldnames=list(row))
                    writer.writeheader()
                writer.writerow(row)
    return [summary, rows]
