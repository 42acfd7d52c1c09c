"""What `hpc-serve status` and `hpc-serve endpoints` print for a deployment: its jobs, its gateway first.

Why a module apart from hpc/cli/jobs.py: a deployment (every job of one spec `name` in one workdir, and the
gateway in front of them) is more than one job, and what it shows is assembled here once for both commands
(and for `--json`), instead of in each command. Web-stack free: the gateway is probed with urllib.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hpc.jobs.autoscale import autoscale_record, decision_lines
from hpc.jobs.chain import ChainLink, chain_lines, chain_links
from hpc.jobs.executors import watch
from hpc.jobs.gateway import deployment_gateway, serving_jobs
from hpc.jobs.kinds import GatewayJob, job_class_of
from hpc.jobs.status import JobStatus
from hpc.jobs.track import job_status
from hpc.scheduler.index import JobRef
from hpc.serving.deployment import Target
from hpc.serving.gateway_record import GatewayLine, live_gateway
from launcher.contracts.autoscale import AutoscaleRecord
from launcher.contracts.records import EndpointRecord, GatewayRecord, read_endpoints


@dataclass
class DeploymentView:
    """The deployment's jobs under way (or its newest job, when none is) and its gateway."""

    target: Target
    jobs: list[JobStatus] = field(default_factory=list)
    gateway: GatewayLine | None = None
    #: its renewal chains (spec `renew:`), oldest job first (hpc/jobs/chain.py)
    chain: list[ChainLink] = field(default_factory=list)
    #: the autoscaling controller's record (spec `autoscale:`, hpc/jobs/autoscale.py), None without one
    autoscale: AutoscaleRecord | None = None

    def summary(self) -> str:
        lines = [f"{self.target.name} in {self.target.workdir}"]
        lines += [status.summary() for status in self.jobs] or ["no job yet"]
        lines += chain_lines(self.chain)
        if self.gateway is not None:
            lines.append(self.gateway.summary())
        if self.autoscale is not None:
            lines += decision_lines(self.autoscale)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.target.name,
            "workdir": str(self.target.workdir),
            "jobs": [status.to_json() for status in self.jobs],
            "chain": [link.to_json() for link in self.chain],
            "gateway": self.gateway.to_json() if self.gateway else None,
            "autoscale": self.autoscale.to_dict() if self.autoscale else None,
        }


def deployment_status(target: Target, refs: Sequence[JobRef] = ()) -> DeploymentView:
    """The jobs named (`refs`), or every serving job of the deployment still under way (else its newest)."""
    if refs:
        statuses = shown = [job_status(ref) for ref in refs]
    else:
        jobs = serving_jobs(target)
        watch(jobs)  # one sacct for all of them
        statuses = [job_status(ref) for ref in jobs]
        shown = [s for s in statuses if not s.done] or statuses[-1:]
    chain = chain_links(target, {s.job_id: s for s in statuses})
    return DeploymentView(target, shown, deployment_gateway(target), chain, autoscale_record(target))


def ready_endpoints(target: Target, refs: Sequence[JobRef] = ()) -> list[EndpointRecord]:
    """The replicas of the jobs named (as published), or of every job of the deployment that is READY now (a
    job that ended may have left its records behind)."""
    if refs:
        return [e for ref in refs if job_class_of(ref.job_dir) is not GatewayJob for e in read_endpoints(ref.paths)]
    jobs = serving_jobs(target)
    watch(jobs)
    return [e for ref in jobs for e in job_status(ref).endpoints]


def gateway_of(target: Target | None) -> GatewayRecord | None:
    """The deployment's gateway record when its gateway answers now."""
    return live_gateway(target) if target is not None else None


def endpoint_lines(gateway: GatewayRecord | None, endpoints: Sequence[EndpointRecord], fmt: str) -> list[str]:
    """`endpoints` in `fmt` (text, env, json): the gateway first when one answers, then each replica."""
    if fmt == "json":
        rows: list[dict[str, Any]] = []
        if gateway is not None:
            rows.append({"kind": "gateway", **gateway.to_dict(), "openai_base_url": f"{gateway.url}/v1"})
        rows += [
            {
                "kind": "replica",
                **e.to_dict(),
                "http_url": e.http_url,
                "grpc_url": e.grpc_url,
                "metrics_url": e.metrics_url,
            }
            for e in endpoints
        ]
        return [json.dumps(rows, indent=2)]
    lines = []
    if fmt == "env":
        if gateway is not None:
            lines += [f"GATEWAY_URL={gateway.url}", f"OPENAI_BASE_URL={gateway.url}/v1"]
        if endpoints:
            first = endpoints[0]
            lines += [
                f"TRITON_HOST={first.address}",
                f"TRITON_HTTP_URL={first.http_url}",
                f"TRITON_GRPC_URL={first.grpc_url}",
                f"TRITON_METRICS_URL={first.metrics_url}",
                f"TRITON_HTTP_URLS={','.join(e.http_url for e in endpoints)}",
            ]
        return lines
    if gateway is not None:
        where = f"job {gateway.job_id} on {gateway.host}" if gateway.job_id else f"{gateway.host} (pid {gateway.pid})"
        token = ", Bearer token: hpc-serve token" if gateway.auth else ""
        lines.append(f"gateway ({where}): {gateway.url}  (OpenAI base URL {gateway.url}/v1{token})")
    several_jobs = len({e.job_id for e in endpoints}) > 1
    for e in endpoints:
        name = f"{e.job_id}/{e.replica}" if several_jobs else str(e.replica)
        lines.append(f"replica {name} on {e.host}: http {e.http_url}  grpc {e.grpc_url}  metrics {e.metrics_url}")
    return lines


def print_endpoints(target: Target | None, refs: Sequence[JobRef], fmt: str) -> bool:
    """Print what `hpc-serve endpoints` shows; False when there is nothing to show (no gateway, no replica).
    `target` None: the deployment of the (one) job named, when its folder has a readable spec."""
    if target is None and refs:
        target = _target_of(refs[0])
    endpoints = ready_endpoints(target, refs) if target is not None else read_endpoints(refs[0].paths)
    gateway = gateway_of(target)
    if not endpoints and gateway is None:
        return False
    for line in endpoint_lines(gateway, endpoints, fmt):
        print(line)
    return True


def _target_of(ref: JobRef) -> Target | None:
    from hpc.serving.deployment import target_of_folder
    from hpc.spec import SpecError

    try:
        return target_of_folder(ref.deploy_dir)
    except (SpecError, OSError):
        return None  # a folder without a readable spec.yaml (rendered by hand): its replicas, no gateway
