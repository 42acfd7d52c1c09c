"""When each request of `hpc-serve bench` is sent: seconds after the start, from a seed.

Why a schedule made up front and not sleeps between sends: the load generator sends at these times whatever
the server does (an open loop), so a slow server shows up as latency and queueing, not as a lower offered
rate; a closed loop (send when the last one finished) hides exactly the overload one is sizing for. Poisson
arrivals (exponential gaps) are how independent users arrive; constant spacing isolates the server's own
variance; all at once (rate inf) measures the peak a deployment absorbs, bounded by `--concurrency`.
"""

from __future__ import annotations

import math
import random

PATTERNS = ("poisson", "constant")


def arrival_times(count: int, rate: float, pattern: str = "poisson", seed: int = 0) -> list[float]:
    """`count` send times in seconds from the start, increasing; `rate` requests per second (inf: all at 0)."""
    if pattern not in PATTERNS:
        raise ValueError(f"--arrivals {pattern!r}: one of {', '.join(PATTERNS)}")
    if not rate > 0:
        raise ValueError(f"--request-rate {rate}: requests per second, more than 0 (inf: all at once)")
    if math.isinf(rate):
        return [0.0] * count
    if pattern == "constant":
        return [i / rate for i in range(count)]
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times
