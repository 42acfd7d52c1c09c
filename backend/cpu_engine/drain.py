"""How a stopping leader's engine drains: the rules, apart from the loop that applies them (engine.py).

Once its launcher wrote the stop file (``drain_deadline()`` turns from None into epoch seconds), the engine
refuses new requests at once (a clear error: the client retries elsewhere), lets those in flight finish, fails
what is left ``DRAIN_MARGIN_S`` before the deadline, and says "drained" once nothing is in flight: only then does
the launcher SIGTERM tritonserver (launcher/node/stop.py LeaderDrain: a SIGTERM during a streaming ensemble leaves it
hanging), whose unload then releases the followers while the ranks are still allowed to stop in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.contracts.stop_records import DRAINED, DRAINING

from ..refusals import CPU_STOPPING

DRAIN_CHECK_S = 0.25  # how often the loop looks at the stop file (cheap: a stat and a small read)
DRAIN_MARGIN_S = 2.0  # fail what is left this long before the drain deadline: the unload and release need it
#: the drain's own state between DRAINING and DRAINED (the launcher is told those two: launcher/contracts/stop_records.py)
FAILED = "failed"

STOPPING = f"{CPU_STOPPING}; retry on another replica or job"
RAN_OUT = f"{CPU_STOPPING} (its drain time ran out); retry on another replica or job"


@dataclass
class Drain:
    """The drain's state: "" serving, "draining" (refusing new requests), "failed" (the time ran out: what was
    left failed), "drained" (nothing in flight; said once)."""

    state: str = ""

    def advance(self, deadline: float | None, now_epoch: float, in_flight: Callable[[], int]) -> list[str]:
        """What changed at this check, in order: "draining" (refuse from now on, tell the launcher), "failed"
        (fail everything now), "drained" (tell the launcher). Empty while serving or once drained."""
        if self.state == DRAINED or deadline is None:
            return []
        changes = []
        if not self.state:
            self.state = DRAINING
            changes.append(DRAINING)
        if self.state == DRAINING and now_epoch >= deadline - DRAIN_MARGIN_S:
            self.state = FAILED
            changes.append(FAILED)
        if not in_flight():
            self.state = DRAINED
            changes.append(DRAINED)
        return changes
