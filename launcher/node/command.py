"""The tritonserver argv of one rank: a pure function, so it can be unit-tested and printed before running; and
the removal of the python backend's shared-memory regions it asks for (their names: launcher/contracts/shm.py)."""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from launcher.contracts.shm import SHM_DIR, shm_prefix
from launcher.node.ports import Ports


def remove_shm_regions(rank: int, job_id: str, shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove the rank's python-backend regions: a stub or tritonserver that was killed leaves them behind (only a
    clean unload removes them). Call it when no process of the rank's tritonserver is left."""
    prefix = shm_prefix(rank, job_id)
    removed: list[str] = []
    try:
        names = [name for name in os.listdir(shm_dir) if name.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        try:
            os.unlink(shm_dir / name)
            removed.append(name)
        except OSError:
            pass
    return removed


#: what every hpc-serve rank's region is named (`shm_prefix` + the python backend's own suffix)
_REGION = re.compile(r"^prefix\d+_[A-Za-z0-9-]+_")
#: how old an unmapped region must be to be taken for an orphan: older than the moment between a starting
#: tritonserver's shm_open and its mmap
ORPHAN_AGE_S = 60.0


def remove_orphan_regions(shm_dir: Path = SHM_DIR, min_age_s: float = ORPHAN_AGE_S) -> list[str]:
    """Remove hpc-serve regions of this user that no process maps (older than `min_age_s`): what ranks killed
    with their launcher left on this node (a plain `scancel` past KillWait, a SIGKILL sweep of a local job, a
    node's OOM killer), which no later job of theirs removes. Every rank sweeps at its start, so a node's
    /dev/shm (the host's under apptainer or bare metal) does not fill job after job; a live tritonserver and
    its stubs map their regions for as long as they run. Only the caller's own regions: another user's cannot
    be unlinked (/dev/shm is sticky) and its processes' maps cannot be read. (A container with a PID namespace
    of its own and the host's /dev/shm would not see other jobs' maps; runtimes that make one, docker and
    podman, give it a /dev/shm of its own too, and apptainer and enroot make none.)"""
    uid, now = os.getuid(), time.time()
    try:
        candidates = [e for e in os.scandir(shm_dir) if _REGION.match(e.name)]
    except OSError:
        return []
    old = [e for e in candidates if _owned_and_older(e, uid, now - min_age_s)]
    if not old:
        return []
    mapped = _mapped_paths(str(shm_dir))
    removed: list[str] = []
    for entry in old:
        if os.path.join(shm_dir, entry.name) in mapped:
            continue
        try:
            os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:
            pass
    return removed


def _owned_and_older(entry: os.DirEntry, uid: int, before: float) -> bool:
    try:
        stat = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.st_uid == uid and stat.st_mtime < before


def _mapped_paths(shm_dir: str) -> set[str]:
    """Files under `shm_dir` that a process this user can see maps (/proc/<pid>/maps)."""
    mapped: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps", errors="replace") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                    if len(fields) == 6 and fields[5].startswith(shm_dir + "/"):
                        mapped.add(fields[5].strip())
        except OSError:
            continue
    return mapped


def build_argv(
    argv0: str,
    *,
    model_repository: str,
    rank: int,
    job_id: str,
    leader: bool,
    ports: Ports | None = None,
    follower_models: Sequence[str] = (),
    backend_dir: str | None = None,
    server_args: Sequence[str] = (),
    exit_timeout_s: float | None = None,
) -> list[str]:
    """Build the command line.

    Leader: the whole repository (default model control) on ``ports``.  Follower: only ``follower_models`` with explicit
    model control (the python pre/post/BLS models stay on the leader, as in launch_triton_server.py), and all three
    endpoints disabled, so even a follower that finishes loading (the root cause of tensorrtllm_backend#243) cannot take
    a port.  ``exit_timeout_s`` bounds tritonserver's own graceful stop (drain in-flight requests, unload), so a cancel
    ends in a known time (launch.json ``drain_s``).  ``server_args`` come last so a user can override anything.
    """
    argv = [argv0, f"--model-repository={model_repository}", "--disable-auto-complete-config"]
    if backend_dir:
        argv.append(f"--backend-directory={backend_dir}")
    argv.append(f"--backend-config=python,shm-region-prefix-name={shm_prefix(rank, job_id)}")
    if exit_timeout_s is not None:
        argv.append(f"--exit-timeout-secs={max(0, math.ceil(exit_timeout_s))}")
    if leader:
        if ports is None:
            raise ValueError("a leader needs ports")
        argv += [f"--http-port={ports.http}", f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}"]
    else:
        if not follower_models:
            raise ValueError("follower_models is empty: a follower would load nothing and exit")
        argv.append("--model-control-mode=explicit")
        argv += [f"--load-model={name}" for name in follower_models]
        argv += ["--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
    argv += list(server_args)
    return argv
