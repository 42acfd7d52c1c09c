"""`GET /gateway/health`: the gateway's own liveness route, answered without a token.

Why not `/v2/health/live`: that says only that *a* server listens. A gateway about to start, `status` and the
clients read the address record and must know that the answer comes from this deployment's gateway (a stale
record's port may belong to another process by now), so this route names the deployment it serves.
"""

from __future__ import annotations

import os

from fastapi import APIRouter, Request

from hpc.gateway.openai_api import gateway_of
from hpc.serving.gateway_record import health_body
from launcher.contracts.urls import GATEWAY_HEALTH_PATH

router = APIRouter()


#: the app state's key of a worker's index, in a gateway of several worker processes (hpc/gateway/workers.py)
WORKER = "worker"


@router.get(GATEWAY_HEALTH_PATH)
async def gateway_health(request: Request) -> dict[str, object]:
    """The deployment, the gateway's pid (its record's: a worker's parent) and its ready replicas; in a gateway of
    several workers, which worker answered."""
    gateway = gateway_of(request)
    worker = getattr(request.app.state, WORKER, None)
    if worker is None:
        return health_body(gateway.target) | {"replicas_ready": len(gateway.balancer.replicas)}
    parent = {"pid": os.getppid(), "worker": worker}
    return health_body(gateway.target) | parent | {"replicas_ready": len(gateway.balancer.replicas)}
