"""A gateway job that outlives its time limit (a spec with both `gateway:` and `renew:`).

The serving jobs renew themselves (launcher/jobscript/renew.py); a gateway job that did not would take the deployment's
one address down at its own time limit, days before the chain behind it ends. So the gateway process renews its
job by the same clock rule (launch.json's renew plan: `before` the end, never after `until`, never once the
deployment was cancelled), more simply, since a gateway holds no model and no request outlives a few seconds
of draining:

1. at `end - before`, while a serving job of the deployment is still under way, it submits `D/gateway.sub`
   again (`Executor.submit` of a `GatewayJob`: the successor's folder, marker and index entry) and names the
   successor in `jobs/<id>/gateway_successor`;
2. the successor starts, finds the live record is its predecessor's, which names it, and publishes its own
   record (hpc/gateway/serve.py). The same address when `gateway.port` is fixed and it lands on the same node
   (`gateway.nodelist`): both gateways listen with SO_REUSEPORT, so the kernel hands new connections to both
   while the predecessor goes, and the address never refuses a connection;
3. the predecessor sees the record name its successor and stops as uvicorn stops: no new connections, requests
   in flight finish (serve.GRACEFUL_STOP_S), exit 0: the job ends COMPLETED.
A successor that has not started by the time limit takes over whenever it starts (Slurm's SIGTERM stops the
predecessor as before). Its scheduler state is logged as it changes (`PENDING (Resources)` says why the address
may go down at the limit); one that ends before it serves (a crash at start) is replaced at once, at most
SUCCESSOR_ATTEMPTS times, as a serving job's is (launcher/contracts/successor.py). `max_jobs` bounds the serving
chain, not its gateway: the gateway renews while a serving job is under way, and always while it runs the
deployment's autoscaling controller (`autoscale:`, which may scale it to no serving job).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc.jobs.executors import SlurmExecutor, watch
from hpc.jobs.gateway import UNDER_WAY, serving_jobs
from hpc.jobs.kinds import GatewayJob
from hpc.jobs.track import job_status
from hpc.scheduler.slurm import SlurmError
from hpc.serving.deployment import Target, job_folders
from hpc.serving.gateway_record import record_path
from hpc.spec import load_spec
from launcher.contracts.job_states import JobState
from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.records import GatewayRecord, RenewStop, SuccessorRecord, read_gateway
from launcher.contracts.renew_plan import RenewPlan
from launcher.contracts.slurm import Slurm
from launcher.contracts.successor import (
    END_REFRESH_S,
    QUERY_TIMEOUT_S,
    SBATCH_RETRY_S,
    SUCCESSOR_ATTEMPTS,
    SUCCESSOR_STATE_S,
    described,
    gone_or_ended,
    job_state,
    job_times,
)

log = logging.getLogger("hpc_serve.gateway")
#: the gateway renewer's Slurm commands, paced as a serving job's renewer's (launcher/contracts/successor.py)
SLURM = Slurm(timeout_s=QUERY_TIMEOUT_S)

#: how often the record is read for the successor's, once one was submitted
RECORD_POLL_S = 1.0
#: how soon a question Slurm did not answer (the job's end, a serving job's state) is asked again: a minute's
#: wait (END_REFRESH_S) after one slow sacct could leave the successor no time to start before this job's limit
UNSURE_RETRY_S = 5.0
#: why_not's reason while Slurm cannot say whether a serving job is under way
UNSURE = "Slurm did not say whether a serving job of the deployment is under way; asking again"


def takes_over_from(target: Target, live: GatewayRecord, job_id: str) -> bool:
    """Whether gateway job `job_id` is the successor the live gateway (a job) submitted to take over from it."""
    if not (live.job_id and job_id):
        return False
    for paths in job_folders(target):
        if paths.job_id == live.job_id:
            successor = SuccessorRecord.read(paths.gateway_successor)
            return successor is not None and successor.job_id == job_id
    return False


@dataclass
class GatewayRenewer:
    """The renewal of one gateway job (module docstring); `run(server)` is a task beside uvicorn's server."""

    deploy_dir: Path
    target: Target
    job_id: str
    plan: RenewPlan
    started: float = field(default_factory=time.time)
    successor: str | None = None
    #: successors that ended before they served
    lost: int = 0
    _said: str | None = None
    _successor_state: tuple[str, str] = ("", "")

    @property
    def paths(self) -> JobPaths:
        return JobPaths(self.deploy_dir, self.job_id)

    def why_not(self, now: float) -> str | None:
        """Why no successor is submitted now, or None: submit it."""
        if self.paths.cancel_marker.exists():
            return "this gateway job was cancelled"
        if self.lost >= SUCCESSOR_ATTEMPTS:
            return f"{self.lost} successors ended before they served: no more"
        stop = RenewStop.read(Deployment(self.deploy_dir).renew_stop)
        if stop is not None and stop.stops(self.started):
            return "the deployment was cancelled (hpc-serve cancel)"
        why = self.plan.why_not(0, now)  # index 0: max_jobs counts the serving chain only
        if why is not None:
            return why
        if self.autoscaled:  # the controller keeps the address while it has scaled the deployment to zero
            return None
        serving = self._serving()
        if serving is None:
            return UNSURE
        return None if serving else "no serving job of the deployment is under way"

    @functools.cached_property
    def autoscaled(self) -> bool:
        """Whether the deployment has `autoscale:`: its controller runs in this gateway job (hpc/jobs/autoscale.py)."""
        spec = Deployment(self.deploy_dir).spec  # render writes it; a folder without one has no controller
        return spec.exists() and load_spec(spec, check_files=False).autoscale is not None

    def _serving(self) -> bool | None:
        """Whether a serving job of the deployment is under way; None when none is but Slurm could not say of
        one (UNKNOWN: a command that timed out), which is no reason to let the deployment's address go."""
        refs = serving_jobs(self.target)
        watch(refs)
        states = [job_status(ref).state for ref in refs]
        if any(state in UNDER_WAY for state in states):
            return True
        return None if JobState.UNKNOWN in states else False

    def submit(self) -> str:
        """sbatch `D/gateway.sub` again; the successor's id, written where it will look (raises SlurmError)."""
        ref = SlurmExecutor().submit(GatewayJob, self.deploy_dir)
        SuccessorRecord(job_id=ref.job_id, at=time.time()).write(self.paths.gateway_successor)
        return ref.job_id

    def watch_successor(self) -> None:
        """Log the successor's scheduler state as it changes; forget one that ended before it served, so that
        another is submitted at once (why_not bounds them)."""
        assert self.successor is not None
        state = job_state(SLURM, self.successor)
        if state[0] and state != self._successor_state:
            self._successor_state = state
            log.info("gateway job %s: its successor %s is %s", self.job_id, self.successor, described(state))
        if gone_or_ended(state) and not self.replaced():
            self.lost += 1
            log.warning(
                "gateway job %s: its successor %s ended (%s) before it served; %s",
                self.job_id,
                self.successor,
                state[0],
                "submitting another" if self.lost < SUCCESSOR_ATTEMPTS else f"{self.lost} did: no more",
            )
            self.successor, self._successor_state = None, ("", "")

    def replaced(self) -> bool:
        """The record names the successor: it serves now."""
        record = read_gateway(record_path(self.target))
        return record is not None and self.successor is not None and record.job_id == self.successor

    def _say(self, why: str) -> None:
        if why != self._said:
            log.info("gateway job %s: no successor: %s", self.job_id, why)
            self._said = why

    async def run(self, server: Any) -> None:
        """Until the successor serves (then `server.should_exit`), or the server stops."""
        end: float | None = None
        read_end_at = submit_at = watched_at = 0.0
        while not server.should_exit:
            now = time.time()
            if now >= read_end_at:
                _, end = await asyncio.to_thread(job_times, SLURM, self.job_id)
                read_end_at = now + (END_REFRESH_S if end is not None else UNSURE_RETRY_S)
            if self.successor is None and end is not None and now >= max(self.plan.renew_at(end), submit_at):
                why = await asyncio.to_thread(self.why_not, now)
                if why is not None:
                    self._say(why)
                    submit_at = now + (UNSURE_RETRY_S if why == UNSURE else END_REFRESH_S)
                else:
                    try:
                        self.successor = await asyncio.to_thread(self.submit)
                        log.info("gateway job %s: submitted its successor %s", self.job_id, self.successor)
                    except SlurmError as exc:
                        log.warning("gateway job %s: sbatch of its successor failed: %s", self.job_id, exc)
                        submit_at = now + SBATCH_RETRY_S
            if self.successor is not None and self.replaced():
                log.info("gateway job %s: its successor %s serves; stopping", self.job_id, self.successor)
                server.should_exit = True
                return
            if self.successor is not None and now >= watched_at + SUCCESSOR_STATE_S:
                watched_at = now
                await asyncio.to_thread(self.watch_successor)
            await asyncio.sleep(RECORD_POLL_S)
