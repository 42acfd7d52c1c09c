"""The autoscaling policy: a snapshot of the deployment's jobs and load in, one decision out. No I/O and no clock of
its own (the snapshot says when), so a replayed trace decides as the live controller does (hpc/jobs/autoscale.py
takes the snapshots and acts; the spec's `autoscale:`: hpc/spec/autoscale.py).

The rules, each against a failure the anchors met (docs/decisions.md "Autoscaling on Slurm"):
- the signal is requests in flight per READY replica, the gateway's own count (queued in the engine and decoding);
  a TTFT over `ttft_sla_s` counts as above target too;
- a PENDING or STARTING job is capacity on the way: nothing more is submitted while one waits (Dynamo's planner
  stuck behind capacity that waits for a GPU); a renewal's successor is its predecessor's, not new capacity;
- up needs the load above target for `scale_up_after` with nothing on the way, down one job fewer to fit for `scale_down_after`, and each
  act starts the wait again: at most one submit per `scale_up_after`;
- down only where the load still fits the jobs left (Dynamo's N/(N−1) check: load × N/(N−1) within the target),
  and to zero only with no request at all; a surplus PENDING job goes first (scancel: it serves nobody), then a
  job close to its time limit expires (no successor), else one is drained (no new requests, the ordered stop, ends
  COMPLETED): never a kill;
- `min_jobs` is a floor kept at once, and a request that finds nothing serving submits at once (zero and back);
- the GPU budget counts every job of the deployment Slurm holds or queues, hand-submitted and draining ones
  included, before every submit; then the account's own limits (hpc/scheduler/limits.py), asked through the
  snapshot only then.

`expected` says when capacity comes: the earliest job on its way, its start (Slurm's estimate) plus a job's time
to READY; a held request's 503 names it (Retry-After).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from hpc.spec import Spec
from launcher.contracts.autoscale import Action
from launcher.contracts.config import RENEW_NOTICE_S, STOP_LEAD_S
from launcher.contracts.text_enum import TextEnum


class Phase(TextEnum):
    """Where a job of the deployment stands, as the policy needs it."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    READY = "READY"
    #: leaving: the controller drains it, or its renewer's successor serves
    DRAINING = "DRAINING"
    #: the controller let it expire: it serves until its time limit, no successor
    EXPIRING = "EXPIRING"


LEAVING = (Phase.DRAINING, Phase.EXPIRING)


@dataclass(frozen=True)
class JobView:
    """One serving job of the deployment. `renews`: the job this one succeeds in a renewal chain (it replaces that
    one, it adds nothing); `ours`: it has a job folder (False: only Slurm's queue shows it, a job submitted by hand
    that has not started: it counts, but the controller does not stop it)."""

    job_id: str
    phase: Phase
    replicas: int
    gpus: int
    starts_at: float | None = None
    ends_at: float | None = None
    renews: str = ""
    ours: bool = True


@dataclass(frozen=True)
class Snapshot:
    """The deployment at `now`: its jobs, requests in flight on READY replicas, requests held with nothing serving,
    the recent time to first token (None: not measured), and `account`: why the account's limits refuse one more
    job ("" where they allow it; None: not asked), called only before a submit (it reads Slurm's queue)."""

    now: float
    jobs: tuple[JobView, ...]
    outstanding: float = 0
    held: int = 0
    ttft_s: float | None = None
    account: Callable[[], str] | None = None


@dataclass(frozen=True)
class Settings:
    """The policy's numbers: `autoscale:`'s, the GPUs of one job, and how close to its time limit a job expires
    rather than drains (its renewer would submit a successor then; None without `renew:`)."""

    min_jobs: int
    max_jobs: int
    target: float
    up_after_s: float
    down_after_s: float
    gpus_per_job: int = 0
    gpu_budget: int | None = None
    horizon_s: float = 900.0
    ttft_sla_s: float | None = None
    expire_within_s: float | None = None

    @classmethod
    def of_spec(cls, spec: Spec) -> Settings:
        scale = spec.autoscale
        assert scale is not None, "a spec without autoscale:"
        renew = spec.renew
        return cls(
            min_jobs=scale.min_jobs,
            max_jobs=scale.max_jobs,
            target=scale.target_outstanding,
            up_after_s=scale.scale_up_after_s,
            down_after_s=scale.scale_down_after_s,
            gpus_per_job=spec.gpus_per_job,
            gpu_budget=scale.gpu_budget,
            horizon_s=scale.horizon_s,
            ttft_sla_s=scale.ttft_sla_s,
            # the renewer submits at end - before; drain would take longer than letting the job run out
            expire_within_s=(renew.before_s + RENEW_NOTICE_S + STOP_LEAD_S) if renew is not None else None,
        )


@dataclass(frozen=True)
class Decision:
    """What to do now, on which job, why, and the signal (requests in flight per READY replica; with none READY,
    the requests that wait) against its target."""

    at: float
    action: Action
    reason: str
    signal: float
    target: float
    job_id: str = ""


def _clock(at: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if at is not None else "unknown"


@dataclass
class Policy:
    """The rules (module docstring) and the two timers of the hysteresis, which a controller restored from its
    record passes in again (`up_since`, `down_since`)."""

    settings: Settings
    up_since: float | None = None
    down_since: float | None = None

    def decide(self, snap: Snapshot) -> Decision:
        s, now = self.settings, snap.now
        present = {job.job_id for job in snap.jobs}
        # serving or on its way; a renewal's successor stands in for its predecessor, not beside it
        live = [j for j in snap.jobs if j.phase not in LEAVING and not (j.renews and j.renews in present)]
        ready = [j for j in live if j.phase == Phase.READY]
        coming = [j for j in live if j.phase in (Phase.PENDING, Phase.STARTING)]
        replicas = sum(j.replicas for j in ready)
        waiting = snap.outstanding + snap.held
        signal = snap.outstanding / replicas if replicas else float(waiting)
        slow = s.ttft_sla_s is not None and snap.ttft_s is not None and snap.ttft_s > s.ttft_sla_s
        hot = (signal > s.target if replicas else waiting > 0) or slow
        surplus = self._surplus(snap, live, ready, coming, replicas)
        # capacity on the way: its effect is measured from when it serves, a whole scale_up_after again
        self.up_since = (self.up_since if self.up_since is not None else now) if hot and not coming else None
        self.down_since = (self.down_since if self.down_since is not None else now) if surplus else None

        def decision(action: Action, reason: str, job_id: str = "") -> Decision:
            return Decision(now, action, reason, round(signal, 3), s.target, job_id)

        if len(live) < s.min_jobs:
            return self._submit(snap, decision, f"{len(live)} job(s) under way, below min_jobs {s.min_jobs}")
        if not live and waiting:
            return self._submit(snap, decision, f"{waiting:g} request(s) wait with nothing serving")
        if hot:
            why = (
                f"TTFT {snap.ttft_s:.2f} s above the SLA {s.ttft_sla_s:g} s"
                if slow
                else f"{signal:.2f} requests per READY replica, above the target {s.target:g}"
            )
            if coming:
                return decision(Action.HOLD, f"{why}; capacity on the way: {self._on_the_way(coming, now)}")
            if len(live) >= s.max_jobs:
                return decision(Action.HOLD, f"{why}; at max_jobs {s.max_jobs}")
            assert self.up_since is not None
            if now - self.up_since < s.up_after_s:
                return decision(
                    Action.HOLD, f"{why} for {now - self.up_since:.0f} s of scale_up_after {s.up_after_s:g} s"
                )
            return self._submit(snap, decision, why)
        if surplus:
            assert self.down_since is not None
            if now - self.down_since < s.down_after_s:
                return decision(
                    Action.HOLD,
                    f"one job fewer fits for {now - self.down_since:.0f} s of scale_down_after {s.down_after_s:g} s",
                )
            self.down_since = None
            pending = [j for j in coming if j.phase == Phase.PENDING and j.ours]
            if pending:  # it serves nobody and holds no GPU: the first to go
                job = max(pending, key=lambda j: (j.starts_at or math.inf, j.job_id))
                return decision(
                    Action.CANCEL, f"{len(live)} jobs, min_jobs {s.min_jobs}: a surplus PENDING job", job.job_id
                )
            job = min((j for j in ready if j.ours), key=lambda j: (j.ends_at or math.inf, j.job_id))
            fewer = f"the load fits {len(live) - 1} job(s) (N/(N-1) check)"
            if s.expire_within_s is not None and job.ends_at is not None and job.ends_at - now <= s.expire_within_s:
                return decision(Action.EXPIRE, f"{fewer}; its time limit is at {_clock(job.ends_at)}", job.job_id)
            return decision(Action.DRAIN, fewer, job.job_id)
        return decision(Action.HOLD, f"{signal:.2f} requests per READY replica, within the target {s.target:g}")

    def _surplus(
        self, snap: Snapshot, live: list[JobView], ready: list[JobView], coming: list[JobView], replicas: int
    ) -> bool:
        """Whether the jobs less one would still carry the load: a PENDING one when the READY ones carry it, else
        the READY job that would go (N/(N−1)); to zero only with no request at all."""
        s = self.settings
        if len(live) <= s.min_jobs or snap.held:
            return False
        if any(j.phase == Phase.PENDING and j.ours for j in coming):
            return bool(replicas) and snap.outstanding / replicas <= s.target
        if coming:  # a STARTING job: wait until it serves, then drain one if the load still allows
            return False
        candidates = [j for j in ready if j.ours]
        if not candidates:
            return False
        left = replicas - min(j.replicas for j in candidates)
        return snap.outstanding == 0 if left == 0 else snap.outstanding / left <= s.target

    def _submit(self, snap: Snapshot, decision: Callable[..., Decision], why: str) -> Decision:
        """A submit if the budget allows it (every job Slurm holds or queues for the deployment counts)."""
        s = self.settings
        if s.gpu_budget is not None:
            held = sum(j.gpus for j in snap.jobs)
            if held + s.gpus_per_job > s.gpu_budget:
                return decision(
                    Action.HOLD,
                    f"{why}; the GPU budget {s.gpu_budget} holds {held} in use, a job needs {s.gpus_per_job}",
                )
        refused = snap.account() if snap.account is not None else ""
        if refused:
            return decision(Action.HOLD, f"{why}; {refused}")
        self.up_since = None  # the next submit waits a whole scale_up_after again
        return decision(Action.SUBMIT, why)

    def _on_the_way(self, coming: list[JobView], now: float) -> str:
        return "; ".join(_coming_words(job, now, self.settings.horizon_s) for job in coming)


def _coming_words(job: JobView, now: float, horizon_s: float) -> str:
    """`job 12 PENDING, estimated start 14:02:11, beyond the horizon of 900 s`."""
    text = f"job {job.job_id} {job.phase}"
    if job.phase == Phase.PENDING:
        text += f", estimated start {_clock(job.starts_at)}"
        if job.starts_at is None or job.starts_at - now > horizon_s:
            text += f", beyond the horizon of {horizon_s:g} s"
    return text


#: a job's time from its start to READY until the deployment has measured one (the engine's load and warm-up: a
#: minute or two on a GPU; the CPU engine's seconds are measured at its first job)
READY_AFTER_S = 120.0


@dataclass(frozen=True)
class Expected:
    """When capacity is expected: `at` (epoch seconds; None: Slurm has no start estimate yet), the job it comes
    with, and in words (`status`)."""

    at: float | None
    job_id: str
    words: str


def expected(snap: Snapshot, ready_after_s: float | None, horizon_s: float) -> Expected | None:
    """The earliest job on its way (PENDING: Slurm's start estimate; STARTING: its start) and when it should
    serve: that start plus `ready_after_s` (None: READY_AFTER_S); None with no job on its way."""
    coming = [j for j in snap.jobs if j.phase in (Phase.PENDING, Phase.STARTING)]
    if not coming:
        return None
    job = min(coming, key=lambda j: (j.starts_at if j.starts_at is not None else math.inf, j.job_id))
    after = READY_AFTER_S if ready_after_s is None else ready_after_s
    words = _coming_words(job, snap.now, horizon_s)
    if job.starts_at is None:
        return Expected(None, job.job_id, f"{words}; when it serves is not known yet")
    at = max(job.starts_at + after, snap.now)
    how = "as measured" if ready_after_s is not None else "by default"
    return Expected(at, job.job_id, f"{words}; serving from about {_clock(at)} ({after:.0f} s to READY {how})")
