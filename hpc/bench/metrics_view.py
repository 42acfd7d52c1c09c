"""What `hpc-serve metrics TARGET` prints: every metric per replica and summed, or with `--watch S` a table of
rates (requests/s, tokens/s, mean queue time, KV-cache use, active and waiting requests) that rich.live
redraws in place every S seconds, one row per replica and one for the deployment.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Column, Table

from hpc.bench.replica_metrics import Rates, Snapshot, rates, summable, summed, take
from hpc.bench.tables import compact_table
from launcher.contracts.records import EndpointRecord


def _num(value: float | None, fmt: str | None = None) -> str:
    if value is None:
        return "-"
    if fmt is None:
        fmt = "{:,.0f}" if float(value).is_integer() else "{:,.4g}"
    return fmt.format(value)


def snapshot_table(snapshot: Snapshot) -> Table:
    """metric × (each replica, total)."""
    replicas = sorted(snapshot.values)
    # folded, not cut: at 80 columns (or piped) the names ended in "…" and eight rows read the same
    names = (Column("metric", overflow="fold"), Column("labels", overflow="fold"))
    table = Table(*names, *replicas, "total", title="hpc-serve metrics: per replica and summed")
    for key in snapshot.keys():
        name, _, labels = key.partition("{")
        cells = [_num(snapshot.values[r].get(key)) for r in replicas]
        table.add_row(name, labels.rstrip("}"), *cells, _num(snapshot.total(key)) if summable(key) else "-")
    for replica, why in sorted(snapshot.errors.items()):
        table.add_row(f"[red]{replica} did not answer[/red]", why, *[""] * len(replicas))
    return table


def _kv(r: Rates) -> str:
    if r.kv_used is None or not r.kv_max:
        return "-"
    return f"{r.kv_used:,.0f} / {r.kv_max:,.0f} ({r.kv_used / r.kv_max:.0%})"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def rates_table(before: Snapshot, now: Snapshot) -> Table:
    seconds = now.at - before.at
    rows: list[tuple[str, Rates]] = []
    for replica in sorted(now.values):
        if replica in before.values:
            rows.append((replica, rates(now.values[replica], before.values[replica], seconds)))
    total = rates(summed(now), summed(before), seconds)
    headers = (
        "replica",
        "req/s",
        "failed/s",
        "tokens/s",
        "queue ms",
        "active",
        "waiting",
        "KV blocks used",
        "in flight (gw)",
        "KV reuse (gw)",
    )
    cells: list[tuple[str, ...]] = [
        (
            name,
            _num(r.requests_per_s, "{:,.2f}"),
            _num(r.failures_per_s, "{:,.2f}"),
            _num(r.tokens_per_s, "{:,.1f}"),
            _num(r.queue_ms, "{:,.2f}"),
            _num(r.active, "{:,.0f}"),
            _num(r.waiting, "{:,.0f}"),
            _kv(r),
            _num(r.in_flight, "{:,.0f}"),
            "idle" if r.kv_reuse is None and r.in_flight is not None else _share(r.kv_reuse),  # a gateway, no request
        )
        for name, r in [*rows, ("total", total)]
    ]
    styles: list[str | None] = [None] * len(rows) + ["bold"]
    for replica, why in sorted(now.errors.items()):
        cells.append((f"[red]{replica}[/red]", f"[red]no answer: {why}[/red]"))
        styles.append(None)
    table = compact_table(
        headers,
        cells,
        keep=2,
        styles=styles,
        title=f"hpc-serve metrics --watch: rates over the last {seconds:.1f} s ({time.strftime('%H:%M:%S')})",
        caption=f"tokens: {total.token_source}; columns without a figure are left out",
    )
    return table


def watch(
    endpoints: Sequence[EndpointRecord],
    every_s: float,
    console: Console,
    count: int | None = None,
    gateway_url: str | None = None,
) -> None:
    """Redraw the rates table every `every_s` seconds until Ctrl-C (or `count` refreshes)."""
    before = take(endpoints, gateway_url=gateway_url)
    done = 0
    with Live(
        Table(title=f"hpc-serve metrics: first rates in {every_s:g} s"), console=console, auto_refresh=False
    ) as live:
        while count is None or done < count:
            time.sleep(max(0.0, before.at + every_s - time.monotonic()))
            now = take(endpoints, gateway_url=gateway_url)
            live.update(rates_table(before, now), refresh=True)
            before, done = now, done + 1
