"""``python -m launcher DIR``: one rank of a deployment, from launch.json to exit record."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from launcher.contracts.gpu import GpuBindingError, node_gpu_count, rank_gpus
from launcher.contracts.llmapi import ENGINE, LLMAPI
from launcher.contracts.plan import LaunchPlan, PlanError
from launcher.contracts.rank import RankInfo, Role, WorldSizeError, detect, role
from launcher.node.rank_output import log_to_rank_files
from launcher.node.roles import (
    EXIT_CONFIG,
    EngineFollower,
    EngineLeader,
    LlmapiLeader,
    LlmapiWorker,
    RankRole,
    record_failure,
)
from launcher.node.server import ServerBinary, ServerNotFound, resolve
from launcher.node.server_env import job_paths
from launcher.node.supervise import Supervisor, log

#: the launcher's one workflow decision: the role a rank plays, by the plan's workflow and whether the rank leads
#: its replica (launcher/node/roles.py)
ROLES: dict[tuple[str, bool], type[RankRole]] = {
    (ENGINE, True): EngineLeader,
    (ENGINE, False): EngineFollower,
    (LLMAPI, True): LlmapiLeader,
    (LLMAPI, False): LlmapiWorker,
}


def rank_role(plan: LaunchPlan, info: RankInfo, me: Role, server: ServerBinary) -> RankRole:
    """This rank's role (ROLES)."""
    return ROLES[plan.workflow, me.leader](plan, info, me, server)


def serve(plan: LaunchPlan, info: RankInfo, me: Role, server: ServerBinary, sup: Supervisor | None = None) -> int:
    """Start this rank's processes and supervise them until they exit; return the launcher's exit code."""
    return rank_role(plan, info, me, server).serve(sup)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``launcher.main(["DIR"])`` or ``python -m launcher DIR``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m launcher", description=__doc__)
    parser.add_argument("deployment", help="deployment folder containing launch.json (or the launch.json itself)")
    parser.add_argument("--dry-run", action="store_true", help="print this rank's tritonserver command and exit")
    args = parser.parse_args(argv)

    try:
        plan = LaunchPlan.read(args.deployment)
    except PlanError as exc:
        log(str(exc))
        return EXIT_CONFIG
    info = detect()
    if not args.dry_run:
        paths = job_paths(plan, info)
        own = info.step_replica is not None  # the .sub's replica steps: the launcher names the rank's files
        log_to_rank_files(paths.rank_log(info.job_rank, "out"), paths.rank_log(info.job_rank, "err"), own)
    try:
        me = role(info, plan.tp_size, plan.pp_size, plan.replicas, plan.world_size_per_replica)
        server = resolve(plan.tritonserver)
        gpus = rank_gpus(os.environ, plan.gpu_binding, info.local_rank, node_gpu_count())
    except (WorldSizeError, ServerNotFound, GpuBindingError) as exc:
        log(str(exc))
        record_failure(plan, info, EXIT_CONFIG, str(exc))
        return EXIT_CONFIG
    log(f"rank {info.job_rank}: GPUs: {gpus.why}")
    rank = rank_role(plan, info, me, server)
    if args.dry_run:
        print(rank.dry_run())
        return 0

    sup = rank.supervisor()
    sup.stop_requests = (job_paths(plan, info).cancel_marker, job_paths(plan, info).stop_request)
    sup.install()
    try:
        return rank.serve(sup)
    finally:
        # Whatever happened (including a bug above), never leave tritonserver behind.
        child = sup.child
        if child is not None and child.proc.poll() is None:
            sup.stop(child)
            sup.reap_group(child)
        sup.restore()
