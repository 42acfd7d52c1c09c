"""``python -m launcher DIR``: one rank of a deployment, from launch.json to exit record."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from launcher.contracts import auth, config, records
from launcher.contracts.gpu import GpuBindingError, node_gpu_count, rank_gpus
from launcher.contracts.job_index import job_cluster
from launcher.contracts.layout import Deployment
from launcher.contracts.llmapi import LLMAPI
from launcher.contracts.plan import LaunchPlan, PlanError
from launcher.contracts.rank import RankInfo, Role, WorldSizeError, detect, replica_restarts, role
from launcher.contracts.stop_records import StopNotice
from launcher.node.command import build_argv, remove_orphan_regions, remove_shm_regions
from launcher.node.llmapi import (
    LeaderNode,
    ModelFilesMissing,
    combined_watch,
    copy_model_files,
    engine_env,
    worker_node_argv,
)
from launcher.node.ports import PortError, Ports, allocate, check_fixed, taken
from launcher.node.rank_output import log_to_rank_files
from launcher.node.ready import AUTH_FAILED, READY_TIMEOUT, WARMUP_FAILED, become_ready, clear_phase
from launcher.node.server import ServerBinary, ServerNotFound, cache_dir, resolve
from launcher.node.server_env import child_env, job_paths, release_path, stop_path
from launcher.node.stop import (
    DRAIN_BY_METRICS_ENV,
    FOLLOWER_IGNORES,
    LEADER_IGNORES,
    FollowerStop,
    LeaderDrain,
    metrics_in_flight,
)
from launcher.node.supervise import LOG_TAIL, Child, Supervisor, describe, exit_code, log, signal_name
from launcher.node.watch import PeerWatch, RankWatch

EXIT_CONFIG = 2  # launch.json / world size / binary / access-token problems: nothing was started (or served)
EXIT_PORT = 3  # a fixed port is taken, or auto ports kept colliding
EXIT_WARMUP = 4  # the warm-up request (one token through the ensemble) failed or got no answer in time
EXIT_READY_TIMEOUT = 124
#: why the leader gave up on a started tritonserver (launcher/node/ready.py) → the launcher's exit code
GAVE_UP = {READY_TIMEOUT: EXIT_READY_TIMEOUT, AUTH_FAILED: EXIT_CONFIG, WARMUP_FAILED: EXIT_WARMUP}
PORT_ATTEMPTS = 5


def _announce_stop(plan: LaunchPlan, info: RankInfo, signum: int) -> LeaderDrain:
    """Write the stop file; the model answers in ``drain_file`` (``draining``, then ``drained``), and tritonserver
    gets its SIGTERM only once it drained (launcher/node/stop.py LeaderDrain says why)."""
    now = time.time()
    paths = job_paths(plan, info)
    drain_file = paths.drain(info.job_rank)
    drain_file.unlink(missing_ok=True)
    until = now + plan.exit_timeout_s
    # a model that is not asked to report (TensorRT-LLM's backend, the llmapi model: upstream's writes no drain
    # file, and the CPU engine's stand-in of it speaks the same contract) gets no drain_file
    reports = plan.workflow != LLMAPI and os.environ.get(DRAIN_BY_METRICS_ENV) != "1"
    notice = StopNotice(
        signal=signal.Signals(signum).name, at=now, drain_until=until, drain_file=str(drain_file) if reports else None
    )
    notice.write(stop_path(plan, info))
    # a model that reports no drain (TensorRT-LLM) is drained by its server's metrics: this rank's endpoint says where
    mine = [e for e in records.read_endpoints(paths) if e.rank == info.job_rank and e.metrics_port]
    probe = metrics_in_flight(mine[0].metrics_url) if mine else None
    return LeaderDrain(drain_file, until, ack_s=config.DRAIN_ACK_S, in_flight=probe)


def supervisor(plan: LaunchPlan, info: RankInfo, me: Role) -> Supervisor:
    """A leader's supervisor forwards stop signals; a follower's waits (bounded) for its leader's release,
    and gives up early once the leader's rank record shows the leader ended (launcher/node/stop.py)."""
    if me.leader:
        return Supervisor(
            plan.grace_s,
            on_stop=lambda signum: _announce_stop(plan, info, signum),
            unload_s=config.UNLOAD_AFTER_DRAIN_S,
        )
    leader = job_paths(plan, info).rank_record(me.replica * plan.world_size_per_replica)
    try:  # the model writes the release file there; a hand-run launcher has no ranks/ folder yet
        release_path(plan, info).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log(f"cannot create {release_path(plan, info).parent}: {exc}")
    return Supervisor(plan.grace_s, FollowerStop(plan.follower_wait_s, release_path(plan, info), leader))


def rank_watch(plan: LaunchPlan, info: RankInfo, me: Role) -> RankWatch:
    """Fail-fast (launcher/node/watch.py): the exit records of the other ranks of this rank's replica."""
    per_replica = plan.world_size_per_replica
    first = me.replica * per_replica
    paths = job_paths(plan, info)
    peers = {r: paths.rank_record(r) for r in range(first, first + per_replica) if r != info.job_rank}
    return RankWatch(PeerWatch(me.replica, peers))


def _argv(plan: LaunchPlan, info: RankInfo, me: Role, server: ServerBinary, ports: Ports | None) -> list[str]:
    return build_argv(
        server.argv0,
        model_repository=plan.model_repository,
        rank=info.job_rank,
        job_id=info.job_id,
        leader=me.leader,
        ports=ports,
        follower_models=plan.follower_models,
        backend_dir=server.backend_dir,
        server_args=plan.server_args,
        exit_timeout_s=plan.drain_s,
    )


def _single_node(env: dict[str, str] | os._Environ) -> bool:
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    return nodes is None or nodes.strip() == "1"


#: what a restart of the replica (replica_policy restart) cannot change: the `.sub` is told not to try
NOT_RESTARTABLE = (EXIT_CONFIG, EXIT_PORT)


def _write_record(plan: LaunchPlan, info: RankInfo, record: records.RankExitRecord) -> None:
    paths = job_paths(plan, info)
    try:
        records.write_json_atomic(paths.rank_record(info.job_rank), record.to_dict())
        if record.signal is None and record.exit_code in NOT_RESTARTABLE:
            paths.no_restart(info.job_rank).touch()  # the `.sub` looks once the step ended
    except OSError as exc:
        log(f"could not write the rank record: {exc}")


def _record_failure(plan: LaunchPlan, info: RankInfo, code: int, message: str, tail: Sequence[str] = ()) -> None:
    """The launcher gave up before (or instead of) running tritonserver: say why in the rank's exit record."""
    _write_record(plan, info, _rank_record(info, code, None, list(tail)[-LOG_TAIL:], message, None, time.time()))


def _rank_record(
    info: RankInfo,
    code: int | None,
    sig: str | None,
    tail: list[str],
    error: str | None,
    cause: int | None,
    ended_at: float,
) -> records.RankExitRecord:
    """This rank's exit record; ``error`` also ends its log tail."""
    return records.RankExitRecord(
        rank=info.job_rank,
        host=info.node,
        exit_code=code,
        signal=sig,
        log_tail=tail + ([error] if error else []),
        ended_at=ended_at,
        error=error,
        cause_rank=cause,
    )


def _exit_record(
    info: RankInfo, sup: Supervisor, child: Child, rc: int, error: str | None = None, gave_up: int | None = None
) -> records.RankExitRecord:
    """The rank's exit record for tritonserver's return code ``rc``, and why the launcher ended it, if it did."""
    sig, cause = signal_name(rc), None
    code: int | None = rc
    if gave_up is not None:
        sig, code = None, gave_up
    failure = sup.failure  # the launcher ended it (launcher/node/watch.py): a dead stub, a failed peer
    if failure is not None:
        error = error or failure.why
        cause = failure.cause_rank
        if failure.signal is not None or failure.exit_code is not None:  # the stub's end is the rank's
            sig, code = failure.signal, failure.exit_code
    # tritonserver's option table ("| key | value |", "+---+") says nothing about why a rank died.
    tail = [line for line in child.ring if line.strip() and not line.startswith(("|", "+-"))][-LOG_TAIL:]
    # the first write's time is kept: which rank failed first is told by it (hpc/jobs/track.py)
    return _rank_record(info, code, sig, tail, error, cause, sup.failed_at or time.time())


def _record_before_kill(plan: LaunchPlan, info: RankInfo, sup: Supervisor, child: Child) -> None:
    """The record of a rank the launcher is about to SIGKILL (a dead stub, a failed peer), written before the kill:
    the kill makes MPI peers abort, and Slurm may SIGKILL the whole step before tritonserver is even reaped."""
    _write_record(plan, info, _exit_record(info, sup, child, -signal.SIGKILL))


def _finish(
    plan: LaunchPlan,
    info: RankInfo,
    sup: Supervisor,
    child: Child,
    rc: int,
    error: str | None = None,
    gave_up: int | None = None,
    ready: bool | None = None,
) -> int:
    """Write the rank's exit record, reap tritonserver's group, remove its shared memory; the exit code.
    ``gave_up``: the launcher's own exit code when it stopped tritonserver itself (ready timeout, token check,
    warm-up): the record carries it, since tritonserver's exit after that SIGTERM is a clean 0. ``ready``: the
    leader's word that its replica was READY (a follower looks for the replica's endpoint record)."""
    if release_path(plan, info).exists() and sup.failure is None:
        # A follower whose leader stopped: TensorRT-LLM workers exit(0) then; ours end their tritonserver.
        log(f"rank {info.job_rank}: released by the leader")
        rc = 0
    sup.failed_at = sup.failed_at or time.time()
    replica = info.job_rank // plan.world_size_per_replica

    def write_record() -> None:
        record = _exit_record(info, sup, child, rc, error, gave_up)
        was_ready = ready if ready is not None else job_paths(plan, info).endpoint(replica).exists()
        if record.signal in config.START_CRASH_SIGNALS and not was_ready:
            try:  # before the record: the `.sub` reads both once the step ended
                job_paths(plan, info).start_crash(info.job_rank).touch()
            except OSError as exc:
                log(f"could not mark the start crash: {exc}")
        _write_record(plan, info, record)

    # Record first: when a rank dies its MPI peers abort and Slurm may SIGKILL this step within a second,
    # so the record must not wait for the stubs to be reaped. Rewritten after, with the complete log tail.
    write_record()
    sup.reap_group(child)
    write_record()
    error = error or (sup.failure.why if sup.failure is not None else None)
    removed = remove_shm_regions(info.job_rank, info.job_id)  # a killed stub or tritonserver leaves them
    log(
        f"rank {info.job_rank}: {child.name} exited with {signal_name(rc) or rc}"
        + (f" ({error})" if error else "")
        + (f"; removed {len(removed)} shared-memory regions it left in /dev/shm" if removed else "")
    )
    return exit_code(rc)


def serve(plan: LaunchPlan, info: RankInfo, me: Role, server: ServerBinary, sup: Supervisor | None = None) -> int:
    """Start tritonserver for this rank and supervise it until it exits; return the launcher's exit code."""
    sup = sup or supervisor(plan, info, me)
    watch = rank_watch(plan, info, me)
    sup.watch = watch.check
    sup.before_kill = lambda child: _record_before_kill(plan, info, sup, child)
    remove_shm_regions(info.job_rank, info.job_id)  # a requeued job's earlier run on this node may have left some
    if orphans := remove_orphan_regions():
        log(f"rank {info.job_rank}: removed {len(orphans)} shared-memory regions in /dev/shm that killed jobs left")
    try:
        return _serve(plan, info, me, server, sup, watch)
    finally:
        watch.close()


def _serve(plan: LaunchPlan, info: RankInfo, me: Role, server: ServerBinary, sup: Supervisor, watch: RankWatch) -> int:
    env = rank_env = child_env(plan, server, info=info, me=me)  # rank_env: without the token guard's preload
    llmapi = plan.workflow == LLMAPI
    if llmapi and me.leader:
        try:
            copy_model_files(plan)
        except (ModelFilesMissing, OSError) as exc:
            log(str(exc))
            _record_failure(plan, info, EXIT_CONFIG, str(exc))
            return EXIT_CONFIG
    guard: auth.Guard | None = None
    if me.leader and plan.auth == auth.TOKEN:  # followers listen on no port
        try:
            guard = auth.Guard.prepare(Deployment(Path(plan.deployment_dir)).token, cache_dir(env))
        except (auth.AuthSetupError, OSError) as exc:
            log(str(exc))
            _record_failure(plan, info, EXIT_CONFIG, str(exc))
            return EXIT_CONFIG
        env = guard.env(env)
    avoid: set[int] = set()
    endpoint = job_paths(plan, info).endpoint(me.replica)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        ports: Ports | None = None
        auto: frozenset[str] = frozenset()
        if me.leader:
            try:
                ports, auto = allocate(plan.ports, avoid=avoid)
                check_fixed(ports, auto)
            except PortError as exc:
                log(str(exc))
                _record_failure(plan, info, EXIT_PORT, str(exc))
                return EXIT_PORT
        argv = _argv(plan, info, me, server, ports) if me.leader or not llmapi else worker_node_argv()
        ranks = plan.world_size
        print(
            f"[hpc-serve] rank {info.job_rank}/{ranks} on {info.node}: replica {me.replica}, "
            f"{'leader' if me.leader else 'follower'}, cmd: {describe(argv)}",
            flush=True,
        )
        if sup.stopping:
            log("stop requested before tritonserver started")
            return exit_code(-(sup.stop_signal or signal.SIGTERM))
        node = LeaderNode(plan, rank_env) if llmapi and me.leader else None
        server_env, ring = (engine_env(plan, env) if llmapi and not me.leader else env), None
        if node is not None:  # the engine's rank 0 first: tritonserver's model connects to it
            node.start()
            server_env, ring = node.server_env(env), node.ring
            sup.watch = combined_watch(watch.check, node)
        child = sup.spawn(argv, server_env, ignore=LEADER_IGNORES if me.leader else FOLLOWER_IGNORES, ring=ring)
        if llmapi and not me.leader:
            child.name = "worker node"
        try:
            if not me.leader:
                return _finish(plan, info, sup, child, sup.wait(child))

            assert ports is not None
            readiness = become_ready(plan, job_paths(plan, info), info, me, sup, child, ports.http, guard, watch)
            state = readiness.state
            if state in GAVE_UP:
                log(f"{readiness.error}; stopping tritonserver")
                sup.stop(child)
                clear_phase(job_paths(plan, info), me)
                _finish(plan, info, sup, child, child.proc.returncode, readiness.error, gave_up=GAVE_UP[state])
                return GAVE_UP[state]
            if state == "exited":
                clear_phase(job_paths(plan, info), me)
                rc = child.proc.returncode
                sup.reap_group(child)
                collided = taken(ports) if not sup.stopping and sup.failure is None else {}
                fixed = {name: port for name, port in collided.items() if name not in auto}
                if fixed:  # a fact, not a log line: the port cannot be bound now (launcher/node/ports.py `taken`)
                    name, port = next(iter(fixed.items()))
                    msg = (
                        f"tritonserver could not bind the {name} port {port} fixed in launch.json ports "
                        f'(already in use on {info.node}); choose another port or "auto"'
                    )
                    log(msg)
                    _finish(plan, info, sup, child, rc, error=msg, gave_up=EXIT_PORT)
                    return EXIT_PORT
                if collided and attempt < PORT_ATTEMPTS:
                    log(
                        f"tritonserver exited and its port(s) {collided} are taken by another process "
                        f"(attempt {attempt}/{PORT_ATTEMPTS}); retrying with other ports"
                    )
                    avoid |= set(ports.as_dict().values())
                    continue
                return _finish(plan, info, sup, child, rc)
            if state == "ready":
                ready_at = time.time()
                record = records.EndpointRecord(
                    job_id=info.job_id,
                    cluster=job_cluster() or "",
                    replica=me.replica,
                    rank=info.job_rank,
                    host=info.node,
                    address=records.advertised_address(info.node, _single_node(os.environ)),
                    http_port=ports.http,
                    grpc_port=ports.grpc,
                    metrics_port=ports.metrics,
                    pid=child.proc.pid,
                    started_at=child.started_at,
                    ready_at=ready_at,
                    workflow=plan.workflow,
                    decoupled=plan.decoupled,
                    llmapi_model=plan.llmapi_model,
                    restarts=replica_restarts(os.environ),
                )
                records.write_json_atomic(endpoint, record.to_dict())
                clear_phase(job_paths(plan, info), me)
                log(
                    f"replica {me.replica} ready in {ready_at - child.started_at:.2f} s (loaded in "
                    f"{readiness.loaded_s:.2f} s, warm-up {readiness.warmup_s:.3f} s): {record.http_url} (record {endpoint})"
                )
            clear_phase(job_paths(plan, info), me)  # stopping before ready: nothing more to wait for
            try:
                rc = sup.wait(child)
            finally:
                try:
                    endpoint.unlink()
                except FileNotFoundError:
                    pass
            return _finish(plan, info, sup, child, rc, ready=state == "ready")
        finally:
            if node is not None:
                _record_leader_node(plan, info, node.end(), node.signalled)
    raise AssertionError("unreachable")


def _record_leader_node(plan: LaunchPlan, info: RankInfo, exit_code: int | None, signalled: str | None) -> None:
    """Add how the leader node ended to rank 0's exit record (written before it was ended: the record must not
    wait), so that `status`, tests and doctor read it from the record rather than from log text."""
    path = job_paths(plan, info).rank_record(info.job_rank)
    record = records.RankExitRecord.read(path)
    if record is None:
        return
    ended = dataclasses.replace(record, leader_node_exit=exit_code, leader_node_signal=signalled)
    try:
        records.write_json_atomic(path, ended.to_dict())
    except OSError as exc:
        log(f"could not add the leader node's end to the rank record: {exc}")


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
        _record_failure(plan, info, EXIT_CONFIG, str(exc))
        return EXIT_CONFIG
    log(f"rank {info.job_rank}: GPUs: {gpus.why}")
    if args.dry_run:
        ports = allocate(plan.ports)[0] if me.leader else None
        print(describe(_argv(plan, info, me, server, ports)))
        return 0

    sup = supervisor(plan, info, me)
    sup.stop_requests = (job_paths(plan, info).cancel_marker, job_paths(plan, info).stop_request)
    sup.install()
    try:
        return serve(plan, info, me, server, sup)
    finally:
        # Whatever happened (including a bug above), never leave tritonserver behind.
        child = sup.child
        if child is not None and child.proc.poll() is None:
            sup.stop(child)
            sup.reap_group(child)
        sup.restore()
