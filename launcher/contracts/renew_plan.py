"""What a renewer decides, and when: the `renew` block of launch.json and the timing rules, without any I/O.

Kept apart from the loop that acts on them (launcher/jobscript/renew.py) so that every rule is unit-tested with plain
numbers: when the successor is submitted, when not (and the words `status` shows for it), when the
predecessor is marked draining, how long its in-flight requests may run, and when it stops at the latest.
Also the reading of what tritonserver says (the engine's active requests, from its metrics page: the one parser,
launcher/contracts/prometheus.py) and the environment a successor is submitted with. Standard library only.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.contracts.config import RENEW_DRAIN_S, RENEW_NOTICE_S
from launcher.contracts.prometheus import ENGINE_REQUEST_FAMILY, MODEL_IN_FLIGHT_FAMILY, PENDING_FAMILY, samples

#: the environment a renewer submits its successor with: its own job id, and the successor's place in the chain
ENV_PREDECESSOR = "HPC_SERVE_PREDECESSOR"
ENV_CHAIN_INDEX = "HPC_SERVE_CHAIN_INDEX"
#: a job's own Slurm variables must not reach its successor (its srun would read some of them as options, e.g.
#: SLURM_MEM_PER_NODE, SLURM_CPU_BIND); SLURM_CONF says which cluster, so it stays. SBATCH_* are the submitter's
#: own sbatch options (sbatch sets none in a job): they stay, so the successor is submitted as its first job was.
_JOB_ONLY = re.compile(r"^SLURM_")
_KEEP = ("SLURM_CONF",)
#: the engine's requests in flight: these request_types of the engine's request family (launcher/contracts/prometheus.py)
IN_FLIGHT = ("active", "waiting")


@dataclass(frozen=True)
class RenewPlan:
    """launch.json's ``renew`` (render writes it from the spec's ``renew:`` section). Seconds, and epoch seconds
    for ``until``."""

    before_s: float  # the successor is submitted this long before the time limit
    stop_lead_s: float  # the ordered stop starts this long before the time limit (the .sub's USR1 lead)
    time_limit_s: float | None = None  # slurm.time: the end when Slurm cannot be asked (start + this)
    max_jobs: int | None = None  # jobs in the chain, the first included; None: no bound
    until: float | None = None  # no successor is submitted after this
    drain_s: float = RENEW_DRAIN_S  # in-flight requests may run this long once the successor serves
    notice_s: float = RENEW_NOTICE_S  # every client has seen a draining mark this long after it was written

    def to_dict(self) -> dict[str, float | int | None]:
        """launch.json's ``renew`` object."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, block: Mapping[str, object]) -> RenewPlan:
        """The plan of launch.json's ``renew`` object (ValueError naming the key when one is missing or malformed;
        launcher/contracts/plan.py adds the file)."""

        def num(key: str, default: float | None = None) -> float | None:
            value = block.get(key, default)
            if value is None:
                return None
            try:
                return float(value)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ValueError(f"{key} must be a number, got {value!r}") from None

        for key in ("before_s", "stop_lead_s"):
            if block.get(key) is None:
                raise ValueError(f"{key} is required")
        max_jobs = num("max_jobs")
        return cls(
            before_s=num("before_s") or 0.0,
            stop_lead_s=num("stop_lead_s") or 0.0,
            time_limit_s=num("time_limit_s"),
            max_jobs=None if max_jobs is None else int(max_jobs),
            until=num("until"),
            drain_s=num("drain_s", RENEW_DRAIN_S) or 0.0,
            notice_s=num("notice_s", RENEW_NOTICE_S) or 0.0,
        )

    def renew_at(self, end: float) -> float:
        """When the successor is submitted."""
        return end - self.before_s

    def stop_at(self, end: float) -> float:
        """When this job's ordered stop starts at the latest, successor or not (what USR1 asks for, on time)."""
        return end - self.stop_lead_s

    def final_drain_at(self, end: float) -> float:
        """When a job that no successor relieves yet takes no new requests any more (``notice_s`` before its
        stop): what it has in flight can finish before the stop, instead of waiting on a stopping server."""
        return self.stop_at(end) - self.notice_s

    def idle_from(self, marked_at: float) -> float:
        """From when an idle replica may stop: no client sends it anything new once it saw the draining mark."""
        return marked_at + self.notice_s

    def drain_until(self, marked_at: float, end: float) -> float:
        """When the ordered stop starts even with requests still in flight: the drain timeout, or the time limit."""
        return min(self.idle_from(marked_at) + self.drain_s, self.stop_at(end))

    def why_not(self, index: int, now: float, stopped: str | None = None) -> str | None:
        """Why no successor is submitted (what `status` shows), or None: submit it. `index`: this job's place in
        the chain (1 for its first); `stopped`: the chain was cancelled (and how)."""
        if stopped:
            return stopped
        if self.max_jobs is not None and index >= self.max_jobs:
            return f"renew.max_jobs {self.max_jobs} reached: this is job {index} of the chain"
        if self.until is not None and now >= self.until:
            return f"renew.until {format_time(self.until)} has passed"
        return None


def format_time(epoch: float) -> str:
    """Local time, to the second: how Slurm shows times."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def active_requests(metrics_text: str) -> int | None:
    """Requests in flight, from tritonserver's metrics page: per model, the larger of the engine's active + waiting
    and the model's own count (hpc-serve's llmapi model: the engine's stats can stop coming while its requests
    run), plus those still in tritonserver's queues; None when the page has neither line (a backend that exports
    none: the drain then runs its whole timeout, as it does for a page it cannot read). One reading for the
    renewer and a stopping leader (launcher/node/stop.py `metrics_in_flight`)."""
    try:
        page = list(samples(metrics_text))
        engine: dict[str, float] = {}
        model: dict[str, float] = {}
        for s in page:
            name = s.labels.get("model", "")
            if s.name == ENGINE_REQUEST_FAMILY and s.labels.get("request_type") in IN_FLIGHT:
                engine[name] = engine.get(name, 0.0) + s.value
            elif s.name == MODEL_IN_FLIGHT_FAMILY:
                model[name] = model.get(name, 0.0) + s.value
        queued = [s.value for s in page if s.name == PENDING_FAMILY]
        if not engine and not model:
            return None
        held = sum(max(engine.get(m, 0.0), model.get(m, 0.0)) for m in {*engine, *model})
        return int(held + sum(queued))
    except (ValueError, OverflowError):  # not a page, or NaN / Inf in it
        return None


def successor_env(
    environ: Mapping[str, str], job_id: str, index: int, runtime_root: str | None = None
) -> dict[str, str]:
    """What the successor's sbatch runs with: this job's environment (sbatch's default --export=ALL carried the
    submitter's to it) without this job's own Slurm variables, and without the renewer's own
    PYTHONPATH entry, plus its link to this job."""
    env = {k: v for k, v in environ.items() if not _JOB_ONLY.match(k) or k in _KEEP}
    if runtime_root is not None and "PYTHONPATH" in env:
        rest = [p for p in env["PYTHONPATH"].split(os.pathsep) if p and p != runtime_root]
        if rest:
            env["PYTHONPATH"] = os.pathsep.join(rest)
        else:
            del env["PYTHONPATH"]
    env[ENV_PREDECESSOR] = job_id
    env[ENV_CHAIN_INDEX] = str(index + 1)
    return env


def chain_place(environ: Mapping[str, str]) -> tuple[str, int]:
    """(predecessor, index) of this job: from its predecessor's renewer, else ("", 1): a chain starts here."""
    index = environ.get(ENV_CHAIN_INDEX, "")
    return environ.get(ENV_PREDECESSOR, ""), int(index) if index.isdigit() and int(index) > 0 else 1
