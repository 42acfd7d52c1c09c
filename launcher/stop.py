"""How a follower rank stops: wait (bounded) for its leader's release, then fall back to ending it ourselves.

Why a follower does not just pass SIGTERM on, like the leader: Slurm (scancel, the time limit) signals every
process of the step at once. A follower's tritonserver is still "loading" its model (the CPU engine's follower
loop, or a TensorRT-LLM worker, sits in ``initialize()``), and tritonserver installs its SIGTERM handler only once
loading is done, so a SIGTERM ends it outright: the follower leaves before its leader has stopped, the leader's
last broadcast and MPI_Finalize wait on a peer that is gone, and the step is torn down as aborted. So the
launcher starts a follower's tritonserver with the stop signals ignored (:data:`FOLLOWER_IGNORES`) and, on a
stop signal, waits for the leader: the leader's model releases its followers when it unloads (their model
touches the release file and ends the rank). A follower gives up waiting after ``release_wait_s``, or soon after
its leader's rank record shows that the leader is gone without releasing it; it then sends SIGTERM (enough for a
follower whose models did finish loading) and SIGKILL to the process group ``kill_after_s`` later.

Pure logic with an injectable clock, so the bounds are unit-tested without sleeping.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

#: stop signals that Slurm may send to every process of a step; a follower's tritonserver ignores them all
FOLLOWER_IGNORES = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
#: tritonserver handles SIGINT/SIGTERM (once loaded) but dies of SIGHUP/SIGUSR1 (e.g. sbatch --signal=USR1@60):
#: a leader's tritonserver ignores those, and the launcher forwards them as SIGTERM instead
LEADER_IGNORES = (signal.SIGHUP, signal.SIGUSR1)

WAIT, TERM, KILL = "wait", "term", "kill"


class FollowerStop:
    """The follower's side of an ordered stop: ``begin()`` on the first stop signal, then ``action()`` on every
    poll says what to do now: WAIT, TERM (once) or KILL (once), with the reason."""

    def __init__(
        self,
        release_wait_s: float,
        release_file: Path,
        leader_record: Path | None,
        *,
        leader_gone_s: float = 3.0,
        kill_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.release_wait_s = release_wait_s
        self.release_file = release_file
        self.leader_record = leader_record
        self.leader_gone_s = leader_gone_s  # the release is written before the leader ends: a short grace
        self.kill_after_s = kill_after_s
        self.clock = clock
        self.deadline: float | None = None
        self.reason = ""
        self.termed_at: float | None = None
        self.killed = False

    @property
    def started(self) -> bool:
        return self.deadline is not None

    def begin(self, wait_s: float | None = None) -> None:
        """A stop was asked for: from now on wait at most ``wait_s`` (default ``release_wait_s``)."""
        wait_s = self.release_wait_s if wait_s is None else wait_s
        deadline = self.clock() + wait_s
        if self.deadline is None or deadline < self.deadline:
            self.deadline = deadline
            self.reason = f"no release from the leader within {wait_s:g} s"

    def action(self) -> tuple[str, str]:
        """What to do at this poll: (WAIT | TERM | KILL, why)."""
        if self.deadline is None or self.killed:
            return WAIT, ""
        now = self.clock()
        if self.termed_at is not None:
            if now - self.termed_at >= self.kill_after_s:
                self.killed = True
                return KILL, f"still running {self.kill_after_s:g} s after SIGTERM"
            return WAIT, ""
        if not self.release_file.exists() and self.leader_record is not None and self.leader_record.exists():
            gone = now + self.leader_gone_s
            if gone < self.deadline:
                self.deadline = gone
                self.reason = "the leader ended without releasing this rank"
        if now >= self.deadline:
            self.termed_at = now
            return TERM, self.reason
        return WAIT, ""
