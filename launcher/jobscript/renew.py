"""``python -m launcher.jobscript.renew D``: keeps a deployment serving past its job's time limit (the spec's ``renew:``).

The `.sub` starts it in the background of the batch shell, one per job. Standard library only, and it calls
`sbatch`, `squeue` and `scancel` itself (through launcher/contracts/slurm.py, as `hpc` does): the batch node may have no
hpc-serve installed (it runs from the
copy render put in ``D/python``), and a job submitted by hand with ``sbatch D/tensorrt_llm_triton.sub`` must
renew the same way as one `hpc-serve submit` started. On the job's own clock (Slurm's end time, read from
``squeue -o %e`` and again every minute, since an admin may extend it) it:

1. at ``end - renew.before`` submits the successor: ``sbatch D/tensorrt_llm_triton.sub`` as it is (the same
   deployment; its job folder ``jobs/<new id>`` is its own), linked both ways (``chain.json``), unless the
   chain was cancelled, ``renew.max_jobs`` is reached or ``renew.until`` has passed;
2. once every replica of the successor is READY, marks this job draining (``jobs/<id>/draining``: the gateway
   and ``hpc.client`` send it no new requests from their next look on);
3. waits until its replicas have no request left in their engine (``nv_trt_llm_request_metrics`` active and
   waiting, from their metrics ports) or ``renew.drain`` has passed, then starts the ordered stop
   (``scancel --signal=TERM``, as the time limit's warning does): the job ends COMPLETED;
4. stops the job at ``end - stop lead`` anyway: a successor still pending then takes over when it starts, and
   ``chain.json``'s note says why this job served to its end. ``notice_s`` before that stop it marks itself
   draining for good (``final``: clients send it nothing new even though no other replica serves), so that its
   requests in flight finish before the stop rather than wait on a stopping server.

Slurm's time-limit warning (the `.sub`'s ``--signal=B:USR1@lead``) may come up to a minute early (slurmctld
looks at time limits every 30 s or so), which in a short job would stop it before its successor serves. So
while a renewer runs the `.sub` hands USR1 to it, and it stops the job on its own clock; when it cannot tell
the end, USR1 stops the job at once. When the renewer is gone, the `.sub` stops the job on USR1 itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher.contracts import successor
from launcher.contracts.config import STOP_ACK_S
from launcher.contracts.job_index import job_cluster, link_index
from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.plan import LaunchPlan, PlanError
from launcher.contracts.records import ChainRecord, RenewStop, read_chain, read_endpoints, write_json_atomic
from launcher.contracts.renew_plan import RenewPlan, chain_place, format_time, successor_env
from launcher.contracts.slurm import Slurm, SlurmError
from launcher.contracts.stop_records import BY_RENEWER, DrainingMark, StopRequest, stop_acknowledged
from launcher.contracts.successor import (
    END_REFRESH_S,
    QUERY_TIMEOUT_S,
    SBATCH_RETRY_S,
    SUCCESSOR_ATTEMPTS,
    SUCCESSOR_STATE_S,
    described,
    gone_or_ended,
    log,
)
from launcher.contracts.text_enum import TextEnum
from launcher.node.stop import metrics_in_flight

POLL_S = 0.5
#: sbatch's one try: one that timed out may have queued the successor, so it is not repeated (launcher/contracts/slurm.py)
SBATCH_TIMEOUT_S = 30.0
METRICS_TIMEOUT_S = 2.0
#: the renewer's Slurm commands
SLURM = Slurm(timeout_s=QUERY_TIMEOUT_S)


def job_times(job_id: str) -> tuple[float | None, float | None]:
    """(start, end) of a job as Slurm says now (launcher/contracts/successor.py)."""
    return successor.job_times(SLURM, job_id)


def job_state(job_id: str) -> tuple[str, str]:
    """(state, reason) as squeue says (launcher/contracts/successor.py)."""
    return successor.job_state(SLURM, job_id)


def scancel(job_id: str, sig: str | None = None) -> None:
    """Cancel (or signal) a job of this cluster; a failure is logged, a job that has ended is no failure."""
    try:
        SLURM.scancel(job_id, signal=sig)
    except SlurmError as exc:
        log(str(exc))


def in_flight(paths: JobPaths) -> int | None:
    """Requests in the engines of a job's replicas now; None when a replica does not say."""
    total = 0
    for endpoint in read_endpoints(paths):
        active = metrics_in_flight(endpoint.metrics_url, METRICS_TIMEOUT_S)()
        if active is None:
            return None
        total += active
    return total


class Phase(TextEnum):
    """Where a renewer is (module docstring's steps): WAIT for the time to submit a successor (or to submit it
    again), SUCCESSOR submitted and not READY yet, DRAINING once it is, SERVE on to the end without one."""

    WAIT = "wait"
    SUCCESSOR = "successor"
    DRAINING = "draining"
    SERVE = "serve"


class Renewer:
    """One job's renewal, from its start to the ordered stop it starts (or until the job ends another way)."""

    def __init__(self, deploy_dir: Path, job_id: str, plan: RenewPlan, replicas: int, environ: Mapping[str, str]):
        self.deployment = Deployment(deploy_dir)
        self.paths = JobPaths(deploy_dir, job_id)
        self.plan, self.replicas, self.environ = plan, replicas, environ
        predecessor, index = chain_place(environ)
        # a requeued job starts its script again: it keeps its place, and the successor it may have submitted
        self.record = read_chain(self.paths) or ChainRecord(
            job_id=job_id, cluster=job_cluster(environ) or "", index=index, predecessor=predecessor
        )
        self.began = time.time()
        self.start = self.began
        self.end: float | None = None
        self.warned = False  # Slurm's time-limit warning (USR1, handed on by the .sub)
        self.lost_successors = 0  # successors that ended before they were READY

    @property
    def job_id(self) -> str:
        return self.paths.job_id

    def save(self, **changes: object) -> None:
        self.record = dataclasses.replace(self.record, **changes)  # type: ignore[arg-type]
        try:
            write_json_atomic(self.paths.chain, self.record.to_dict())
        except OSError as exc:
            log(f"could not write {self.paths.chain}: {exc}")

    def read_end(self) -> None:
        """The job's start and end from Slurm; else the end from its start and slurm.time (launch.json)."""
        start, end = job_times(self.job_id)
        self.start = start or self.start
        if end is not None:
            self.end = end
        elif self.end is None and self.plan.time_limit_s is not None:
            self.end = self.start + self.plan.time_limit_s
            log(f"Slurm did not say when this job ends; assuming start + slurm.time: {format_time(self.end)}")
        if self.end is not None:
            self.save(ends_at=self.end, renew_at=self.plan.renew_at(self.end), started_at=self.start)

    def chain_stopped(self) -> str | None:
        """Why the chain must not go on: this job was cancelled, or its deployment since this job started."""
        if self.paths.cancel_marker.exists():
            return "this job was cancelled (hpc-serve cancel)"
        if self.paths.no_successor.exists():  # hpc/jobs/autoscale.py: it drains, or serves to its end
            return "the autoscaling controller scales the deployment down by this job"
        stop = RenewStop.read(self.deployment.renew_stop)
        return "the deployment was cancelled (hpc-serve cancel)" if stop and stop.stops(self.start) else None

    def submit(self) -> str | None:
        """sbatch the same `.sub`; the successor's folder and index entry; its id, or None when sbatch failed."""
        env = successor_env(self.environ, self.job_id, self.record.index, str(self.deployment.runtime))
        try:
            successor = SLURM.sbatch(
                self.deployment.sub, env=env, cwd=str(self.deployment.root), timeout_s=SBATCH_TIMEOUT_S
            )
        except SlurmError as exc:
            log(str(exc))
            return None
        folder = JobPaths(self.deployment.root, successor).create().folder
        try:
            # `hpc-serve status <id>` finds it while it is still pending; it is queued on this job's cluster
            link_index(successor, folder, job_cluster(self.environ))
        except OSError as exc:
            log(f"could not index job {successor}: {exc}")
        self.save(successor=successor, submitted_at=time.time())
        stopped = self.chain_stopped()  # a cancel that came while sbatch ran did not see this successor yet
        if stopped:
            scancel(successor)
            self.save(note=f"{stopped}: successor {successor} cancelled at once")
            log(f"{stopped}; cancelled the successor {successor} it had just submitted")
            return None
        return successor

    def successor_lost(self, successor: str | None, state: str) -> Phase:
        """A successor ended before it was READY: submit another at once (the next phase, WAIT, does), unless
        SUCCESSOR_ATTEMPTS of them ended so; then this job serves on to its end (SERVE)."""
        self.lost_successors += 1
        note = f"successor {successor} ended ({state}) before it was READY"
        if self.lost_successors >= SUCCESSOR_ATTEMPTS:
            self.save(note=f"{note}; {self.lost_successors} successors did: no more")
            log(f"{note}; {self.lost_successors} successors did, none more is submitted")
            return Phase.SERVE
        self.save(note=f"{note}; submitting another")
        log(f"{note}; submitting another ({self.lost_successors + 1} of at most {SUCCESSOR_ATTEMPTS})")
        return Phase.WAIT

    def successor_ready(self, successor: str) -> bool:
        return len(read_endpoints(JobPaths(self.deployment.root, successor))) >= self.replicas

    def stop(self, note: str) -> int:
        """The ordered stop of this job's ranks, as the .sub's trap starts it: the job's stop request, which every
        launcher watches (a signal from Slurm would reach tritonserver before its model drained); `scancel
        --signal=TERM` to the steps only when no leader started its stop within STOP_ACK_S."""
        self.save(stopped_at=time.time(), note=note)
        log(f"{note}; ordered stop of job {self.job_id}")
        StopRequest(at=time.time(), by=BY_RENEWER, note=note).write(self.paths.stop_request)
        if not stop_acknowledged(self.paths):
            log(f"no leader started its stop within {STOP_ACK_S:g} s; scancel --signal=TERM")
            scancel(self.job_id, sig="TERM")
        return 0

    def run(self) -> int:
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "warned", True))
        self.read_end()
        if self.end is not None:
            log(
                f"job {self.job_id} (job {self.record.index} of its chain) ends {format_time(self.end)}: successor at "
                f"{format_time(self.plan.renew_at(self.end))}, ordered stop by {format_time(self.plan.stop_at(self.end))}"
            )
        phase = Phase.SUCCESSOR if self.record.successor else Phase.WAIT
        read_at = checked_at = time.monotonic()
        marked_at = retry_at = 0.0
        final = False
        state = ("", "")
        while True:
            now = time.time()
            if self.paths.cancel_marker.exists():
                log("this job was cancelled: its ordered stop is hpc-serve cancel's; nothing more to do")
                return 0
            if time.monotonic() - read_at >= END_REFRESH_S:
                read_at = time.monotonic()
                self.read_end()
            if self.end is None:
                if self.warned:
                    return self.stop("Slurm's time-limit warning, and this job's end is unknown")
                time.sleep(POLL_S)
                continue
            successor = self.record.successor
            if phase is Phase.WAIT and now >= max(self.plan.renew_at(self.end), retry_at):
                reason = self.plan.why_not(self.record.index, now, self.chain_stopped())
                if reason:
                    self.save(note=f"no successor: {reason}")
                    log(f"no successor: {reason}")
                    phase = Phase.SERVE
                elif self.submit() is not None:
                    log(f"submitted the successor {self.record.successor}")
                    phase = Phase.SUCCESSOR
                elif self.record.successor:  # submitted, then cancelled at once
                    phase = Phase.SERVE
                else:
                    self.save(note="sbatch of the successor failed (see this job's log); trying again")
                    retry_at = now + SBATCH_RETRY_S
            elif phase is Phase.SUCCESSOR and self.successor_ready(successor):
                marked_at = now
                DrainingMark(at=now, successor=successor).write(self.paths.draining)
                self.save(handover_at=now, note=f"successor {successor} READY: draining")
                log(f"successor {successor} is READY: this job takes no new requests, stops once idle")
                phase = Phase.DRAINING
            elif phase is Phase.SUCCESSOR and time.monotonic() - checked_at >= SUCCESSOR_STATE_S:
                checked_at = time.monotonic()
                new = job_state(successor)
                if new != state and new[0]:
                    state = new
                    log(f"successor {successor}: {described(new)}")
                if gone_or_ended(new):
                    phase = self.successor_lost(successor, new[0])
            elif phase is Phase.DRAINING and now >= self.plan.idle_from(marked_at):
                busy = in_flight(self.paths)
                if busy == 0:
                    return self.stop(f"handed over to {successor}: no request in flight")
                if now >= self.plan.drain_until(marked_at, self.end):
                    left = "an unknown number of" if busy is None else str(busy)
                    return self.stop(f"handed over to {successor}: drain timeout with {left} requests in flight")
            if phase in (Phase.SERVE, Phase.SUCCESSOR) and not final and now >= self.plan.final_drain_at(self.end):
                final = True
                DrainingMark(at=now, final=True).write(self.paths.draining)
                log(f"no successor serves yet: no new requests from now on; ordered stop in {self.plan.notice_s:g} s")
            if now >= self.plan.stop_at(self.end):
                if phase is Phase.SUCCESSOR:
                    why = described(state) if state[0] else "not READY"
                    return self.stop(
                        f"successor {successor} still {why} at this job's end; it takes over when it starts"
                    )
                return self.stop(self.record.note or "the time limit is near")
            if self.warned:
                self.warned = False
                log(
                    f"Slurm's time-limit warning: stopping on this job's own clock, by {format_time(self.plan.stop_at(self.end))}"
                )
            time.sleep(POLL_S)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.jobscript.renew", description=__doc__)
    parser.add_argument("deployment", help="the rendered deployment folder (its launch.json has a renew block)")
    args = parser.parse_args(argv)
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        log("not inside a Slurm job: nothing to renew")
        return 0
    deployment = Deployment(Path(args.deployment).absolute())
    try:
        launch = LaunchPlan.read(deployment.launch)
    except PlanError as exc:
        log(f"cannot read the renew plan: {exc}; this job does not renew")
        return 2
    if launch.renew is None:
        return 0
    return Renewer(deployment.root, job_id, launch.renew, launch.replicas, os.environ).run()


if __name__ == "__main__":
    raise SystemExit(main())
