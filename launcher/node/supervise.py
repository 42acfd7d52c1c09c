"""Run one tritonserver, tee its output, publish readiness, forward signals, and record how it ended.

Why a supervisor instead of ``exec tritonserver``: the leader must publish an endpoint record only once
``/v2/health/ready`` is 200 and a warm-up request came back (launcher/node/ready.py), and remove it when the server
goes away; every rank must leave an exit record (exit code,
signal, log tail) for ``hpc`` to explain failures; and no tritonserver or python stub may outlive the job step.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launcher.contracts.text_enum import TextEnum
from launcher.contracts.urls import READY_PATH, http_url, open_direct
from launcher.node.stop import KILL, TERM, FollowerStop, LeaderDrain

if TYPE_CHECKING:
    from launcher.node.watch import Failure

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
# tritonserver handles SIGINT/SIGTERM gracefully; SIGHUP/SIGUSR1 would kill it outright (default action), so
# they are turned into SIGTERM (Slurm sends SIGUSR1 with --signal before the time limit).
_TO_CHILD = {signal.SIGINT: signal.SIGINT}
PR_SET_PDEATHSIG = 1
LOG_TAIL = 20
#: how long a rank waits for a process group it SIGKILLed to be gone before it goes on (it is, within
#: milliseconds, unless a process is stuck in the kernel: then the rank exits anyway and Slurm's step teardown
#: has the last word)
KILLED_GONE_S = 5.0


def log(msg: str) -> None:
    """Launcher messages go to stderr with a recognisable prefix (srun routes it to <job>_<rank>_log.err)."""
    try:
        print(f"[hpc-serve] {msg}", file=sys.stderr, flush=True)
    except (OSError, RuntimeError, ValueError):  # reentrant call from a signal handler, closed stderr
        pass


def signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"SIG{-returncode}"


def exit_code(returncode: int) -> int:
    """Shell convention: 128+N for a child killed by signal N."""
    return returncode if returncode >= 0 else 128 - returncode


def _pdeathsig_preexec(ignore: Sequence[int] = ()) -> Callable[[], None]:
    """A preexec_fn that puts the child in its own process group and asks Linux to SIGKILL it if we die, with
    the signals in ``ignore`` ignored (an ignored disposition survives exec; see launcher/node/stop.py for why).

    SIGKILL rather than SIGTERM: a follower blocked in model initialisation ignores SIGTERM, and with the launcher
    gone nobody would escalate.  The python stubs notice their dead parent by themselves (they poll its pid).
    libc is loaded here, before fork, so the child only calls an already-resolved function.
    """
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            prctl = libc.prctl
        except (OSError, AttributeError):
            prctl = None
    parent = os.getpid()

    def preexec() -> None:
        os.setpgid(0, 0)
        for sig in ignore:
            signal.signal(sig, signal.SIG_IGN)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # parent died before prctl took effect
                os._exit(128 + signal.SIGKILL)

    return preexec


#: lines of a rank's processes' output kept for the exit record (its log tail is the last LOG_TAIL of them)
LOG_RING = 400


class Tee:
    """Copy a child's pipe to one of our streams line by line, keeping recent lines for the exit record: text
    shown to the user, never read to decide a state (a port collision is told by binding the port, ports.py)."""

    def __init__(self, pipe: IO[bytes], out: IO, ring: collections.deque[str]) -> None:
        self.ring = ring
        self._pipe, self._out = pipe, out
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        binary = hasattr(self._out, "buffer")
        out: Any = getattr(self._out, "buffer", self._out)  # text-only streams (e.g. a caller's capture object)
        for raw in iter(self._pipe.readline, b""):
            try:
                out.write(raw if binary else raw.decode("utf-8", "replace"))
                out.flush()
            except (OSError, ValueError):
                pass
            self.ring.append(raw.decode("utf-8", "replace").rstrip("\n"))
        self._pipe.close()


@dataclass
class Child:
    """A running tritonserver and its output tees."""

    proc: subprocess.Popen
    ring: collections.deque[str]
    tees: list[Tee] = field(default_factory=list)
    started_at: float = 0.0
    #: what it is, for the log: tritonserver, or (llmapi workflow) the worker node a rank > 0 runs in its place
    name: str = "tritonserver"

    def finish_output(self, timeout: float = 2.0) -> None:
        for tee in self.tees:
            tee.thread.join(timeout)


def start_process(
    argv: Sequence[str], env: dict[str, str], ring: collections.deque[str], ignore: Sequence[int] = ()
) -> Child:
    """A child in its own process group, killed if the launcher dies, its output teed into ``ring`` (shared by the
    processes of one rank, so the exit record's log tail shows whichever of them spoke last)."""
    proc = subprocess.Popen(
        list(argv),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_pdeathsig_preexec(ignore),
        close_fds=True,
    )
    child = Child(proc, ring, started_at=time.time())
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes (see Popen above)
    child.tees = [Tee(proc.stdout, sys.stdout, ring), Tee(proc.stderr, sys.stderr, ring)]
    return child


class Supervisor:
    """Owns the child process group and the signal handlers.

    A leader's stop: the signal is forwarded (SIGTERM) and the group SIGKILLed after ``stop_grace_s``. A
    follower's (``follower`` given): nothing is forwarded; ``follower`` decides when to stop waiting for the
    leader's release (launcher/node/stop.py)."""

    def __init__(
        self,
        stop_grace_s: float,
        follower: FollowerStop | None = None,
        on_stop: Callable[[int], LeaderDrain | None] | None = None,
        unload_s: float = 0.0,
    ) -> None:
        self.stop_grace_s = stop_grace_s
        self.follower = follower
        self.on_stop = on_stop  # called once with the first stop signal, before it is forwarded
        #: the model's drain, which holds the forwarded SIGTERM back (launcher/node/stop.py LeaderDrain)
        self.drain: LeaderDrain | None = None
        self.unload_s = unload_s  # the SIGKILL backstop comes at least this long after a held SIGTERM
        #: the job's cancel marker and its own stop request (the .sub at the time limit, the renewer): either one
        #: starts the ordered stop as SIGTERM would, without the signal that Slurm would also deliver to
        #: tritonserver itself (launcher/node/stop.py LeaderDrain says why that hurts)
        self.stop_requests: tuple[Path, ...] = ()
        self.stop_signal: int | None = None
        self.kill_at: float | None = None
        self.child: Child | None = None
        self._old: dict[int, object] = {}
        #: asked on every poll whether the rank must end now (launcher/node/watch.py RankWatch.check: a failed peer,
        #: a dead stub); its answer is kept in ``failure`` and the child's group is SIGKILLed
        self.watch: Callable[[bool], Failure | None] | None = None
        self.failure: Failure | None = None
        #: called with the child once ``failure`` is set, before its group is SIGKILLed (the rank's exit record)
        self.before_kill: Callable[[Child], None] | None = None
        #: when the rank failed or ended (time.time()), kept across the record's writes
        self.failed_at: float | None = None

    # -- signals -----------------------------------------------------------------------------------------------
    def install(self) -> None:
        for sig in FORWARDED:
            self._old[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _on_signal(self, signum: int, _frame: object) -> None:
        first = self.stop_signal is None
        if first and self.follower is not None:
            self.stop_signal = signum
            self.follower.begin()
            log(
                f"received {signal.Signals(signum).name}; waiting up to {self.follower.release_wait_s:g} s for "
                "the leader to release this rank"
            )
            return
        if first:
            self.stop_signal = signum
            self.kill_at = time.monotonic() + self.stop_grace_s
            if self.on_stop is not None:
                try:
                    self.drain = self.on_stop(signum)
                except Exception as exc:  # noqa: BLE001 - telling the model is a courtesy; the stop goes on
                    log(f"could not announce the stop: {exc}")
        child = self.child
        if first and self.drain is not None and child is not None:
            log(
                f"received {signal.Signals(signum).name}; tritonserver pid {child.proc.pid} gets SIGTERM once its "
                "model drained (refusing new requests, finishing those in flight)"
            )
            return
        if child is not None and child.proc.poll() is None and first:
            sig = _TO_CHILD.get(signal.Signals(signum), signal.SIGTERM)
            log(
                f"received {signal.Signals(signum).name}; forwarding {sig.name} to tritonserver pid {child.proc.pid} "
                f"(SIGKILL after {self.stop_grace_s:.0f} s)"
            )
            try:
                os.kill(child.proc.pid, sig)
            except ProcessLookupError:
                pass

    @property
    def stopping(self) -> bool:
        return self.stop_signal is not None

    # -- process -----------------------------------------------------------------------------------------------
    def spawn(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        ignore: Sequence[int] = (),
        ring: collections.deque[str] | None = None,
    ) -> Child:
        """Start tritonserver in its own process group with the signals in ``ignore`` ignored; its output goes to
        ``ring`` when given (a ring the rank's other process writes too), else to a new one."""
        child = start_process(argv, env, collections.deque(maxlen=LOG_RING) if ring is None else ring, ignore)
        self.child = child
        if self.stopping and self.follower is None:  # a signal arrived while we were starting: stop right away
            os.kill(child.proc.pid, signal.SIGTERM)
        return child

    def poll(self, child: Child) -> int | None:
        """Non-blocking status; ends the child at once when the watch says so (fail-fast); enforces the SIGKILL
        deadline of a requested stop (a follower's: its own)."""
        rc = child.proc.poll()
        if rc is None and not self.stopping and (asked := [p for p in self.stop_requests if p.exists()]):
            log(f"stop requested ({asked[0].name}); stopping as on SIGTERM")
            self._on_signal(signal.SIGTERM, None)
        if rc is None and self.watch is not None and self.failure is None:
            self.failure = self.watch(self.stopping)
            if self.failure is not None:
                self.failed_at = time.time()
                if self.before_kill is not None:
                    self.before_kill(child)
                log(f"{self.failure.why}; sending SIGKILL to tritonserver's process group {child.proc.pid}")
                self.kill_group(child, signal.SIGKILL)
                return None
        if rc is None and self.follower is not None:
            what, why = self.follower.action()
            if what == TERM:
                log(f"{why}; sending SIGTERM to tritonserver pid {child.proc.pid}")
                try:
                    os.kill(child.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            elif what == KILL:
                log(f"tritonserver pid {child.proc.pid} {why}; sending SIGKILL to its process group")
                self.kill_group(child, signal.SIGKILL)
            return rc
        if rc is None and self.drain is not None and self.drain.release():
            log(f"{self.drain.reason}; sending SIGTERM to tritonserver pid {child.proc.pid}")
            self.kill_at = max(self.kill_at or 0.0, time.monotonic() + self.unload_s)
            try:
                os.kill(child.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if rc is None and self.kill_at is not None and time.monotonic() >= self.kill_at:
            log(
                f"tritonserver pid {child.proc.pid} still running {self.stop_grace_s:.0f} s after "
                f"{signal.Signals(self.stop_signal or signal.SIGTERM).name}; sending SIGKILL to its process group"
            )
            self.kill_group(child, signal.SIGKILL)
            self.kill_at = None
        return rc

    def wait(self, child: Child, interval: float = 0.2) -> int:
        while True:
            rc = self.poll(child)
            if rc is not None:
                return rc
            time.sleep(interval)

    def stop(self, child: Child) -> int:
        """Ask tritonserver to stop (SIGTERM), escalate after the grace period, return its return code.
        A follower's ignores SIGTERM while loading: the launcher itself gave up on it, so no release wait."""
        if self.follower is not None:
            self.stop_signal = self.stop_signal or signal.SIGTERM
            self.follower.begin(0.0)
            return self.wait(child)
        if child.proc.poll() is None:
            if self.stop_signal is None:
                self.stop_signal = signal.SIGTERM
                self.kill_at = time.monotonic() + self.stop_grace_s
            try:
                os.kill(child.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        return self.wait(child)

    @staticmethod
    def kill_group(child: Child, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(child.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def kill_group_gone(child: Child, within: float = KILLED_GONE_S) -> None:
        """SIGKILL the process group, then wait until nothing of it is alive: a killed process keeps its /proc
        entry, command line and open files a moment (longer on a loaded node), and a rank that exits must leave
        nothing behind."""
        Supervisor.kill_group(child, signal.SIGKILL)
        deadline = time.monotonic() + within
        while group_alive(child.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def reap_group(self, child: Child, patience: float = 1.5) -> None:
        """After tritonserver exited: give its python stubs a moment to exit on their own (they clean their shared
        memory), then SIGKILL whatever is left in the process group, so nothing outlives the rank."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            if not group_alive(child.proc.pid):
                break
            time.sleep(0.05)
        else:
            log(f"killing leftover processes of group {child.proc.pid}")
            self.kill_group_gone(child)
        child.finish_output()


def group_alive(pgid: int) -> bool:
    """Whether a process group still has a live member. Zombies do not count: a stub whose tritonserver was
    killed is reparented to whoever reaps orphans (slurmstepd, a container's init), which may take its time,
    and ``killpg(pgid, 0)`` would count it until then."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, ...
            return True
    return False


def is_ready(http_port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    try:
        with open_direct(http_url(host, http_port, READY_PATH), timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class HealthWait(TextEnum):
    """How ``wait_ready`` ended: tritonserver's health check said ready, tritonserver ended (or the fail-fast watch
    ended it), a stop signal came first, or ``timeout_s`` ran out."""

    READY = "ready"
    EXITED = "exited"
    STOPPING = "stopping"
    TIMEOUT = "timeout"


def wait_ready(sup: Supervisor, child: Child, http_port: int, timeout_s: float) -> HealthWait:
    """Wait for ``/v2/health/ready``.  Polls every 20 ms for the first 10 s (a small repository is ready in
    ~0.3 s, and every poll gap is added to the time to READY), then backs off to 0.25 s so a 15-minute TRT-LLM
    load does not spin."""
    start = time.monotonic()
    deadline = start + timeout_s
    interval = 0.02
    while True:
        if sup.poll(child) is not None:
            return HealthWait.EXITED
        if sup.stopping:
            return HealthWait.STOPPING
        if is_ready(http_port):
            return HealthWait.READY
        if time.monotonic() >= deadline:
            return HealthWait.TIMEOUT
        time.sleep(interval)
        if time.monotonic() - start > 10:
            interval = min(interval * 1.5, 0.25)


def describe(argv: Sequence[str]) -> str:
    return shlex.join(argv)
