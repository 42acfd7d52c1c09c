"""A replica leader's way from a started tritonserver to a published endpoint, in this order:

1. loading: ``/v2/health/ready`` answers 200 (every model loaded), within ``ready_timeout_s``;
2. with ``auth: token``: tritonserver refuses a restricted request without the token and serves it with
   (launcher/contracts/auth.py ``Guard.verify``), so an unprotected server is never offered;
3. the stub watch is armed (launcher/node/watch.py): from here on a dead python stub ends the rank;
4. warming up: one real request, one generated token through the ensemble, must come back (launcher/node/warmup.py),
   within ``warmup_timeout_s``.

Only then does the leader's role (launcher/node/roles.py) publish the endpoint record, so READY (hpc/jobs/track.py)
means a token came back. Each phase is written to the replica's startup record (records.StartupRecord,
``endpoints/replica-<k>.starting``) so that ``hpc-serve status`` says what a STARTING replica waits for; the record
is removed when the rank publishes or ends. Why a module of its own: roles.py is the rank's life (ports, processes,
records); this is the one sequence that decides READY.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from launcher.contracts import auth, records
from launcher.contracts.job_index import job_cluster
from launcher.contracts.layout import JobPaths
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.rank import RankInfo, Role
from launcher.contracts.text_enum import TextEnum
from launcher.node.supervise import Child, HealthWait, Supervisor, log, wait_ready
from launcher.node.warmup import MODELS, WarmupState, choose, warm_up
from launcher.node.watch import RankWatch


class ReadyState(TextEnum):
    """Where a leader's way to READY ended: READY; EXITED (tritonserver ended, or fail-fast ended it); STOPPING (a
    stop signal came first); or why the launcher gave up on it (the rest: launcher/node/roles.py GAVE_UP)."""

    READY = "ready"
    EXITED = "exited"
    STOPPING = "stopping"
    READY_TIMEOUT = "ready-timeout"
    AUTH_FAILED = "auth"
    WARMUP_FAILED = "warmup"


#: a wait (for the health check, for the warm-up's answer) that ended with the server, or with a stop
_ENDED: dict[HealthWait | WarmupState, ReadyState] = {
    HealthWait.EXITED: ReadyState.EXITED,
    HealthWait.STOPPING: ReadyState.STOPPING,
    WarmupState.EXITED: ReadyState.EXITED,
    WarmupState.STOPPING: ReadyState.STOPPING,
}


@dataclass(frozen=True)
class Readiness:
    """``state``: a ReadyState (``error`` says why the launcher gave up, when it did). ``loaded_s``/``warmup_s``:
    how long loading and the warm-up took (the log line and the measurements)."""

    state: ReadyState
    error: str = ""
    loaded_s: float = 0.0
    warmup_s: float = 0.0


def write_phase(paths: JobPaths, info: RankInfo, me: Role, child: Child, phase: str, detail: str = "") -> None:
    """The replica's startup record: which phase, since when. A write that fails is logged, never fatal: it is
    what `status` shows, not what decides READY."""
    record = records.StartupRecord(
        job_id=info.job_id,
        cluster=job_cluster() or "",
        replica=me.replica,
        rank=info.job_rank,
        host=info.node,
        phase=phase,
        since=time.time(),
        started_at=child.started_at,
        detail=detail,
    )
    try:
        records.write_json_atomic(paths.starting(me.replica), record.to_dict())
    except OSError as exc:
        log(f"could not write the startup record: {exc}")


def clear_phase(paths: JobPaths, me: Role) -> None:
    try:
        paths.starting(me.replica).unlink()
    except OSError:  # never written, already removed, or a folder gone with the job
        pass


def become_ready(
    plan: LaunchPlan,
    paths: JobPaths,
    info: RankInfo,
    me: Role,
    sup: Supervisor,
    child: Child,
    http_port: int,
    guard: auth.Guard | None,
    watch: RankWatch,
) -> Readiness:
    """Steps 1–4 of the module docstring for a started leader's tritonserver."""
    write_phase(paths, info, me, child, records.LOADING)
    start = time.monotonic()
    state = wait_ready(sup, child, http_port, plan.ready_timeout_s)
    loaded = time.monotonic() - start
    if state is HealthWait.TIMEOUT:
        why = f"not ready after ready_timeout_s={plan.ready_timeout_s:g} s"
        return Readiness(ReadyState.READY_TIMEOUT, why, loaded)
    if state is not HealthWait.READY:
        return Readiness(_ENDED[state], loaded_s=loaded)
    token: str | None = None
    if guard is not None:
        try:  # before anything is sent or published: an unprotected server must never be offered
            guard.verify(http_port)
            token = auth.read_token(guard.token_file)
        except auth.AuthSetupError as exc:
            return Readiness(ReadyState.AUTH_FAILED, str(exc), loaded)
        log("auth: token: checked that tritonserver refuses requests without the deployment's token")
    watch.arm_stubs(child.proc.pid)  # from now on a dead stub ends the rank (launcher/node/watch.py)
    warmup = choose(Path(plan.model_repository), plan.warmup_timeout_s, token)
    if warmup is None:
        log(f"no {' or '.join(MODELS)} model in {plan.model_repository}: READY on its health check alone")
        return Readiness(ReadyState.READY, loaded_s=loaded)
    write_phase(paths, info, me, child, records.WARMING_UP, warmup.detail)
    outcome = warm_up(sup, child, warmup, http_port)
    if outcome.state is WarmupState.OK:
        log(f"warm-up: {warmup.detail} came back in {outcome.seconds:.3f} s ({outcome.text!r})")
        return Readiness(ReadyState.READY, loaded_s=loaded, warmup_s=outcome.seconds)
    if outcome.state in (WarmupState.FAILED, WarmupState.TIMEOUT):
        why = f"warm-up request ({warmup.detail}, POST {warmup.path}) failed: {outcome.why}"
        return Readiness(ReadyState.WARMUP_FAILED, why, loaded, outcome.seconds)
    return Readiness(_ENDED[outcome.state], loaded_s=loaded, warmup_s=outcome.seconds)
