"""launch.json → LaunchPlan.  The plan is written by ``hpc/render.py``; see DEVELOPERS.md for the contract."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import model_names
from .auth import MODES as AUTH_MODES


class PlanError(ValueError):
    """launch.json is missing or malformed."""


#: Seconds a stopping leader drains in-flight requests (launch.json ``drain_s``); the .sub asks Slurm for its
#: time-limit warning this much (plus the release and unload time) before the end (hpc/render.py).
DEFAULT_DRAIN_S = 10.0
#: What an ordered stop needs beyond the drain: the followers' release, the unload, MPI_Finalize.
STOP_OVERHEAD_S = 20.0
#: Slurm's time-limit warning comes this long before the end (the .sub's --signal=B:USR1@<this>), early enough
#: for an ordered stop; a renewing job's renewer starts that stop itself at this lead, on its own clock.
STOP_LEAD_S = int(DEFAULT_DRAIN_S + STOP_OVERHEAD_S)
#: A leader's backstop, SIGTERM → SIGKILL of its tritonserver group: this long after the drain (``stop_grace_s``).
STOP_GRACE_AFTER_DRAIN_S = 3.0
#: A stopping leader's launcher holds SIGTERM back while its model drains (launcher/stop.py LeaderDrain): a model
#: that did not say "draining" within this many seconds does not drain itself, and gets SIGTERM at once.
DRAIN_ACK_S = 1.5
#: Once the model drained and tritonserver got SIGTERM: how long its unload (the followers' release and
#: MPI_Finalize, each bounded by 5 s) may take before the SIGKILL backstop, if that is later than stop_grace_s.
UNLOAD_AFTER_DRAIN_S = 8.0
#: How long after the drain a follower still waits for its leader's release (``release_wait_s``).
RELEASE_WAIT_AFTER_DRAIN_S = 10.0
#: How long a stop request (the cancel marker, the job's own stop request) may go unanswered by the leaders'
#: launchers (no ``rank-<r>.stopping``) before ``scancel --signal=TERM`` to the steps: launchers from before they
#: watched the files, or a leader still starting (hpc/executors.py, the `.sub`'s trap, launcher/renew.py).
STOP_ACK_S = 3.0
#: ``hpc-serve cancel``: how long the ordered stop may take before plain scancel / SIGKILL (``--grace``).
CANCEL_GRACE_S = 30.0
#: Seconds a leader's tritonserver may take to answer ``/v2/health/ready`` (spec ``triton.ready_timeout_s``).
DEFAULT_READY_TIMEOUT_S = 900
#: Seconds a replica leader's warm-up request (one generated token through the ensemble, launcher/warmup.py) may
#: take once tritonserver is ready, before the replica is FAILED (launch.json ``warmup_timeout_s``): a real first
#: request answers in well under a second on the CPU engine and in seconds on TensorRT-LLM.
DEFAULT_WARMUP_TIMEOUT_S = 120.0

#: Renewal (spec ``renew:``, launcher/renew.py). The least time a job is given to start before it renews, and a
#: successor to start before its predecessor's ordered stop: ``renew.before`` must lie between the stop's lead
#: plus this and ``slurm.time`` minus this.
RENEW_STARTUP_S = 30.0
#: How long in-flight requests may still run on a predecessor once its successor serves (``renew.drain``).
RENEW_DRAIN_S = 60.0
#: Seconds between a discovery's looks for new, lost and draining replicas: the gateway's (spec
#: ``gateway.refresh_s``, ``hpc-serve gateway --refresh``) and ``hpc.client``'s (``refresh_s``). Defined here, not
#: beside the discovery (hpc/gateway/discovery.py), because the renewer's notice below derives from it and the
#: launcher imports stdlib and its own package only.
DISCOVERY_REFRESH_S = 5.0
#: What a draining mark's notice adds to a discovery's refresh: the look itself (its health checks) takes time.
NOTICE_MARGIN_S = 2.0
#: How long after a draining mark every client has seen it: the gateway and ``hpc.client`` look again every
#: ``DISCOVERY_REFRESH_S`` (their ``refresh_s``); a spec's longer ``gateway.refresh_s``: ``renew_notice_s``.
RENEW_NOTICE_S = DISCOVERY_REFRESH_S + NOTICE_MARGIN_S


def renew_notice_s(refresh_s: float) -> float:
    """launch.json's ``renew.notice_s`` for a gateway that looks every ``refresh_s`` (0: no gateway job): every
    client, the gateway and ``hpc.client`` at ``DISCOVERY_REFRESH_S``, has looked again by then."""
    return max(RENEW_NOTICE_S, refresh_s + NOTICE_MARGIN_S)


#: Environment of every rank's tritonserver: Open MPI inside the python backend stubs needs the hash GDS under
#: PMIx (tensorrtllm_backend#553).
BASE_ENV = {"PMIX_MCA_gds": "hash"}
#: ... and in orchestrator mode, TensorRT-LLM's orchestrator spawns its own workers.
ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def default_env(mode: str) -> dict[str, str]:
    """What launch.json's ``env`` holds for ``mode`` (render writes it; the launcher applies it as defaults
    under a plan that lacks it, e.g. one written by hand)."""
    return {**BASE_ENV, **(ORCHESTRATOR_ENV if mode == "orchestrator" else {})}


@dataclass(frozen=True)
class LaunchPlan:
    """The launcher's only input.  Optional keys beyond DEVELOPERS.md, the bounds of an ordered stop:

    - ``drain_s`` (default 10): the leader's tritonserver gets ``--exit-timeout-secs`` from it: on SIGTERM it stops
      taking requests, waits at most this long for those in flight, unloads (the CPU engine's finalize releases
      the followers) and exits, whatever is still running. A ``--exit-timeout-secs`` in ``server_args`` wins.
    - ``release_wait_s`` (default drain + 10): how long a follower waits after a stop signal for its leader's
      release before ending its tritonserver itself (launcher/stop.py).
    - ``stop_grace_s`` (default drain + 3): SIGTERM → SIGKILL of the leader's tritonserver group, a backstop: it
      exits by itself within the drain time, unless its model never finishes unloading (tritonserver then
      hangs in its own teardown after "Exit timeout expired").
    """

    deployment_dir: Path
    model_repository: str
    tp_size: int = 1
    pp_size: int = 1
    replicas: int = 1
    world_size_per_replica: int | None = None
    mode: str = "leader"
    tritonserver: str | None = None
    ports: dict = field(default_factory=lambda: {"http": "auto", "grpc": "auto", "metrics": "auto"})
    follower_models: tuple[str, ...] = (model_names.TENSORRT_LLM,)
    server_args: tuple[str, ...] = ()
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    #: how long the leader's warm-up request may take (launcher/warmup.py); optional key ``warmup_timeout_s``
    warmup_timeout_s: float = DEFAULT_WARMUP_TIMEOUT_S
    env: dict = field(default_factory=dict)
    stop_grace_s: float | None = None
    name: str = ""
    drain_s: float = DEFAULT_DRAIN_S
    release_wait_s: float | None = None
    #: "token": the leader's tritonserver requires the deployment's token (launcher/auth.py); a plan written
    #: without the key (by hand, or before there was one) serves without
    auth: str = "none"
    #: "per-rank": each rank's tritonserver sees only its own GPU (launcher/gpu.py); render resolves the spec's
    #: slurm.gpu_binding into it; a plan without the key leaves CUDA_VISIBLE_DEVICES alone
    gpu_binding: str = "none"

    @property
    def exit_timeout_s(self) -> float:
        """tritonserver's effective exit timeout: the last ``--exit-timeout-secs`` of server_args, else drain_s."""
        value = self.drain_s
        args = list(self.server_args)
        for i, arg in enumerate(args):
            if arg == "--exit-timeout-secs" and i + 1 < len(args):
                arg = f"--exit-timeout-secs={args[i + 1]}"
            if arg.startswith("--exit-timeout-secs="):
                try:
                    value = float(arg.split("=", 1)[1])
                except ValueError:
                    pass
        return value

    @property
    def grace_s(self) -> float:
        """SIGTERM → SIGKILL of the leader's tritonserver group (``stop_grace_s``, default exit timeout + 3)."""
        return self.stop_grace_s if self.stop_grace_s is not None else self.exit_timeout_s + STOP_GRACE_AFTER_DRAIN_S

    @property
    def follower_wait_s(self) -> float:
        """How long a follower waits for its leader's release after a stop signal (see launcher/stop.py)."""
        return (
            self.release_wait_s if self.release_wait_s is not None else self.exit_timeout_s + RELEASE_WAIT_AFTER_DRAIN_S
        )


def load(path: str | os.PathLike[str]) -> LaunchPlan:
    """Read ``DIR/launch.json`` (or a launch.json path).  Records go under the directory actually given, which
    is the same as ``deployment_dir`` unless the folder is mounted elsewhere (e.g. inside a container)."""
    p = Path(path).expanduser().absolute()
    file = p if p.is_file() else p / "launch.json"
    if not file.is_file():
        raise PlanError(f"{file} not found: `python -m launcher DIR` needs a rendered deployment folder")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise PlanError(f"{file}: invalid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version", 1) != 1:
        raise PlanError(f"{file}: expected a version 1 launch plan object")
    root = file.parent
    repo = data.get("model_repository")
    if not repo:
        raise PlanError(f"{file}: model_repository is required")
    repo_path = Path(repo) if os.path.isabs(repo) else root / repo
    mode = data.get("mode", "leader") or "leader"
    if mode not in ("leader", "orchestrator"):
        raise PlanError(f'{file}: mode must be "leader" or "orchestrator", got {mode!r}')
    auth = data.get("auth", "none") or "none"
    if auth not in AUTH_MODES:
        raise PlanError(f"{file}: auth must be one of {', '.join(AUTH_MODES)}, got {auth!r}")
    gpu_binding = data.get("gpu_binding", "none") or "none"
    if gpu_binding not in ("per-rank", "none"):
        raise PlanError(f'{file}: gpu_binding must be "per-rank" or "none", got {gpu_binding!r}')

    def num(key: str, default: float | None, kind: type = int) -> Any:
        value = data.get(key)
        if value is None:
            return default
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise PlanError(f"{file}: {key} must be a number, got {value!r}") from None

    wpr = data.get("world_size_per_replica")
    return LaunchPlan(
        deployment_dir=root,
        model_repository=str(repo_path),
        tp_size=num("tp_size", 1),
        pp_size=num("pp_size", 1),
        replicas=num("replicas", 1),
        world_size_per_replica=int(wpr) if wpr is not None else None,
        mode=mode,
        tritonserver=data.get("tritonserver") or None,
        ports=dict(data.get("ports") or {}),
        follower_models=tuple(data.get("follower_models") or (model_names.TENSORRT_LLM,)),
        server_args=tuple(str(a) for a in data.get("server_args") or ()),
        ready_timeout_s=num("ready_timeout_s", DEFAULT_READY_TIMEOUT_S, float),
        warmup_timeout_s=num("warmup_timeout_s", DEFAULT_WARMUP_TIMEOUT_S, float),
        env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
        stop_grace_s=num("stop_grace_s", None, float),
        drain_s=num("drain_s", DEFAULT_DRAIN_S, float),
        release_wait_s=num("release_wait_s", None, float),
        name=str(data.get("name") or ""),
        auth=auth,
        gpu_binding=gpu_binding,
    )
