"""Run one gateway: refuse to start beside a live one, listen, publish the address record, serve, withdraw it.

Why the socket is bound here and not by uvicorn: `--port auto` (0) needs the port the kernel gave before the
record can say it, and a port already taken must be a clear error before the app loads anything. Why the
record is written after uvicorn's startup (the app's lifespan: tokenizer, first discovery) and not at bind:
a record is a promise that the gateway answers; a client or a second gateway that read it earlier would find
a socket that accepts but does not answer yet, and take a live gateway for a stale record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ipaddress
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hpc.jobs import autoscale
from hpc.jobs.renewal import GatewayRenewer, takes_over_from
from hpc.serving.deployment import Target
from hpc.serving.gateway_record import live_gateway, node_name, publish, record_path, withdraw
from hpc.spec.limits import MAX_BODY_MB, MAX_OUTSTANDING, PREFIX_CHARS, ROUTING
from launcher.contracts.job_index import job_cluster
from launcher.contracts.layout import Deployment
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.records import GatewayRecord, advertised_address
from launcher.contracts.urls import http_url

log = logging.getLogger("hpc_serve.gateway")

#: how long a stopping gateway lets requests in flight finish (Slurm's KillWait after SIGTERM is 30 s by default)
GRACEFUL_STOP_S = 10


class GatewayRunning(RuntimeError):
    """A live gateway of the same deployment already answers at its recorded address."""


def advertised(host: str) -> str:
    """The address others use to reach a gateway listening on `host`: a cluster-side address of this node when
    it listens on every interface (launcher.contracts.records.advertised_address, as replicas do), loopback for loopback."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host  # a host name the user chose: it is what they want published
    if ip.is_unspecified:
        return advertised_address(node_name(), single_node=False)
    if ip.is_loopback:
        return "127.0.0.1" if ip.version == 4 else "[::1]"
    return f"[{host}]" if ip.version == 6 else host


def listen(host: str, port: int, shared: bool = False) -> socket.socket:
    """A bound socket (`port` 0: any free one); OSError (e.g. EADDRINUSE) as the caller's error to report.
    `shared`: SO_REUSEPORT, so that a renewing gateway job's successor can listen on the same port beside it
    (hpc/jobs/renewal.py); only such jobs ask for it, so no other gateway shares a port by accident."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio turns Nagle off (TCP_NODELAY) on accepted connections only when
    # the listening socket says it is TCP; without it every response with a body waits ~40 ms for an ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _renewer(target: Target, job_id: str, renew_from: Path | None) -> GatewayRenewer | None:
    """The renewal of a gateway job whose deployment renews (launch.json's `renew`), else None."""
    if not job_id or renew_from is None:
        return None
    plan = LaunchPlan.read(Deployment(renew_from).launch).renew
    return GatewayRenewer(renew_from, target, job_id, plan) if plan is not None else None


def _held_where_controlled(target: Target, job_id: str, renew_from: Path | None) -> Target:
    """`target` as this gateway serves it: a request that finds nothing serving is held (`hold_s`) only where the
    autoscaling controller runs, a gateway job named its deployment folder (autoscale.start); a gateway started by
    hand runs none, nothing would start a job for the request, so it answers 503 at once."""
    return target if job_id and renew_from is not None else dataclasses.replace(target, hold_s=0.0)


def refuse_if_running(target: Target, job_id: str = "") -> None:
    """GatewayRunning naming the live gateway; a stale record (nothing answers as this deployment) is left for
    this gateway's own record to replace, and so is the live record of the gateway job that submitted this one
    (`job_id`) as its successor (hpc/jobs/renewal.py)."""
    live = live_gateway(target)
    if live is None:
        return
    if takes_over_from(target, live, job_id):
        log.info("taking over from gateway job %s at %s", live.job_id, live.url)
        return
    where = f"job {live.job_id}" if live.job_id else f"pid {live.pid} on {live.host}"
    raise GatewayRunning(
        f"the gateway of {target.name} already runs at {live.url} ({where}; record {record_path(target)}); "
        "use it, or stop it first" + (f" (hpc-serve cancel {live.job_id})" if live.job_id else "")
    )


def run(
    target: Target,
    host: str,
    port: int,
    refresh_s: float,
    job_id: str = "",
    max_outstanding: int | None = MAX_OUTSTANDING,
    prefix_chars: int = PREFIX_CHARS,
    renew_from: Path | None = None,
    max_body_mb: int = MAX_BODY_MB,
    routing: str = ROUTING,
    workers: int = 1,
) -> None:
    """Serve until SIGINT/SIGTERM (`max_outstanding`, `prefix_chars`, `max_body_mb`, `routing`:
    hpc.gateway.app.create_app's). A gateway
    job (`job_id`) whose deployment folder `renew_from` has a renew plan renews itself (hpc/jobs/renewal.py)
    and ends once its successor serves. `workers` > 1: that many processes on the one port
    (hpc/gateway/workers.py). Raises GatewayRunning, OSError (the port)."""
    from hpc.gateway.app import create_app

    renewer = _renewer(target, job_id, renew_from)
    target = _held_where_controlled(target, job_id, renew_from)
    refuse_if_running(target, job_id)
    sock = listen(host, port, shared=renewer is not None and port != 0)
    url = http_url(advertised(host), sock.getsockname()[1])
    record = GatewayRecord(
        name=target.name,
        url=url,
        host=node_name(),
        pid=os.getpid(),
        job_id=job_id,
        cluster=(job_cluster() or "") if job_id else "",  # a gateway started by hand inside an allocation: none
        started_at=time.time(),
    )
    options: dict[str, Any] = {
        "refresh_s": refresh_s,
        "max_outstanding": max_outstanding,
        "prefix_chars": prefix_chars,
        "max_body_mb": max_body_mb,
        "routing": routing,
    }
    print(f"hpc-serve gateway for {target.name} in {target.workdir}: {url}/v1", flush=True)
    if workers > 1:
        _run_workers(target, workers, sock, record, renewer, options, renew_from)
        return
    app = create_app(target, **options)

    def started(server: Any) -> None:
        publish(target, dataclasses.replace(record, auth=bool(app.state.gateway.discovery.tokens)))
        log.info("listening at %s (record %s)", url, record_path(target))
        if renewer is not None:
            server.renewal = asyncio.ensure_future(renewer.run(server))
        server.autoscale = autoscale.start(server, renew_from, job_id, app.state.gateway.balancer)

    def stopping(server: Any) -> None:
        withdraw(target, record)  # only if still its own: a successor's record stays

    try:
        _server(app, started, stopping).run(sockets=[sock])
    finally:  # a startup that failed (uvicorn exits without shutdown): nothing was published, nothing is left
        withdraw(target, record)
        sock.close()


def _server(app: Any, started: Callable[[Any], None], stopping: Callable[[Any], None]) -> Any:
    """uvicorn's Server for `app`, as the gateway runs it: `started(server)` once it serves, `stopping(server)`
    first thing when it stops."""
    import uvicorn

    from hpc.gateway.accesslog import observe_head_timeout
    from hpc.gateway.connections import HeadTimeoutProtocol, raise_open_files_limit

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                started(self)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # Here and not after run(): uvicorn re-raises the SIGTERM it caught once it has stopped, which ends
            # the process before anything after run() would execute. First thing: it takes no new connections.
            stopping(self)
            for task in (getattr(self, "renewal", None), getattr(self, "autoscale", None)):
                if task is not None:
                    task.cancel()
            await super().shutdown(sockets=sockets)

    # httptools and uvloop (package dependencies) named, not left to uvicorn's "auto": with h11 and asyncio's own
    # loop every request and every streamed event costs more CPU on the gateway's one event loop; uvicorn's own
    # access log off (hpc/gateway/accesslog.py writes the gateway's, with what a request cost); no proxy-headers
    # middleware (one more layer around every request and every event sent): nothing reads a client's address
    raise_open_files_limit()
    config = uvicorn.Config(
        app,
        # httptools, with a deadline for a request's head (hpc/gateway/connections.py), its 408s in the metrics
        http=HeadTimeoutProtocol.reporting(functools.partial(observe_head_timeout, app.state.metrics)),
        loop="uvloop",
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_STOP_S,
    )
    return Server(config)


def _run_workers(
    target: Target,
    workers: int,
    sock: socket.socket,
    record: GatewayRecord,
    renewer: Any,
    options: dict[str, Any],
    renew_from: Path | None = None,
) -> None:
    """The gateway as `workers` processes on `sock` (hpc/gateway/workers.py): the record published once every
    worker serves, withdrawn before they stop; a worker that died ends the gateway with its signal or code.
    Worker 0 runs the autoscaling controller (the counts and totals it reads are every worker's: `counts`) and
    warms the replicas that join (once for the gateway, not once per worker)."""
    from hpc.gateway.liveness import WORKER
    from hpc.gateway.metrics import MULTIPROC_DIR_VAR
    from hpc.gateway.workers import WorkerDied, run_workers
    from hpc.serving.replica_counts import SharedCounts

    counts = SharedCounts()
    shared = tempfile.mkdtemp(prefix="hpc-serve-gateway-metrics-")

    def serve(index: int, ready: Connection) -> None:
        from hpc.gateway.app import create_app
        from hpc.gateway.metrics import share_between_workers

        # the workers' own, not the parent's (whose renewal submits jobs); what worker 0's controller submits
        # does not get it either (hpc/jobs/executors.py NOT_EXPORTED)
        os.environ[MULTIPROC_DIR_VAR] = shared
        share_between_workers()
        app = create_app(target, counts=counts, warm_up=index == 0, **options)
        setattr(app.state, WORKER, index)

        def serving(server: Any) -> None:
            ready.send(bool(app.state.gateway.discovery.tokens))
            if index == 0:
                server.autoscale = autoscale.start(server, renew_from, record.job_id, app.state.gateway.balancer)

        _server(app, serving, lambda _: None).run(sockets=[sock])

    def started(auth: list[bool]) -> None:
        publish(target, dataclasses.replace(record, auth=any(auth)))
        log.info("listening at %s with %d workers (record %s)", record.url, workers, record_path(target))

    def stopping() -> None:  # first thing: a client that reads the record now finds none
        withdraw(target, record)  # only if still its own: a successor's record stays

    try:
        run_workers(workers, serve, started, stopping, renewer, GRACEFUL_STOP_S, sock)
        return
    except WorkerDied as exc:
        log.error("%s", exc)
        code = exc.code
    finally:
        withdraw(target, record)  # a start that failed before the workers ran: nothing is left
        sock.close()
        shutil.rmtree(shared, ignore_errors=True)
    if code < 0:  # as one gateway process would have died: gateway.sub starts again a gateway killed so
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to put back
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    raise SystemExit(code or 1)
