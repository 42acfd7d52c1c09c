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

from launcher.contracts.stop_records import DRAINED, DrainReport
from launcher.contracts.text_enum import TextEnum

#: stop signals that Slurm may send to every process of a step; a follower's tritonserver ignores them all
FOLLOWER_IGNORES = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
#: tritonserver handles SIGINT/SIGTERM (once loaded) but dies of SIGHUP/SIGUSR1 (e.g. sbatch --signal=USR1@60):
#: a leader's tritonserver ignores those, and the launcher forwards them as SIGTERM instead
LEADER_IGNORES = (signal.SIGHUP, signal.SIGUSR1)


class Action(TextEnum):
    """What a follower's supervisor does at a poll (``FollowerStop.action``): wait on, SIGTERM, or SIGKILL."""

    WAIT = "wait"
    TERM = "term"
    KILL = "kill"


WAIT, TERM, KILL = Action.WAIT, Action.TERM, Action.KILL


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

    def action(self) -> tuple[Action, str]:
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


#: a leader's launcher with this set to 1 does not ask its model to report its drain (no ``drain_file`` in the stop
#: file): the stop then goes by tritonserver's metrics, as for TensorRT-LLM, whose backend writes no drain file;
#: how that path is tested with the CPU engine
DRAIN_BY_METRICS_ENV = "HPC_SERVE_DRAIN_BY_METRICS"
#: a model that does not report its drain: nothing may be in flight for this long before the SIGTERM (an
#: ensemble's last `postprocessing` step runs just after the engine's request ended)
SETTLE_S = 1.0
#: how often, and how patiently, the metrics port is read while draining (the supervisor polls every 0.2 s)
METRICS_POLL_S = 0.25
METRICS_TIMEOUT_S = 0.5


def metrics_in_flight(url: str, timeout_s: float = METRICS_TIMEOUT_S) -> Callable[[], int | None]:
    """A probe of requests in flight on one tritonserver, from its own metrics page (`url`): the engine's active
    and waiting requests (``nv_trt_llm_request_metrics``, exported by TensorRT-LLM's backend and the CPU engine
    alike) and tritonserver's queues (``nv_inference_pending_request_count``); None when it cannot say."""
    from launcher.contracts.renew_plan import active_requests
    from launcher.contracts.urls import open_direct

    def probe() -> int | None:
        try:
            with open_direct(url, timeout=timeout_s) as response:
                return active_requests(response.read().decode("utf-8", "replace"))
        except (OSError, ValueError):
            return None

    return probe


class LeaderDrain:
    """The leader's side of an ordered stop: hold tritonserver's SIGTERM back until nothing is in flight.

    Why: tritonserver 2.51, once SIGTERMed, stops every model's scheduler, including the steps of an ensemble
    that is still streaming (each streamed token is a new request to ``postprocessing``): those are refused,
    the ensemble never completes, counts as "in flight" until ``--exit-timeout-secs`` runs out, and tritonserver
    exits 1 ("Exit timeout expired"): the job reads FAILED. Its own in-flight count does not see the decoupled
    ``tensorrt_llm`` requests either. So the model drains *before* the SIGTERM, and the SIGTERM comes once
    nothing is in flight, which is known one of two ways:

    - the model says so: once it sees the stop file it refuses new requests, finishes (or fails, before
      ``drain_until``) what is in flight, and writes ``{"state": "drained"}`` to ``drain_file`` (the CPU engine);
    - a model that says nothing within ``ack_s`` (TensorRT-LLM's backend knows nothing of our files): the
      server's own metrics (``in_flight``, :func:`metrics_in_flight`) must read 0 for ``settle_s``. Clients of
      hpc-serve send it nothing new from the stop file on (the gateway and ``hpc.client`` see it), so what is in
      flight runs out. Without a probe, or when it cannot say, the SIGTERM comes at once, as before.

    ``release()`` on every poll: True once the SIGTERM is due (then never again)."""

    def __init__(
        self,
        drain_file: Path,
        drain_until: float,
        *,
        ack_s: float,
        in_flight: Callable[[], int | None] | None = None,
        settle_s: float = SETTLE_S,
        poll_s: float = METRICS_POLL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.drain_file = drain_file
        self.drain_until = drain_until  # epoch seconds, the stop file's drain_until
        self.in_flight = in_flight
        self.settle_s = settle_s
        self.poll_s = poll_s
        self.clock = clock
        self.ack_by = clock() + ack_s
        self.released = False
        self.reason = ""
        self._next_probe = 0.0
        self._idle_since: float | None = None  # when the metrics last began to read 0

    def state(self) -> str | None:
        report = DrainReport.read(self.drain_file)
        return None if report is None else str(report.state)

    def _idle(self, now: float) -> str | None:
        """Why the SIGTERM is due for a model that does not report its drain, or None to wait on."""
        if self.in_flight is None:
            return "the model does not drain itself"
        if now < self._next_probe:
            return None
        self._next_probe = now + self.poll_s
        count = self.in_flight()
        if count is None:
            return "the model does not drain itself and its metrics do not say what is in flight"
        if count > 0:
            self._idle_since = None
            return None
        if self._idle_since is None:
            self._idle_since = now
        return (
            f"nothing in flight for {self.settle_s:g} s (tritonserver's metrics)"
            if now - self._idle_since >= self.settle_s
            else None
        )

    def release(self) -> bool:
        if self.released:
            return False
        state, now = self.state(), self.clock()
        if state == DRAINED:
            self.reason = "the model drained"
        elif state is None and now >= self.ack_by and (idle := self._idle(now)):
            self.reason = idle
        elif now >= self.drain_until:
            self.reason = "the drain time ran out"
        else:
            return False
        self.released = True
        return True
