"""The defaults of launch.json's optional keys and of the stop and renewal timings (DEVELOPERS.md, "Who
owns what"). The plan itself, and how it is read and written, is launcher/contracts/plan.py."""

from __future__ import annotations

#: Seconds a stopping leader drains in-flight requests (launch.json ``drain_s``); the .sub asks Slurm for its
#: time-limit warning this much (plus the release and unload time) before the end (hpc/render/jobfiles.py).
DEFAULT_DRAIN_S = 10.0
#: What an ordered stop needs beyond the drain: the followers' release, the unload, MPI_Finalize.
STOP_OVERHEAD_S = 20.0
#: Slurm's time-limit warning comes this long before the end (the .sub's --signal=B:USR1@<this>), early enough
#: for an ordered stop; a renewing job's renewer starts that stop itself at this lead, on its own clock.
STOP_LEAD_S = int(DEFAULT_DRAIN_S + STOP_OVERHEAD_S)
#: A replica that crashed before it was ever READY (tritonserver or a python stub killed by a signal while the models
#: load or warm up: python_backend r24.10's stub health race, docs/decisions.md "The start crash") is started again
#: this many times whatever its replica_policy; restart's own bound counts it too.
START_CRASH_RESTARTS = 1
#: ... the signals that make a start crash (an abort or a fault; not SIGKILL/SIGTERM, which someone sent)
START_CRASH_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS")
#: A leader's backstop, SIGTERM → SIGKILL of its tritonserver group: this long after the drain (``stop_grace_s``).
STOP_GRACE_AFTER_DRAIN_S = 3.0
#: A stopping leader's launcher holds SIGTERM back while its model drains (launcher/node/stop.py LeaderDrain): a model
#: that did not say "draining" within this many seconds does not drain itself, and gets SIGTERM at once.
DRAIN_ACK_S = 1.5
#: Once the model drained and tritonserver got SIGTERM: how long its unload (the followers' release and
#: MPI_Finalize, each bounded by 5 s) may take before the SIGKILL backstop, if that is later than stop_grace_s.
UNLOAD_AFTER_DRAIN_S = 8.0
#: How long after the drain a follower still waits for its leader's release (``release_wait_s``).
RELEASE_WAIT_AFTER_DRAIN_S = 10.0
#: How long a stop request (the cancel marker, the job's own stop request) may go unanswered by the leaders'
#: launchers (no ``rank-<r>.stopping``) before ``scancel --signal=TERM`` to the steps: launchers from before they
#: watched the files, or a leader still starting (hpc/jobs/executors.py, the `.sub`'s trap, launcher/jobscript/renew.py).
STOP_ACK_S = 3.0
#: ``hpc-serve cancel``: how long the ordered stop may take before plain scancel / SIGKILL (``--grace``).
CANCEL_GRACE_S = 30.0
#: Seconds a leader's tritonserver may take to answer ``/v2/health/ready`` (spec ``triton.ready_timeout_s``).
DEFAULT_READY_TIMEOUT_S = 900
#: Seconds a replica leader's warm-up request (one generated token through the ensemble, launcher/node/warmup.py) may
#: take once tritonserver is ready, before the replica is FAILED (launch.json ``warmup_timeout_s``): a real first
#: request answers in well under a second on the CPU engine and in seconds on TensorRT-LLM.
DEFAULT_WARMUP_TIMEOUT_S = 120.0

#: Renewal (spec ``renew:``, launcher/jobscript/renew.py). The least time a job is given to start before it renews, and a
#: successor to start before its predecessor's ordered stop: ``renew.before`` must lie between the stop's lead
#: plus this and ``slurm.time`` minus this.
RENEW_STARTUP_S = 30.0
#: How long in-flight requests may still run on a predecessor once its successor serves (``renew.drain``).
RENEW_DRAIN_S = 60.0
#: Seconds between a discovery's looks for new, lost and draining replicas: the gateway's (spec
#: ``gateway.refresh_s``, ``hpc-serve gateway --refresh``) and ``hpc.client``'s (``refresh_s``). Defined here, not
#: beside the discovery (hpc/serving/discovery.py), because the renewer's notice below derives from it and the
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


#: launch.json's ``mode``: every rank runs tritonserver and a replica's leader serves, or TensorRT-LLM's
#: orchestrator spawns its own workers (the spec's ``mode``)
LEADER, ORCHESTRATOR = "leader", "orchestrator"
MODES = (LEADER, ORCHESTRATOR)
#: Environment of every rank's tritonserver: Open MPI inside the python backend stubs needs the hash GDS under
#: PMIx (tensorrtllm_backend#553).
BASE_ENV = {"PMIX_MCA_gds": "hash"}
#: ... and in orchestrator mode, TensorRT-LLM's orchestrator is told to spawn them.
ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def default_env(mode: str) -> dict[str, str]:
    """What launch.json's ``env`` holds for ``mode`` (render writes it; the launcher applies it as defaults
    under a plan that lacks it, e.g. one written by hand)."""
    return {**BASE_ENV, **(ORCHESTRATOR_ENV if mode == ORCHESTRATOR else {})}
