"""The autoscaling controller's eyes and hands: a snapshot of the deployment for the policy (hpc/serving/autoscale.py),
and each decision applied with the machinery that already exists, never a kill:

- submit: `D/tensorrt_llm_triton.sub` as it is, through the Slurm executor (the same script `submit` and a renewer
  submit: its job folder, marker and index entry);
- cancel a PENDING job: scancel, after a StopRequest in its cancel marker (`status` says CANCELLED, by autoscale);
- drain a job: its DrainingMark (`final`: the gateway and `hpc.client` send it nothing new from their next look),
  then, once they have looked (RENEW_NOTICE_S), its StopRequest: every rank's ordered stop, requests in flight
  finish, the job ends COMPLETED, as a renewer's predecessor does; no successor is submitted for it;
- expire a job: its `no_successor` record: its renewer submits no successor, it serves to its time limit.

Every decision goes to the gateway's log and to `D/autoscale.json` (launcher/contracts/autoscale.py), with the
hysteresis' timers, so that a gateway job's successor takes over where its predecessor was, with when it expects
capacity (a held request's 503 says it: `capacity`) and a sample of each look (jobs by phase, the load). A submit
is held at the GPU budget and at the account's own limits (hpc/scheduler/limits.py). `advisory`: the same
decisions, recorded, nothing done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc.jobs.executors import SlurmExecutor, watch
from hpc.jobs.gateway import serving_jobs
from hpc.jobs.kinds import ServingJob, job_class_of
from hpc.jobs.track import job_status
from hpc.scheduler import slurm
from hpc.scheduler.index import JobRef
from hpc.scheduler.limits import CPU, GPU, NODE, AccountWatch
from hpc.scheduler.slurm import TERMINAL, SlurmError, ended
from hpc.serving.autoscale import Decision, JobView, Phase, Policy, Settings, Snapshot, expected
from hpc.serving.balancer import Balancer
from hpc.serving.deployment import Target, deployment_folders, target_of_folder
from hpc.serving.gateway_record import record_path
from hpc.spec import Spec, load_spec
from launcher.contracts.autoscale import Action, AutoscaleRecord, DecisionRecord, Sample
from launcher.contracts.config import RENEW_NOTICE_S
from launcher.contracts.job_states import JobState
from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.records import RenewStop, read_chain, read_endpoints, read_gateway
from launcher.contracts.stop_records import BY_AUTOSCALE, DrainingMark, StopRequest

log = logging.getLogger("hpc_serve.gateway")

#: a drained job's stop request follows its draining mark by this much: the gateway's and clients' next look at the
#: job folders (discovery's refresh and a margin), so no request is sent to a replica that is stopping
DRAIN_NOTICE_S = RENEW_NOTICE_S

#: how often the controller looks (each look: the job folders, one sacct through the watcher, one squeue); well
#: below any scale_up_after worth having, well above what Slurm minds
TICK_S = 5.0
#: how often the gateway's counters are read between looks: a look sees their mean over TICK_S, not one instant's
#: count (requests of a second or less come and go between two looks)
SAMPLE_S = 1.0

_PHASES: dict[str, Phase] = {JobState.PENDING: Phase.PENDING, JobState.READY: Phase.READY}


@dataclass(frozen=True)
class Load:
    """What the gateway measures: requests in flight on READY replicas (a mean over the samples of one look),
    requests turned away with nothing serving, the recent time to first token (None: not measured)."""

    outstanding: float = 0
    held: int = 0
    ttft_s: float | None = None


@dataclass
class Controller:
    """One deployment's controller, run by its gateway job (`controller`: that job's id)."""

    deploy_dir: Path
    spec: Spec
    controller: str = ""
    started: float = field(default_factory=time.time)
    policy: Policy = field(init=False)
    record: AutoscaleRecord = field(init=False)

    def __post_init__(self) -> None:
        assert self.spec.autoscale is not None, "a spec without autoscale:"
        self.target: Target = target_of_folder(self.deploy_dir)
        # a gateway job's successor (or a gateway started again) goes on from its predecessor's record
        self.record = AutoscaleRecord.read(self.deployment.autoscale) or AutoscaleRecord()
        self.record = dataclasses.replace(self.record, controller=self.controller)
        self.policy = Policy(Settings.of_spec(self.spec), self.record.up_since, self.record.down_since)
        self.account = AccountWatch(self.spec.slurm.account)
        slurm_spec = self.spec.slurm
        tasks = slurm_spec.nodes * self.spec.tasks_per_node
        #: what one serving job asks Slurm for, as the account's limits count it; an --exclusive job gets every CPU of
        #: its nodes, how many only Slurm knows: its CPUs are not counted ahead (GPUs and nodes are)
        self.need = {GPU: self.spec.gpus_per_job, NODE: slurm_spec.nodes}
        if not slurm_spec.exclusive:
            self.need[CPU] = tasks * (slurm_spec.cpus_per_task or 1)

    @classmethod
    def of_folder(cls, deploy_dir: Path, controller: str = "") -> Controller | None:
        """The controller of the deployment rendered in `deploy_dir`, or None when its spec has no `autoscale:`."""
        spec = load_spec(Deployment(deploy_dir).spec, check_files=False)
        return cls(deploy_dir, spec, controller) if spec.autoscale is not None else None

    def stopped(self) -> bool:
        """Whether the deployment was cancelled (`hpc-serve cancel`) since this controller started: it acts no more."""
        stop = RenewStop.read(self.deployment.renew_stop)
        return stop is not None and stop.stops(self.started)

    def in_charge(self) -> bool:
        """Whether this controller's gateway is the deployment's gateway now: during a gateway job's handover both
        run a moment, and only the one the address record names (the successor, from when it publishes) acts."""
        record = read_gateway(record_path(self.target))
        return record is None or record.job_id == self.controller

    @property
    def deployment(self) -> Deployment:
        return Deployment(self.deploy_dir)

    @property
    def advisory(self) -> bool:
        assert self.spec.autoscale is not None
        return self.spec.autoscale.advisory

    # ------------------------------------------------------------------------------------------------ the eyes
    def snapshot(self, load: Load, now: float) -> Snapshot:
        """The deployment's serving jobs (their folders' records and Slurm's state), with the jobs of its name
        that only Slurm's queue shows (submitted by hand, not started), and the load."""
        refs = [ref for ref in serving_jobs(self.target) if job_class_of(ref.job_dir) is ServingJob]
        watch(refs)
        try:
            queue = slurm.default.queued(self.spec.name, self.deployment.sub)
        except SlurmError as exc:  # the jobs' own states still stand; the estimates wait for the next look
            log.warning("autoscale: squeue of the deployment's jobs failed: %s", exc)
            queue = {}
        jobs = [view for ref in refs if (view := self._view(ref, queue)) is not None]
        known = {ref.job_id for ref in refs}
        per_job = self.spec.gpus_per_job
        for job_id, (state, start, end) in queue.items():
            if job_id not in known and not ended(state):
                phase = Phase.PENDING if state == JobState.PENDING else Phase.STARTING
                jobs.append(JobView(job_id, phase, self.spec.replicas, per_job, start, end, ours=False))
        self.measure(jobs, queue)
        return Snapshot(
            now,
            tuple(jobs),
            outstanding=load.outstanding,
            held=load.held,
            ttft_s=load.ttft_s,
            account=lambda: self.account.refusal(self.need),
        )

    def measure(self, jobs: list[JobView], queue: dict[str, tuple[str, float | None, float | None]]) -> None:
        """A job's time from its start (Slurm's) to READY (its last replica's endpoint record), from the newest
        READY job of the deployment not measured yet (once each; not where a replica was started again): what the
        next job on its way is expected to take."""
        started = [
            (start, j.job_id)
            for j in jobs
            if j.phase == Phase.READY and j.ours and (start := queue.get(j.job_id, ("", None, None))[1])
        ]
        if not started:
            return
        start, job_id = max(started)
        if job_id == self.record.measured_job:
            return
        # a replica started again (replica_policy restart) was READY later than the job's start made it
        endpoints = [e for e in read_endpoints(JobPaths(self.deploy_dir, job_id)) if e.restarts == 0]
        if len(endpoints) < self.spec.replicas:
            return
        took = max(e.ready_at for e in endpoints) - start
        if took > 0:
            self.record = dataclasses.replace(self.record, ready_after_s=round(took, 1), measured_job=job_id)

    def _view(self, ref: JobRef, queue: dict[str, tuple[str, float | None, float | None]]) -> JobView | None:
        state = job_status(ref).state
        if state in TERMINAL:
            return None
        paths = ref.paths
        if paths.draining.exists() or paths.stop_request.exists() or state in (JobState.CANCELLING, JobState.STOPPING):
            phase = Phase.DRAINING
        elif paths.no_successor.exists():
            phase = Phase.EXPIRING
        else:  # UNKNOWN (Slurm did not answer) counts as on its way: never a reason to submit more
            phase = _PHASES.get(state, Phase.STARTING)
        _, start, end = queue.get(ref.job_id, ("", None, None))
        chain = read_chain(paths)
        return JobView(
            ref.job_id,
            phase,
            self.spec.replicas,
            self.spec.gpus_per_job,
            starts_at=start if phase in (Phase.PENDING, Phase.STARTING) else None,
            ends_at=end,
            renews=chain.predecessor if chain is not None else "",
        )

    # ------------------------------------------------------------------------------------------------ the hands
    def tick(self, load: Load, now: float | None = None) -> Decision:
        """One look, one decision, applied (unless advisory), logged and recorded; the drains under way go on."""
        now = time.time() if now is None else now
        self.follow_up(now)
        snap = self.snapshot(load, now)
        decision = self.policy.decide(snap)
        self.look(snap, decision)
        error = ""
        if self.stopped():  # `hpc-serve cancel` of the deployment came during this look: nothing more is done
            error = "not done: the deployment was cancelled"
        elif not self.advisory and decision.action != Action.HOLD:
            job_id, error = self.act(decision, now)
            decision = dataclasses.replace(decision, job_id=job_id)
        self.note(decision, error)
        return decision

    def act(self, decision: Decision, now: float) -> tuple[str, str]:
        """Apply one decision; the job it acted on (a submit's new one), and "" or what went wrong (sbatch's words)."""
        paths = JobPaths(self.deploy_dir, decision.job_id) if decision.job_id else None
        try:
            if decision.action == Action.SUBMIT:
                return SlurmExecutor().submit(ServingJob, self.deploy_dir).job_id, ""
            elif decision.action == Action.CANCEL and paths is not None:
                StopRequest(at=now, by=BY_AUTOSCALE, note=decision.reason).write(paths.cancel_marker)
                SlurmExecutor().cancel(JobRef(decision.job_id, paths.folder), 0.0, stoppable=False)
            elif decision.action == Action.DRAIN and paths is not None:
                RenewStop(at=now).write(paths.no_successor)
                DrainingMark(at=now, final=True).write(paths.draining)
                self.record = dataclasses.replace(self.record, draining={**self.record.draining, paths.job_id: now})
            elif decision.action == Action.EXPIRE and paths is not None:
                RenewStop(at=now).write(paths.no_successor)
        except (SlurmError, OSError) as exc:
            return decision.job_id, str(exc)
        return decision.job_id, ""

    def look(self, snap: Snapshot, decision: Decision) -> None:
        """What this look saw, into the record: when capacity is expected, and the look's sample."""
        settings = self.policy.settings
        coming = expected(snap, self.record.ready_after_s, settings.horizon_s)
        phases = [j.phase for j in snap.jobs]
        sample = Sample(
            at=round(snap.now, 1),
            pending=phases.count(Phase.PENDING),
            starting=phases.count(Phase.STARTING),
            ready=phases.count(Phase.READY),
            draining=phases.count(Phase.DRAINING) + phases.count(Phase.EXPIRING),
            signal=decision.signal,
            target=decision.target,
            in_flight=round(snap.outstanding, 3),
        )
        self.record = dataclasses.replace(
            self.record.with_sample(sample),
            expected_at=coming.at if coming is not None else None,
            expected_job=coming.job_id if coming is not None else "",
            expected_note=coming.words if coming is not None else "",
        )

    def follow_up(self, now: float) -> None:
        """Drained jobs whose draining mark every client has seen: their ordered stop (once; unless advisory)."""
        left: dict[str, float] = {}
        for job_id, since in self.record.draining.items():
            paths = JobPaths(self.deploy_dir, job_id)
            if now - since < DRAIN_NOTICE_S:
                left[job_id] = since
            elif not paths.stop_request.exists():
                StopRequest(at=now, by=BY_AUTOSCALE, note="drained by the autoscaling controller").write(
                    paths.stop_request
                )
                log.info("autoscale: job %s drained for %.0f s: its ordered stop", job_id, now - since)
        self.record = dataclasses.replace(self.record, draining=left)

    def note(self, decision: Decision, error: str = "") -> None:
        """Log and record a decision: every act, and a hold when its reason's words changed (not one a tick)."""
        row = DecisionRecord(
            at=decision.at,
            action=decision.action,
            job_id=decision.job_id,
            reason=decision.reason,
            signal=decision.signal,
            target=decision.target,
            advisory=self.advisory,
            error=error,
        )
        last = self.record.decisions[-1] if self.record.decisions else None
        record = dataclasses.replace(self.record, up_since=self.policy.up_since, down_since=self.policy.down_since)
        if decision.action != Action.HOLD or last is None or _gist(last.reason) != _gist(row.reason):
            record = record.with_decision(row)
            level = logging.WARNING if error else logging.INFO
            log.log(
                level,
                "autoscale%s: %s%s: %s (signal %.2f, target %g)%s",
                " (advisory)" if self.advisory else "",
                decision.action,
                f" {row.job_id}" if row.job_id else "",
                decision.reason,
                decision.signal,
                decision.target,
                f"; failed: {error}" if error else "",
            )
        self.record = record
        record.write(self.deployment.autoscale)


def _gist(reason: str) -> str:
    """A reason without its numbers: holds that say the same thing with another count are one row."""
    return "".join(c for c in reason if not (c.isdigit() or c == "."))


def autoscale_record(target: Target) -> AutoscaleRecord | None:
    """The deployment's controller record: its newest folder's that has one (the gateway job's folder)."""
    for folder in reversed(deployment_folders(target)):
        record = AutoscaleRecord.read(Deployment(folder).autoscale)
        if record is not None:
            return record
    return None


#: a held request's Retry-After, when capacity is expected (seconds): never sooner than 1, never later than an hour
#: (an estimate that far off is Slurm's backfill guess, not a promise; the client looks again then)
RETRY_AFTER_BOUNDS_S = (1, 3600)


@dataclass(frozen=True)
class Capacity:
    """When the controller expects a job of the deployment to serve (its record's `expected_at`), for a held
    request's 503: Retry-After and the words of its message."""

    at: float
    job_id: str

    def retry_after_s(self, now: float | None = None) -> int:
        low, high = RETRY_AFTER_BOUNDS_S
        wait = self.at - (time.time() if now is None else now)
        return int(min(high, max(low, math.ceil(wait))))

    def words(self, now: float | None = None) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.at))
        return f"job {self.job_id} is expected to serve at about {when} (in {self.retry_after_s(now)} s)"


def capacity(target: Target | None) -> Capacity | None:
    """When the deployment's controller expects capacity (None: no record, nothing on the way, or no estimate)."""
    record = autoscale_record(target) if target is not None and getattr(target, "autoscaled", False) else None
    if record is None or record.expected_at is None:
        return None
    return Capacity(record.expected_at, record.expected_job)


def decision_lines(record: AutoscaleRecord, last: int = 10) -> list[str]:
    """`status`'s table of the controller's last decisions: when, what (`?`: advised only), on which job, the signal
    against its target, why."""
    if not record.decisions:
        return []
    lines = ["autoscale decisions" + (f" (controller: gateway job {record.controller})" if record.controller else "")]
    if record.expected_note:
        lines.append(f"  capacity on the way: {record.expected_note}")
    lines.append(f"  {'when':8}  {'what':7}  {'job':10}  {'signal':>11}  why")
    for row in record.decisions[-last:]:
        what = row.action + ("?" if row.advisory else "")
        signal = f"{row.signal:g}/{row.target:g}"
        why = row.reason + (f"; failed: {row.error}" if row.error else "")
        when = time.strftime("%H:%M:%S", time.localtime(row.at))
        lines.append(f"  {when:8}  {what:7}  {row.job_id:10}  {signal:>11}  {why}")
    return lines


def balancer_load(balancer: Balancer) -> Callable[[], Load]:
    """The gateway's load as the controller reads it at each look: requests in flight on replicas that take new ones
    (a draining job's finish elsewhere in the count), the requests turned away or held with nothing serving since
    the last look, and the mean time to first token of the requests that got one since (None: none did). Every
    worker's, where a gateway has several: the counts and their totals are shared (hpc/serving/replica_counts.py)."""
    seen = balancer.counts.totals()

    def load() -> Load:
        nonlocal seen
        now = balancer.counts.totals()
        firsts = now["ttft_count"] - seen["ttft_count"]
        ttft_s = (now["ttft_sum_s"] - seen["ttft_sum_s"]) / firsts if firsts > 0 else None
        held = round(now["nothing_serving"] - seen["nothing_serving"])
        seen = now
        replicas = balancer.replicas
        balancer.counts.load(replicas)
        return Load(outstanding=sum(r.outstanding for r in replicas if not r.draining), held=held, ttft_s=ttft_s)

    return load


async def run(controller: Controller, server: Any, load: Callable[[], Load]) -> None:
    """The controller's loop beside the gateway's server (hpc/gateway/serve.py), until the server stops; a look
    that failed (a job folder unreadable) is logged and the next one comes as usual."""
    log.info(
        "autoscale%s: between %d and %d jobs, %g requests per replica",
        " (advisory)" if controller.advisory else "",
        controller.policy.settings.min_jobs,
        controller.policy.settings.max_jobs,
        controller.policy.settings.target,
    )
    samples: list[Load] = []
    next_tick = time.monotonic() + TICK_S
    while not server.should_exit:
        samples.append(load())
        if time.monotonic() < next_tick:
            await asyncio.sleep(SAMPLE_S)
            continue
        next_tick = time.monotonic() + TICK_S
        if controller.stopped():
            log.info("autoscale: the deployment was cancelled; the controller stops")
            return
        if not controller.in_charge():  # handing over to a successor gateway job, which looks from now on
            samples = []  # what it saw meanwhile is the successor's to act on, not to be summed here later
            continue
        ttfts = [s.ttft_s for s in samples if s.ttft_s is not None]
        seen = Load(
            outstanding=sum(s.outstanding for s in samples) / len(samples),
            held=sum(s.held for s in samples),
            ttft_s=sum(ttfts) / len(ttfts) if ttfts else None,
        )
        samples = []
        try:
            await asyncio.to_thread(controller.tick, seen)
        except (OSError, SlurmError) as exc:
            log.warning("autoscale: this look failed: %s", exc)
        except Exception:  # a bug must not end the controller unseen while the gateway holds requests for it
            log.exception("autoscale: this look failed; the next one comes as usual")


def start(server: Any, deploy_dir: Path | None, job_id: str, balancer: Balancer) -> asyncio.Future[None] | None:
    """The controller's task for a gateway job whose deployment has `autoscale:`, else None."""
    controller = Controller.of_folder(deploy_dir, job_id) if deploy_dir is not None and job_id else None
    return asyncio.ensure_future(run(controller, server, balancer_load(balancer))) if controller else None
