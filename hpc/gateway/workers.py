"""A gateway of several worker processes on one port (`hpc-serve gateway --workers N`, the spec's
`gateway.workers`): when one core is not enough to relay what the replicas stream (docs/decisions.md "The
gateway's cost per relayed token").

The parent binds the socket, makes the shared counts (hpc/serving/replica_counts.py) and the metrics folder,
and forks the workers: each inherits the listening socket (the kernel hands each new connection to one of the
processes accepting on it) and runs its own event loop, app, discovery and gRPC channels, on the shared counts.
The parent serves nothing (it closes its copy of the socket once the workers have it): it publishes the gateway's
address record once every worker has started, runs the renewal of a gateway job, and on SIGTERM or SIGINT
withdraws the record, then stops the workers (each takes no new connection and lets its streams finish, as one
gateway does): a client that reads the record meanwhile finds none, one that connects is refused. A worker that
dies otherwise ends the others and the parent, with the worker's signal or exit code, so that gateway.sub restarts
the whole gateway as it would restart one process. A parent killed outright (SIGKILL) leaves no workers: each
asked the kernel for a SIGTERM at its parent's death (Linux `PR_SET_PDEATHSIG`).

Why forked workers on one inherited socket and not SO_REUSEPORT sockets of their own: the parent must know the
port before the record says it (`--port auto`), and one socket needs no second bind that another program could
race for; and why processes, not threads: a worker's relay is Python holding the GIL.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import time
import types
from collections.abc import Callable
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

log = logging.getLogger("hpc_serve.gateway")

#: prctl's option that asks for a signal at the parent's death (linux/prctl.h)
PR_SET_PDEATHSIG = 1
#: how long a worker may take to start (its tokenizer, its first discovery) before the gateway gives up
START_S = 120.0
#: the signals that stop the gateway
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: how long the stopping workers are given beyond their own graceful stop before they are killed
STOP_MARGIN_S = 5.0


class WorkerDied(RuntimeError):
    """A worker ended while the gateway was not stopping: `code` is its exit code (negative: its signal)."""

    def __init__(self, index: int, code: int) -> None:
        super().__init__(f"gateway worker {index} ended ({_how(code)}); stopping the gateway")
        self.index, self.code = index, code


def _how(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def _die_with_parent(parent: int) -> None:
    """SIGTERM to this process when its parent dies; gone at once if it died before this call."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(0)


def _child(serve: Callable[[int, Connection], None], index: int, ready: Connection, parent: int) -> None:
    for sig in STOP_SIGNALS:  # the parent's (_raise_stop) are its own: a worker stops as uvicorn makes it
        signal.signal(sig, signal.SIG_DFL)
    _die_with_parent(parent)
    serve(index, ready)


class _StopAsked(BaseException):
    """SIGTERM or SIGINT while the workers started: stop them as after (a BaseException, as KeyboardInterrupt,
    so that no handler of an error on the way takes it for one)."""


def _raise_stop(signum: int, frame: types.FrameType | None) -> None:
    raise _StopAsked(signum)


def run_workers(
    count: int,
    serve: Callable[[int, Connection], None],
    started: Callable[[list[Any]], None],
    stopping: Callable[[], None],
    renewer: Any,
    stop_s: float,
    listening: socket.socket,
) -> None:
    """Fork `count` workers, each running `serve(index, ready)` (which sends one value on `ready` once it serves)
    on the inherited `listening` socket, whose copy the parent closes once all have it; `started(values)` once all
    served; then wait for SIGTERM/SIGINT (or the renewal's end: `renewer.run`), and `stopping()` (the record
    withdrawn) before the workers are stopped, given `stop_s` and a margin. WorkerDied when one ends meanwhile (or
    before it started). A SIGTERM/SIGINT at any point from the first fork on stops the workers so: the caller's
    `finally` runs (its temporary folder removed), which a signal's default action would skip."""
    context = get_context("fork")
    procs: list[BaseProcess] = []
    readers: list[Connection] = []
    previous = {sig: signal.signal(sig, _raise_stop) for sig in STOP_SIGNALS}
    try:
        try:
            for index in range(count):
                reader, writer = context.Pipe(duplex=False)
                proc = context.Process(
                    target=_child,
                    args=(serve, index, writer, os.getpid()),
                    name=f"hpc-serve-gateway-worker-{index}",
                )
                proc.start()
                writer.close()
                procs.append(proc)
                readers.append(reader)
            # the workers accept on it; a copy left open here would take connections (the kernel queues them on
            # the socket while any process holds it) that no one answers once the workers stopped accepting
            listening.close()
            started(_wait_started(procs, readers))
            died = asyncio.run(_supervise(procs, renewer))
            _ignore_stop_signals()  # the loop's close gave the stop signals their default action back
        except _StopAsked:
            died = None
        if died is not None:
            # its sentinel closes as it exits, a moment before it can be reaped: exitcode (a WNOHANG wait) may
            # still be None then, and the gateway would end with 1 instead of the worker's signal
            procs[died].join()
            raise WorkerDied(died, procs[died].exitcode or 0)
    finally:
        _ignore_stop_signals()  # the stop is under way: a second signal must not cut it short
        try:
            stopping()
        finally:
            _stop(procs, stop_s + STOP_MARGIN_S)
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _ignore_stop_signals() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _wait_started(procs: list[BaseProcess], readers: list[Connection]) -> list[Any]:
    """Each worker's value sent once it serves, in worker order; WorkerDied for one that ended first."""
    values: dict[int, Any] = {}
    pending = dict(enumerate(readers))
    while pending:
        ready = wait([*pending.values(), *(procs[i].sentinel for i in pending)], timeout=START_S)
        if not ready:
            raise RuntimeError(f"gateway workers {sorted(pending)} did not start within {START_S:g} s")
        for index, reader in list(pending.items()):
            if reader in ready:
                try:
                    values[index] = reader.recv()
                except EOFError:  # it ended before it served
                    procs[index].join()
                    raise WorkerDied(index, procs[index].exitcode or 0) from None
                del pending[index]
            elif procs[index].sentinel in ready:
                procs[index].join()
                raise WorkerDied(index, procs[index].exitcode or 0)
    return [values[i] for i in range(len(readers))]


async def _supervise(procs: list[BaseProcess], renewer: Any) -> int | None:
    """Until SIGTERM/SIGINT, the renewal's end, or a worker's end: the index of a worker that ended, else None."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    server = types.SimpleNamespace(should_exit=False)  # what the renewal reads and sets (a uvicorn Server's flag)
    died: list[int] = []

    def stop() -> None:
        server.should_exit = True
        done.set()

    def ended(index: int) -> None:
        loop.remove_reader(procs[index].sentinel)
        died.append(index)
        done.set()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    for index, proc in enumerate(procs):
        loop.add_reader(proc.sentinel, ended, index)

    async def renew() -> None:
        await renewer.run(server)
        done.set()

    renewal = asyncio.ensure_future(renew()) if renewer is not None else None
    try:
        await done.wait()
    finally:
        if renewal is not None:
            renewal.cancel()
        for proc in procs:
            loop.remove_reader(proc.sentinel)
    return died[0] if died and not server.should_exit else None


def _stop(procs: list[BaseProcess], wait_s: float) -> None:
    """SIGTERM to every worker still running, and wait for them; those still running after `wait_s` (in all, not
    each: Slurm's KillWait bounds the whole stop) are killed."""
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            log.warning("gateway worker %s did not stop within %.0f s; killed", proc.name, wait_s)
            proc.kill()
            proc.join()
