"""Fail-fast: what ends a rank early besides its own tritonserver's exit — a python backend stub that died, or
a rank of its replica that failed.

Why the launcher watches them (DEVELOPERS.md "Fail-fast"):
- tritonserver outlives a dead stub: it reaps it, keeps answering ``/v2/health/ready`` with 200 and fails every
  request to that model ("Stub process 'tensorrt_llm_0_0' is not healthy"): a replica that looks healthy and
  serves nothing. Its launcher sees the stub end (a pidfd per stub wakes a thread at once; without pidfds,
  Linux < 5.3, a 20 ms poll) and reads how it ended from ``/proc`` while it is still a zombie: tritonserver
  reaps it about a second later, and then nobody but tritonserver knows. A stub that exits 0 had its model
  unloaded (tritonserver stopping, or the repository API), which is no failure.
- a rank whose peer died waits for it in MPI (the CPU engine's broadcasts give up after 30 s, TensorRT-LLM's
  collectives never), or, told to stop by srun's --kill-on-bad-exit, drains and waits for a release that
  never comes, until Slurm SIGKILLs it (KillWait, 30 s on many clusters). So every rank reads the exit records
  of the other ranks of its replica (every 0.5 s), and a failed one ends it at once.

Standard library only; the /proc readers take the folder as an argument so tests can hand them a fake one.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.contracts.records import RankExitRecord
from launcher.node.server import STUB_NAME

PROC = Path("/proc")
#: how often each launcher reads its peers' exit records
PEER_POLL_S = 0.5
#: how often the stub watch looks for new stubs (models load one by one); without pidfds, how often it polls
STUB_RESCAN_S = 1.0
STUB_POLL_S = 0.02


@dataclass(frozen=True)
class Failure:
    """Why the launcher ended its rank's tritonserver: ``why`` goes into the exit record's ``error``; ``signal``
    and ``exit_code`` (a return code: -N for signal N) are the dead stub's, when seen; ``cause_rank`` the failed
    peer's rank."""

    why: str
    signal: str | None = None
    exit_code: int | None = None
    cause_rank: int | None = None


def _stat_fields(pid: int, proc: Path = PROC) -> list[str] | None:
    """/proc/<pid>/stat after the command name (``state`` first), or None once the process is gone."""
    try:
        return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def zombie_returncode(pid: int, proc: Path = PROC) -> int | None:
    """How a process that ended but is not reaped yet ended, as a Popen return code (-N: signal N); None if it
    is running, gone, or the kernel does not say (``exit_code`` is stat's 52nd field, Linux ≥ 3.5)."""
    fields = _stat_fields(pid, proc)
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    status = int(fields[49])
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def group_stubs(pgid: int, proc: Path = PROC) -> dict[int, str]:
    """The live python backend stubs in process group ``pgid`` → the model each serves (its ``model.py``'s
    ``<model>/<version>/model.py`` path says which)."""
    found: dict[int, str] = {}
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name), proc)
        if not fields or len(fields) < 3 or int(fields[2]) != pgid or fields[0] == "Z":
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0].decode(errors="replace")) == STUB_NAME:
            parts = Path(argv[1].decode(errors="replace")).parts if len(argv) > 1 else ()
            found[int(entry.name)] = parts[-3] if len(parts) >= 3 else "?"
    return found


def _how(returncode: int) -> tuple[str, str | None]:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"SIG{-returncode}"
        return f"was killed by {name}", name
    return f"exited with code {returncode}", None


class StubWatch:
    """A thread watching the python backend stubs of one tritonserver (its process group): ``death`` is set
    when one ends. Arm it once the server is ready: stubs that end while models load or unload are
    tritonserver's business (it reports a failed load itself)."""

    def __init__(self, pgid: int, proc: Path = PROC, rescan_s: float = STUB_RESCAN_S) -> None:
        self.pgid, self.proc, self.rescan_s = pgid, proc, rescan_s
        self.death: Failure | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stub-watch", daemon=True)
        self._stubs: dict[int, tuple[str, int | None]] = {}  # pid → (model, pidfd)
        #: pid → return code of each stub whose end the watch handled (0: its model was unloaded), entered after
        #: ``death`` is decided: whoever finds a stub here finds ``death`` as that end left it
        self.ended: dict[int, int | None] = {}

    def start(self) -> StubWatch:
        self._thread.start()
        return self

    def watching(self, pid: int) -> bool:
        """Whether the stub ``pid`` is watched now: a scan found it and its end was not seen yet."""
        return pid in self._stubs

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        for _, fd in self._stubs.values():
            if fd is not None:
                os.close(fd)
        self._stubs.clear()

    def _rescan(self) -> None:
        for pid, model in group_stubs(self.pgid, self.proc).items():
            if pid not in self._stubs:
                try:
                    fd: int | None = os.pidfd_open(pid)
                except (AttributeError, OSError):  # Linux < 5.3, or it ended already (the poll sees it)
                    fd = None
                self._stubs[pid] = (model, fd)

    def _ended(self, pid: int) -> bool:
        fields = _stat_fields(pid, self.proc)
        return fields is None or fields[0] == "Z"

    def _run(self) -> None:
        next_scan = 0.0
        while not self._stop.is_set() and self.death is None:
            now = time.monotonic()
            if now >= next_scan:
                self._rescan()
                next_scan = now + self.rescan_s
            fds = {fd: pid for pid, (_, fd) in self._stubs.items() if fd is not None}
            polled = [pid for pid, (_, fd) in self._stubs.items() if fd is None]
            wait = min(max(0.0, next_scan - time.monotonic()), STUB_POLL_S if polled else self.rescan_s)
            ready: list[int] = []
            if fds:
                ready = select.select(list(fds), [], [], wait)[0]
            else:
                time.sleep(wait)
            for pid in [fds[fd] for fd in ready] + [pid for pid in polled if self._ended(pid)]:
                returncode = zombie_returncode(pid, self.proc)  # at once: tritonserver reaps it soon
                model, fd = self._stubs.pop(pid)
                if fd is not None:
                    os.close(fd)
                if returncode:  # a signal or an error; 0 is a model unloaded, None an end nobody saw
                    how, name = _how(returncode)
                    self.death = Failure(
                        f"the python backend stub of model {model!r} (pid {pid}) {how}; tritonserver would go on "
                        "answering health checks and fail every request to it, so this rank was stopped",
                        signal=name,
                        exit_code=returncode,
                    )
                self.ended[pid] = returncode
                if self.death is not None:
                    break


def _read_record(path: Path) -> RankExitRecord | None:
    return RankExitRecord.read(path)


class PeerWatch:
    """The exit records of the other ranks of this rank's replica (``peers``: rank → record path): ``check()``
    returns a Failure once one of them failed (at most every ``every_s``)."""

    def __init__(
        self,
        replica: int,
        peers: Mapping[int, Path],
        every_s: float = PEER_POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replica, self.peers, self.every_s, self.clock = replica, dict(peers), every_s, clock
        self._next = 0.0

    def check(self) -> Failure | None:
        now = self.clock()
        if now < self._next:
            return None
        self._next = now + self.every_s
        for rank, path in sorted(self.peers.items()):
            if not path.exists():
                continue
            record = _read_record(path)
            if record is not None and record.failed:
                if record.cause_rank is not None:  # it stopped for another peer: that one is the cause
                    cause, how = record.cause_rank, ""
                else:
                    cause = rank
                    how = f" ({f'signal {record.signal}' if record.signal else f'exit code {record.exit_code}'})"
                return Failure(
                    f"rank {cause} of replica {self.replica} failed{how}; this rank of the replica stopped with it",
                    cause_rank=cause,
                )
        return None


class RankWatch:
    """What the supervisor asks on every poll (``check(stopping)``): a failed peer (always: a stop in progress
    must not wait for a dead peer), then a dead stub (only while serving, not stopping)."""

    def __init__(self, peers: PeerWatch) -> None:
        self.peers = peers
        self.stubs: StubWatch | None = None

    def arm_stubs(self, pgid: int) -> None:
        """From now on a stub that ends ends the rank (call once the server is ready)."""
        if self.stubs is None:
            self.stubs = StubWatch(pgid).start()

    def check(self, stopping: bool) -> Failure | None:
        failure = self.peers.check()
        if failure is None and not stopping and self.stubs is not None:
            failure = self.stubs.death
        return failure

    def close(self) -> None:
        if self.stubs is not None:
            self.stubs.stop()
