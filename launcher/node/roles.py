"""A rank's life by its role: one class per kind of process a rank runs, from its first process to its exit record.

Four roles, picked once by launcher/node/run.py from the plan's workflow and whether the rank leads its replica:

- ``EngineLeader``: tritonserver on the whole repository, on ports, published once READY;
- ``EngineFollower``: tritonserver loading ``follower_models`` only, on no port, until its leader releases it;
- ``LlmapiLeader``: the llmapi model's files copied in, the leader node started, then tritonserver as a leader;
- ``LlmapiWorker``: TensorRT-LLM's worker node in place of tritonserver (launcher/node/llmapi.py).

What they share is here once: the exit records (written before a kill, rewritten with the whole tail), the
ordered finish (record, reap, shared memory), the fail-fast watch; a leader's port retry and endpoint publishing
(``LeaderRole``) and a follower's wait for its release (``FollowerRole``). What differs is a class attribute or
a method, so adding a role is one class (DEVELOPERS.md "Rank roles").
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from launcher.contracts import auth, config, records
from launcher.contracts.job_index import job_cluster
from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.rank import RankInfo, Role, replica_restarts
from launcher.contracts.stop_records import StopNotice
from launcher.contracts.workflows import rank_workflow
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
from launcher.node.ready import ReadyState, become_ready, clear_phase
from launcher.node.server import ServerBinary, cache_dir
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
GAVE_UP = {
    ReadyState.READY_TIMEOUT: EXIT_READY_TIMEOUT,
    ReadyState.AUTH_FAILED: EXIT_CONFIG,
    ReadyState.WARMUP_FAILED: EXIT_WARMUP,
}
PORT_ATTEMPTS = 5
#: what a restart of the replica (replica_policy restart) cannot change: the `.sub` is told not to try
NOT_RESTARTABLE = (EXIT_CONFIG, EXIT_PORT)


# -- the rank's exit record: also written by run.py before any role is known (a world that does not fit the plan)


def write_record(paths: JobPaths, info: RankInfo, record: records.RankExitRecord) -> None:
    """Write the rank's exit record, and its no-restart mark when the exit is one a restart cannot change."""
    try:
        records.write_json_atomic(paths.rank_record(info.job_rank), record.to_dict())
        if record.signal is None and record.exit_code in NOT_RESTARTABLE:
            paths.no_restart(info.job_rank).touch()  # the `.sub` looks once the step ended
    except OSError as exc:
        log(f"could not write the rank record: {exc}")


def rank_record(
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


def record_failure(plan: LaunchPlan, info: RankInfo, code: int, message: str, tail: Sequence[str] = ()) -> None:
    """The launcher gave up before (or instead of) running tritonserver: say why in the rank's exit record."""
    record = rank_record(info, code, None, list(tail)[-LOG_TAIL:], message, None, time.time())
    write_record(job_paths(plan, info), info, record)


def _single_node(env: dict[str, str] | os._Environ) -> bool:
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    return nodes is None or nodes.strip() == "1"


class RankRole(abc.ABC):
    """One rank's processes and records. ``serve`` runs them: what every role shares (shared-memory sweep, the
    fail-fast watch, the exit records, the ordered finish) around ``_run``, the role's own life."""

    #: whether this rank leads its replica: opens the ports, serves, publishes (tritonserver's argv, the log line)
    leads: ClassVar[bool]
    #: what the log calls the rank's main process
    child_name: ClassVar[str] = "tritonserver"

    def __init__(self, plan: LaunchPlan, info: RankInfo, me: Role, server: ServerBinary) -> None:
        self.plan, self.info, self.me, self.server = plan, info, me, server
        self.paths = job_paths(plan, info)

    # -- what a role says of itself -----------------------------------------------------------------------------
    @abc.abstractmethod
    def supervisor(self) -> Supervisor:
        """The supervisor that owns the rank's main process and its stop signals."""

    @abc.abstractmethod
    def dry_run_ports(self) -> Ports | None:
        """The ports ``--dry-run`` shows in tritonserver's command (None: it opens none)."""

    @abc.abstractmethod
    def _run(self, sup: Supervisor, watch: RankWatch) -> int:
        """Start the rank's processes and supervise them until they end; the launcher's exit code."""

    def argv(self, ports: Ports | None) -> list[str]:
        """The command of the rank's main process (tritonserver's, unless a role runs another)."""
        return self.tritonserver_argv(ports)

    # -- shared ---------------------------------------------------------------------------------------------------
    def tritonserver_argv(self, ports: Ports | None) -> list[str]:
        plan = self.plan
        return build_argv(
            self.server.argv0,
            model_repository=plan.model_repository,
            rank=self.info.job_rank,
            job_id=self.info.job_id,
            leader=self.leads,
            ports=ports,
            follower_models=plan.follower_models,
            backend_dir=self.server.backend_dir,
            server_args=plan.server_args,
            exit_timeout_s=plan.drain_s,
        )

    def dry_run(self) -> str:
        """What ``--dry-run`` prints: this rank's tritonserver command."""
        return describe(self.tritonserver_argv(self.dry_run_ports()))

    def rank_env(self) -> dict[str, str]:
        """The rank's environment for its processes (launcher/node/server_env.py)."""
        return child_env(self.plan, self.server, info=self.info, me=self.me)

    def rank_watch(self) -> RankWatch:
        """Fail-fast (launcher/node/watch.py): the exit records of the other ranks of this rank's replica."""
        per_replica = self.plan.world_size_per_replica
        first = self.me.replica * per_replica
        mine = self.info.job_rank
        peers = {r: self.paths.rank_record(r) for r in range(first, first + per_replica) if r != mine}
        return RankWatch(PeerWatch(self.me.replica, peers))

    def serve(self, sup: Supervisor | None = None) -> int:
        """Start the rank's processes and supervise them until they exit; return the launcher's exit code."""
        sup = sup or self.supervisor()
        watch = self.rank_watch()
        sup.watch = watch.check
        sup.before_kill = lambda child: self._record_before_kill(sup, child)
        info = self.info
        remove_shm_regions(info.job_rank, info.job_id)  # a requeued job's earlier run on this node may have left some
        if orphans := remove_orphan_regions():
            log(f"rank {info.job_rank}: removed {len(orphans)} shared-memory regions in /dev/shm that killed jobs left")
        try:
            return self._run(sup, watch)
        finally:
            watch.close()

    def fail(self, code: int, message: str) -> int:
        """Give up before tritonserver started: log, record, and the exit code."""
        log(message)
        record_failure(self.plan, self.info, code, message)
        return code

    def announce(self, argv: Sequence[str], sup: Supervisor) -> int | None:
        """The rank's start line; the exit code when a stop came before anything started, else None."""
        info = self.info
        print(
            f"[hpc-serve] rank {info.job_rank}/{self.plan.world_size} on {info.node}: replica {self.me.replica}, "
            f"{'leader' if self.leads else 'follower'}, cmd: {describe(argv)}",
            flush=True,
        )
        if sup.stopping:
            log("stop requested before tritonserver started")
            return exit_code(-(sup.stop_signal or signal.SIGTERM))
        return None

    def exit_record(
        self, sup: Supervisor, child: Child, rc: int, error: str | None = None, gave_up: int | None = None
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
        return rank_record(self.info, code, sig, tail, error, cause, sup.failed_at or time.time())

    def _record_before_kill(self, sup: Supervisor, child: Child) -> None:
        """The record of a rank the launcher is about to SIGKILL (a dead stub, a failed peer), written before the
        kill: the kill makes MPI peers abort, and Slurm may SIGKILL the whole step before tritonserver is even
        reaped."""
        write_record(self.paths, self.info, self.exit_record(sup, child, -signal.SIGKILL))

    def finish(
        self,
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
        plan, info, paths = self.plan, self.info, self.paths
        if release_path(plan, info).exists() and sup.failure is None:
            # A follower whose leader stopped: TensorRT-LLM workers exit(0) then; ours end their tritonserver.
            log(f"rank {info.job_rank}: released by the leader")
            rc = 0
        sup.failed_at = sup.failed_at or time.time()
        replica = info.job_rank // plan.world_size_per_replica

        def write() -> None:
            record = self.exit_record(sup, child, rc, error, gave_up)
            was_ready = ready if ready is not None else paths.endpoint(replica).exists()
            if record.signal in config.START_CRASH_SIGNALS and not was_ready:
                try:  # before the record: the `.sub` reads both once the step ended
                    paths.start_crash(info.job_rank).touch()
                except OSError as exc:
                    log(f"could not mark the start crash: {exc}")
            write_record(paths, info, record)

        # Record first: when a rank dies its MPI peers abort and Slurm may SIGKILL this step within a second,
        # so the record must not wait for the stubs to be reaped. Rewritten after, with the complete log tail.
        write()
        sup.reap_group(child)
        write()
        error = error or (sup.failure.why if sup.failure is not None else None)
        removed = remove_shm_regions(info.job_rank, info.job_id)  # a killed stub or tritonserver leaves them
        log(
            f"rank {info.job_rank}: {child.name} exited with {signal_name(rc) or rc}"
            + (f" ({error})" if error else "")
            + (f"; removed {len(removed)} shared-memory regions it left in /dev/shm" if removed else "")
        )
        return exit_code(rc)


class FollowerRole(RankRole):
    """A rank that serves through its leader: one process, on no port; on a stop it waits (bounded) for its
    leader's release and gives up early once the leader's rank record shows the leader ended (launcher/node/stop.py)."""

    leads = False

    def supervisor(self) -> Supervisor:
        plan, info = self.plan, self.info
        leader = self.paths.rank_record(self.me.replica * plan.world_size_per_replica)
        try:  # the model writes the release file there; a hand-run launcher has no ranks/ folder yet
            release_path(plan, info).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log(f"cannot create {release_path(plan, info).parent}: {exc}")
        return Supervisor(plan.grace_s, FollowerStop(plan.follower_wait_s, release_path(plan, info), leader))

    def dry_run_ports(self) -> Ports | None:
        return None

    def process_env(self, env: dict[str, str]) -> dict[str, str]:
        """The main process's environment, from the rank's."""
        return env

    def _run(self, sup: Supervisor, watch: RankWatch) -> int:
        env = self.rank_env()
        argv = self.argv(None)
        stopped = self.announce(argv, sup)
        if stopped is not None:
            return stopped
        child = sup.spawn(argv, self.process_env(env), ignore=FOLLOWER_IGNORES)
        child.name = self.child_name
        return self.finish(sup, child, sup.wait(child))


class EngineFollower(FollowerRole):
    """engine workflow, rank > 0 of a replica: tritonserver with ``follower_models`` only, its model taking part in
    the leader's requests over MPI."""


class LlmapiWorker(FollowerRole):
    """llmapi workflow, rank > 0 of a replica: TensorRT-LLM's worker node, and no tritonserver."""

    child_name = "worker node"

    def argv(self, ports: Ports | None) -> list[str]:
        return worker_node_argv()

    def process_env(self, env: dict[str, str]) -> dict[str, str]:
        return engine_env(self.plan, env)


class LeaderRole(RankRole):
    """A replica's serving rank: tritonserver on ports (fresh ones when ``auto`` ports collided, up to
    PORT_ATTEMPTS), READY (launcher/node/ready.py), then its endpoint record until it ends. On a stop it writes the
    stop file and holds tritonserver's SIGTERM until the model drained (launcher/node/stop.py LeaderDrain)."""

    leads = True

    def supervisor(self) -> Supervisor:
        return Supervisor(self.plan.grace_s, on_stop=self.announce_stop, unload_s=config.UNLOAD_AFTER_DRAIN_S)

    def dry_run_ports(self) -> Ports | None:
        return allocate(self.plan.ports)[0]

    def announce_stop(self, signum: int) -> LeaderDrain:
        """Write the stop file; the model answers in ``drain_file`` (``draining``, then ``drained``), and
        tritonserver gets its SIGTERM only once it drained (launcher/node/stop.py LeaderDrain says why)."""
        plan, info, paths = self.plan, self.info, self.paths
        now = time.time()
        drain_file = paths.drain(info.job_rank)
        drain_file.unlink(missing_ok=True)
        until = now + plan.exit_timeout_s
        # whether the workflow's model reports its drain in the stop file's ``drain_file`` (else the metrics tell)
        reports = rank_workflow(plan.workflow).reports_drain and os.environ.get(DRAIN_BY_METRICS_ENV) != "1"
        notice = StopNotice(
            signal=signal.Signals(signum).name,
            at=now,
            drain_until=until,
            drain_file=str(drain_file) if reports else None,
        )
        notice.write(stop_path(plan, info))
        # a model that reports no drain (TensorRT-LLM) is drained by its server's metrics: this rank's endpoint
        # says where
        mine = [e for e in records.read_endpoints(paths) if e.rank == info.job_rank and e.metrics_port]
        probe = metrics_in_flight(mine[0].metrics_url) if mine else None
        return LeaderDrain(drain_file, until, ack_s=config.DRAIN_ACK_S, in_flight=probe)

    # -- what a leader role may add ---------------------------------------------------------------------------------
    def prepare(self) -> str | None:
        """Before anything starts: why the replica cannot serve (the rank exits EXIT_CONFIG), or None."""
        return None

    def start_beside(
        self, env: dict[str, str], rank_env: dict[str, str], sup: Supervisor, watch: RankWatch
    ) -> tuple[dict[str, str], collections.deque[str] | None]:
        """Start what runs beside tritonserver, before it; tritonserver's environment and log ring (None: its own)."""
        return env, None

    def end_beside(self) -> None:
        """End what ``start_beside`` started, once tritonserver ended."""

    # -- the leader's life ----------------------------------------------------------------------------------------
    def _run(self, sup: Supervisor, watch: RankWatch) -> int:
        plan = self.plan
        env = rank_env = self.rank_env()  # rank_env: without the token guard's preload
        unfit = self.prepare()
        if unfit is not None:
            return self.fail(EXIT_CONFIG, unfit)
        guard: auth.Guard | None = None
        if plan.auth == auth.TOKEN:
            try:
                guard = auth.Guard.prepare(Deployment(Path(plan.deployment_dir)).token, cache_dir(env))
            except (auth.AuthSetupError, OSError) as exc:
                return self.fail(EXIT_CONFIG, str(exc))
            env = guard.env(env)
        avoid: set[int] = set()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                ports, auto = allocate(plan.ports, avoid=avoid)
                check_fixed(ports, auto)
            except PortError as exc:
                return self.fail(EXIT_PORT, str(exc))
            argv = self.argv(ports)
            stopped = self.announce(argv, sup)
            if stopped is not None:
                return stopped
            server_env, ring = self.start_beside(env, rank_env, sup, watch)
            child = sup.spawn(argv, server_env, ignore=LEADER_IGNORES, ring=ring)
            child.name = self.child_name
            try:
                code = self._supervise(sup, watch, child, ports, auto, guard, attempt)
                if code is None:
                    avoid |= set(ports.as_dict().values())
                    continue
                return code
            finally:
                self.end_beside()
        raise AssertionError("unreachable")

    def _supervise(
        self,
        sup: Supervisor,
        watch: RankWatch,
        child: Child,
        ports: Ports,
        auto: frozenset[str],
        guard: auth.Guard | None,
        attempt: int,
    ) -> int | None:
        """From tritonserver's start to the rank's exit code; None when it exited because ``auto`` ports it was
        given were taken meanwhile and ``attempt`` was not the last (the caller retries with others)."""
        plan, info, paths, me = self.plan, self.info, self.paths, self.me
        readiness = become_ready(plan, paths, info, me, sup, child, ports.http, guard, watch)
        state = readiness.state
        if state in GAVE_UP:
            log(f"{readiness.error}; stopping tritonserver")
            sup.stop(child)
            clear_phase(paths, me)
            self.finish(sup, child, child.proc.returncode, readiness.error, gave_up=GAVE_UP[state])
            return GAVE_UP[state]
        if state is ReadyState.EXITED:
            clear_phase(paths, me)
            return self._exited(sup, child, ports, auto, attempt)
        endpoint = paths.endpoint(me.replica)
        if state is ReadyState.READY:
            self.publish(child, ports, readiness.loaded_s, readiness.warmup_s)
        clear_phase(paths, me)  # stopping before ready: nothing more to wait for
        try:
            rc = sup.wait(child)
        finally:
            try:
                endpoint.unlink()
            except FileNotFoundError:
                pass
        return self.finish(sup, child, rc, ready=state is ReadyState.READY)

    def _exited(self, sup: Supervisor, child: Child, ports: Ports, auto: frozenset[str], attempt: int) -> int | None:
        """tritonserver ended before READY: a port fixed in launch.json that another process holds is EXIT_PORT;
        ``auto`` ones taken meanwhile are None (retry) but on the last attempt; else its own exit."""
        rc = child.proc.returncode
        sup.reap_group(child)
        collided = taken(ports) if not sup.stopping and sup.failure is None else {}
        fixed = {name: port for name, port in collided.items() if name not in auto}
        if fixed:  # a fact, not a log line: the port cannot be bound now (launcher/node/ports.py `taken`)
            name, port = next(iter(fixed.items()))
            msg = (
                f"tritonserver could not bind the {name} port {port} fixed in launch.json ports "
                f'(already in use on {self.info.node}); choose another port or "auto"'
            )
            log(msg)
            self.finish(sup, child, rc, error=msg, gave_up=EXIT_PORT)
            return EXIT_PORT
        if collided and attempt < PORT_ATTEMPTS:
            log(
                f"tritonserver exited and its port(s) {collided} are taken by another process "
                f"(attempt {attempt}/{PORT_ATTEMPTS}); retrying with other ports"
            )
            return None
        return self.finish(sup, child, rc)

    def publish(self, child: Child, ports: Ports, loaded_s: float, warmup_s: float) -> records.EndpointRecord:
        """The replica's endpoint record, written once it is READY: where clients find it."""
        plan, info, me = self.plan, self.info, self.me
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
        endpoint = self.paths.endpoint(me.replica)
        records.write_json_atomic(endpoint, record.to_dict())
        clear_phase(self.paths, me)
        log(
            f"replica {me.replica} ready in {ready_at - child.started_at:.2f} s (loaded in "
            f"{loaded_s:.2f} s, warm-up {warmup_s:.3f} s): {record.http_url} (record {endpoint})"
        )
        return record


class EngineLeader(LeaderRole):
    """engine workflow, rank 0 of a replica: tritonserver on the whole repository; its model (the CPU engine)
    reports its drain."""


class LlmapiLeader(LeaderRole):
    """llmapi workflow, rank 0 of a replica: the image's model files copied in, TensorRT-LLM's leader node started
    before tritonserver and watched like a peer while it serves, ended after it (launcher/node/llmapi.py).
    Upstream's model writes no drain file (the CPU engine's stand-in speaks the same contract)."""

    def __init__(self, plan: LaunchPlan, info: RankInfo, me: Role, server: ServerBinary) -> None:
        super().__init__(plan, info, me, server)
        self.node: LeaderNode | None = None

    def prepare(self) -> str | None:
        try:
            copy_model_files(self.plan)
        except (ModelFilesMissing, OSError) as exc:
            return str(exc)
        return None

    def start_beside(
        self, env: dict[str, str], rank_env: dict[str, str], sup: Supervisor, watch: RankWatch
    ) -> tuple[dict[str, str], collections.deque[str] | None]:
        """The engine's rank 0 first: tritonserver's model connects to it."""
        node = self.node = LeaderNode(self.plan, rank_env)
        node.start()
        sup.watch = combined_watch(watch.check, node)
        return node.server_env(env), node.ring

    def end_beside(self) -> None:
        node, self.node = self.node, None
        if node is not None:
            self._record_leader_node(node.end(), node.signalled)

    def _record_leader_node(self, exit_code: int | None, signalled: str | None) -> None:
        """Add how the leader node ended to rank 0's exit record (written before it was ended: the record must not
        wait), so that `status`, tests and doctor read it from the record rather than from log text."""
        path = self.paths.rank_record(self.info.job_rank)
        record = records.RankExitRecord.read(path)
        if record is None:
            return
        ended = dataclasses.replace(record, leader_node_exit=exit_code, leader_node_signal=signalled)
        try:
            records.write_json_atomic(path, ended.to_dict())
        except OSError as exc:
            log(f"could not add the leader node's end to the rank record: {exc}")
