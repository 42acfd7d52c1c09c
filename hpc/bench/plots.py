"""The PNGs of `hpc-serve bench --output-dir`: latency and TTFT distributions, a per-request timeline, and for a
sweep the throughput-vs-latency curve (the one plot that answers "how much load at what latency").

Why matplotlib's Agg backend, chosen here: a login node has no display, and the plots must be written, not
shown. Why histograms with percentile lines rather than box plots: the tail (p90, p99) is what an SLO is
about, and a person reads the lines' labels without knowing box-plot conventions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpc.bench.stats import RequestRecord
from hpc.serving.engine_timing import PARTS

#: why --output-dir writes no plots on this machine, said before the run starts (the numbers are written anyway)
NO_MATPLOTLIB = "no plots: they need matplotlib (pip install 'hpc-serve[bench]'); the numbers are written all the same"


def missing() -> str | None:
    """Why the plots cannot be drawn here, or None: asked before a run, so that nothing measured waits on it (an
    import, not a look-up: a broken install fails here too)."""
    try:
        _pyplot()
    except ImportError:
        return NO_MATPLOTLIB
    return None


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError(NO_MATPLOTLIB) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _histogram(ax, values_ms: list[float], what: str) -> None:
    import numpy as np

    if not values_ms:
        ax.text(0.5, 0.5, f"no {what} (no request completed)", ha="center", va="center", transform=ax.transAxes)
        return
    ax.hist(values_ms, bins=min(50, max(10, len(values_ms) // 5)), color="#4878a8", alpha=0.85)
    for p, style in ((50, "-"), (90, "--"), (99, ":")):
        value = float(np.percentile(values_ms, p))
        ax.axvline(value, color="#c03030", linestyle=style, label=f"p{p} {value:,.1f} ms")
    ax.set_xlabel(f"{what} (ms)")
    ax.set_ylabel("requests")
    ax.legend()


def distributions(records: list[RequestRecord], path: Path, title: str) -> Path:
    """Latency and TTFT histograms side by side, with p50/p90/p99 marked."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    _histogram(left, [r.latency * 1000 for r in records if r.ok and r.latency is not None], "latency")
    left.set_title("request latency (send → last token)")
    _histogram(right, [r.ttft * 1000 for r in records if r.ok and r.ttft is not None], "time to first token")
    right.set_title("time to first token")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_split(records: list[RequestRecord], path: Path, title: str) -> Path | None:
    """Where each request's time went (hpc/serving/engine_timing.py): one stacked bar per request, in sending
    order, outside the engine / queueing / prefill / decode. None (nothing written) without the engine's
    timestamps (the engine workflow's model reports none)."""
    rows = [(r.index, parts) for r in records if (parts := r.parts) is not None]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 4.5))
    bottom = [0.0] * len(rows)
    for part, color in zip(PARTS, ("#a0a0a0", "#f0b040", "#c03030", "#30609a"), strict=True):
        heights = [parts[part] * 1000 for _, parts in rows]
        ax.bar(range(len(rows)), heights, bottom=bottom, width=1.0, color=color, label=part)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xlabel("request (sending order)")
    ax.set_ylabel("ms")
    ax.set_title(f"{title}: latency split (outside the engine, queueing, prefill, decode)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline(records: list[RequestRecord], path: Path, title: str) -> Path:
    """One horizontal line per request: waiting for its first token (light), streaming (dark), failed (red x)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, max(3.0, min(10.0, len(records) * 0.03 + 2))))
    for r in records:
        if r.ok and r.first is not None and r.end is not None:
            ax.hlines(r.index, r.sent, r.first, color="#f0b040", linewidth=1.5)
            ax.hlines(r.index, r.first, r.end, color="#30609a", linewidth=1.5)
        else:
            ax.plot([r.sent], [r.index], "x", color="#c03030", markersize=4)
    ax.plot([], [], color="#f0b040", label="waiting for first token")
    ax.plot([], [], color="#30609a", label="streaming")
    if any(not r.ok for r in records):
        ax.plot([], [], "x", color="#c03030", label="failed")
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("request")
    ax.set_title(title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_curve(points: list[tuple[str, dict[str, Any]]], path: Path, title: str) -> Path:
    """Output tokens/s against p50 and p99 latency, one marker per sweep point, labelled with its value."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = [s["output_tokens_per_s"] for _, s in points]
    for ax, key, what in ((left, "latency_ms", "request latency"), (right, "ttft_ms", "time to first token")):
        for stat, style in (("p50", "o-"), ("p99", "s--")):
            ys = [s[key][stat] if s[key][stat] is not None else float("nan") for _, s in points]
            ax.plot(xs, ys, style, label=stat)
            if stat == "p50":
                for (label, _), x, y in zip(points, xs, ys, strict=True):
                    ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 6), fontsize=8)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{what} (ms)")
        ax.set_title(f"throughput vs {what}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: how each autoscaling action is drawn on the load's timeline (marker, colour)
_ACTION_STYLE = {
    "submit": ("^", "#2a8a3a"),
    "cancel": ("x", "#c03030"),
    "drain": ("v", "#30609a"),
    "expire": ("v", "#e08020"),
}


#: how each phase's jobs are drawn in the jobs-over-time band (a Sample field, its label, its colour)
_PHASE_STYLE = (
    ("ready", "READY", "#4a9a5a"),
    ("starting", "STARTING", "#a8d5a0"),
    ("pending", "PENDING", "#e8c860"),
    ("draining", "draining or expiring", "#9ab0d0"),
)


#: room above the data for the two legends (jobs on the left, load and acts on the right)
_HEADROOM = 1.45


def autoscale_timeline(decisions: list[Any], path: Path, title: str, samples: list[Any] | None = None) -> Path:
    """The autoscaling controller's record as a picture: its jobs over time, stacked by phase (`samples`, one a
    look; a record without them has no band), against the load signal (requests in flight per READY replica) and
    its target on the right-hand axis, and each act (a job submitted, cancelled, drained, left to expire) where it
    came, labelled with its job; advised-only acts hollow. `decisions`, `samples`: launcher/contracts/autoscale.py
    DecisionRecords and Samples."""
    plt = _pyplot()
    fig, jobs_ax = plt.subplots(figsize=(12, 5))
    samples = list(samples or ())
    start = min([d.at for d in decisions[:1]] + [s.at for s in samples[:1]], default=0.0)
    if samples:
        xs = [s.at - start for s in samples]
        jobs_ax.stackplot(
            xs,
            *[[getattr(s, name) for s in samples] for name, _, _ in _PHASE_STYLE],
            labels=[label for _, label, _ in _PHASE_STYLE],
            colors=[colour for _, _, colour in _PHASE_STYLE],
            step="post",
            alpha=0.8,
        )
        top = max(s.pending + s.starting + s.ready + s.draining for s in samples)
        jobs_ax.set_ylim(0, (max(1, top) + 0.5) * _HEADROOM)
        jobs_ax.yaxis.get_major_locator().set_params(integer=True)
        jobs_ax.legend(loc="upper left", title="jobs")
    jobs_ax.set_ylabel("jobs")
    jobs_ax.set_xlabel("seconds since the record's first look")
    ax = jobs_ax.twinx()  # the load on its own axis: requests per replica, not jobs
    if samples:
        ax.plot(xs, [s.signal for s in samples], "-", color="#404040", label="requests in flight per READY replica")
        ax.step(xs, [s.target for s in samples], where="post", color="#909090", linestyle="--", label="target")
    else:  # a record from before the samples: the signal at each recorded decision
        at = [d.at - start for d in decisions]
        ax.plot(at, [d.signal for d in decisions], "-", color="#404040", label="requests in flight per READY replica")
        ax.step(at, [d.target for d in decisions], where="post", color="#909090", linestyle="--", label="target")
    for action, (marker, colour) in _ACTION_STYLE.items():
        acts = [(d.at - start, d) for d in decisions if d.action == action]
        if not acts:
            continue
        ax.scatter(
            [x for x, _ in acts],
            [d.signal for _, d in acts],
            marker=marker,
            s=80,
            color=colour,
            facecolors=["none" if d.advisory else colour for _, d in acts] if marker != "x" else None,
            label=action,
            zorder=3,
        )
        for x, d in acts:
            ax.annotate(d.job_id, (x, d.signal), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set_ylabel("requests per replica")
    ax.set_ylim(0, ax.get_ylim()[1] * _HEADROOM)
    ax.set_title(title)
    jobs_ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
