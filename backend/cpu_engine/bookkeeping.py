"""What both leader-side engines keep of their requests: the CPU engine (engine.py) and the simulated one
(backend/sim_engine/engine.py). Queueing from any thread, cancelling by id, refusing while stopping or broken, the
drain's rules (drain.py), the heartbeat to the other ranks, finishing a request and failing what is left are the
same for both; a subclass says only how its requests wait and run, and how a step is computed or timed.

Threading as in engine.py: `submit` and `cancel` from any thread; the rest on the engine thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence

from launcher.contracts.stop_records import DRAINED, DRAINING

from .drain import DRAIN_CHECK_S, FAILED, RAN_OUT, STOPPING, Drain
from .follower import PING, STOP
from .parallel import Communicator, PeerGone, drain_deadline, report_drain
from .scheduler import GenerationOutput, GenerationRequest, RecentlyFinished
from .stats import EngineStats


class Bookkeeping(ABC):
    """A leader-side engine's requests from `submit` to their final output; the loop and the step are the
    subclass's."""

    #: the engine thread's name, and the logger its bookkeeping speaks through
    thread_name = "cpu-engine"
    log = logging.getLogger("hpc_serve.cpu_engine")

    def __init__(self, comm: Communicator, heartbeat_s: float) -> None:
        self.comm = comm
        self.heartbeat_s = heartbeat_s
        self._incoming: queue.SimpleQueue[GenerationRequest] = queue.SimpleQueue()
        self._cancel_ids: set[str] = set()
        self._finished_ids = RecentlyFinished()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refusing: str | None = None  # why new requests are answered with an error at once
        self._stopped_followers = False
        self.completed = 0
        self.iterations = 0
        self.on_step: Callable[[EngineStats], None] | None = None  # e.g. Prometheus gauges, after every step
        #: epoch seconds by which in-flight work must be done once stopping (None: not stopping); see _enforce_drain
        self.drain_deadline: Callable[[], float | None] | None = drain_deadline
        #: tells the stopping launcher "draining" / "drained" (parallel.report_drain; injectable for tests)
        self.report_drain: Callable[[str], None] = report_drain
        self._drain = Drain()
        self._next_drain_check = 0.0  # time.monotonic()

    # ------------------------------------------------------------------ what differs
    @property
    @abstractmethod
    def _waiting(self) -> deque[GenerationRequest]:
        """The requests taken in and not admitted yet, in order."""

    @abstractmethod
    def _running_requests(self) -> Sequence[GenerationRequest]:
        """The admitted requests (a finished one may still hold its slot until the next step)."""

    @abstractmethod
    def _problem(self, req: GenerationRequest) -> str | None:
        """Why a request taken in can never run (it fails at once), or None; may cut its new tokens to fit."""

    @abstractmethod
    def _fail_running(self, message: str) -> None:
        """Fail every admitted request not finished yet, and let go of their slots."""

    @abstractmethod
    def _loop(self) -> None:
        """The engine thread: steps while there is work, the drain's checks and the heartbeat meanwhile."""

    # ------------------------------------------------------------------ public API
    def submit(self, req: GenerationRequest) -> GenerationRequest:
        """Queue a request (any thread); its outputs come through `req.on_output` from the engine thread."""
        if self._refusing:  # stopping or broken: answer at once instead of queueing behind nothing
            self._finish(req, "error", self._refusing)
            return req
        req.sampling.validate()
        self._accept(req)
        self._incoming.put(req)
        self._wake.set()
        return req

    def _accept(self, req: GenerationRequest) -> None:
        """What an engine sets on a valid request before it is queued (nothing by default)."""
        return None

    def cancel(self, request_id: str) -> None:
        """Cancel a waiting or running request by id (Triton's `stop` input); it finishes as 'cancelled'."""
        with self._lock:
            self._cancel_ids.add(str(request_id))
        self._wake.set()

    def has_work(self) -> bool:
        return bool(self._running_requests() or self._waiting or not self._incoming.empty())

    def start(self) -> None:
        """Run the loop on a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ the loop's chores
    def _check_drain(self, now: float) -> None:
        """The drain's rules, every DRAIN_CHECK_S of the loop's `now` (time.monotonic())."""
        if now >= self._next_drain_check:
            self._next_drain_check = now + DRAIN_CHECK_S
            self._enforce_drain(time.time())

    def _idle(self) -> None:
        """Wait for a request, a cancel or a stop while there is nothing to do, no longer than the next heartbeat
        or drain check."""
        self._wake.wait(min(self.heartbeat_s, DRAIN_CHECK_S))
        self._wake.clear()

    def _enforce_drain(self, now_epoch: float) -> None:
        """Apply the drain's rules (drain.py) once the launcher's stop file says the rank is stopping."""
        deadline = self.drain_deadline() if self.drain_deadline is not None and self._drain.state != DRAINED else None
        for change in self._drain.advance(deadline, now_epoch, self._in_flight):
            if change == DRAINING:
                self._refusing = self._refusing or STOPPING
                self.log.info(
                    "stopping: refusing new requests, draining %d in flight until %.1f", self._in_flight(), deadline
                )
            elif change == FAILED:
                self._refusing = RAN_OUT
                self.log.warning(
                    "drain time ends at %.1f: failing %d queued/running request(s)", deadline, self._in_flight()
                )
                self._fail_all(self._refusing)
            if change in (DRAINING, DRAINED):
                self.report_drain(change)

    def _in_flight(self) -> int:
        """Requests not finished yet (a finished one may hold its slot until the next step: not counted)."""
        running = sum(1 for r in self._running_requests() if not r.finished)
        return running + len(self._waiting) + self._incoming.qsize()

    def _ping(self) -> None:
        """Tell the other ranks the leader lives: they tell an idle leader from a dead one by it."""
        try:
            self.comm.bcast_obj(PING)
        except PeerGone as e:  # a peer died: nothing can run on this replica any more
            self.log.error("%s", e)
            self._refusing = f"a tensor-parallel peer of this replica is gone ({e})"
            self._fail_all(self._refusing)

    def _stop_followers(self) -> None:
        """Release the other ranks (they leave their loop), once."""
        if self.comm.size > 1 and not self._stopped_followers:
            self._stopped_followers = True
            self.comm.bcast_obj(STOP)

    def _intake(self) -> None:
        """Take the queued requests in (or fail those that can never run) and apply the cancels."""
        with self._lock:
            cancel_ids, self._cancel_ids = self._cancel_ids, set()
        waiting = self._waiting
        while not self._incoming.empty():
            req = self._incoming.get()
            problem = self._problem(req)
            if problem:
                self._finish(req, "error", problem)
            else:
                waiting.append(req)
        matched = set()
        for req in list(waiting):
            if req.request_id in cancel_ids or req.cancelled():
                matched.add(req.request_id)
                waiting.remove(req)
                self._finish(req, "cancelled")
        for req in self._running_requests():
            if not req.finished and (req.request_id in cancel_ids or req.cancelled()):
                matched.add(req.request_id)
                self._finish(req, "cancelled")
        for request_id in cancel_ids - matched:
            self._finished_ids.unmatched_stop(request_id)

    # ------------------------------------------------------------------ endings
    def _emit(self, req: GenerationRequest, final: bool) -> None:
        if req.on_output is None or (not req.streaming and not final):
            return
        start = req._unsent if req.streaming else 0
        out = GenerationOutput(
            request=req,
            new_tokens=req.output_ids[start:],
            new_log_probs=req.log_probs[start:],
            finished=final,
            finish_reason=req.finish_reason,
            error=req.error,
        )
        req._unsent = len(req.output_ids)
        try:
            req.on_output(out)
        except Exception:  # noqa: BLE001 - one client's callback never stops the engine
            self.log.exception("on_output callback failed for request %s", req.request_id)

    def _finish(self, req: GenerationRequest, reason: str, error: str | None = None) -> None:
        self._finished_ids.add(req.request_id)
        req.finished = True
        req.finish_reason = reason
        req.error = error
        self.completed += 1
        self._emit(req, final=True)

    def _fail_all(self, message: str) -> None:
        """Fail every request queued, waiting or running."""
        while not self._incoming.empty():
            self._finish(self._incoming.get(), "error", message)
        waiting = self._waiting
        while waiting:
            self._finish(waiting.popleft(), "error", message)
        self._fail_running(message)
