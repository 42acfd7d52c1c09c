"""Where a rank's own output goes: its per-rank log files (what `hpc-serve logs` and submitit read), whether
the rank was started by the rendered `.sub`, the local executor or a hand-typed `srun` in `salloc`.

Why a module of its own: it is decided once, at the launcher's start, before any child runs
(launcher/node/supervise.py tees each child's output into these streams).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import IO, Any


class _Both:
    """A write-only stream copying to two streams (text, or binary as `.buffer`): the terminal of an
    interactive `srun` and the rank's own log file."""

    def __init__(self, first: IO, second: IO) -> None:
        self._streams = (first, second)
        if all(hasattr(st, "buffer") for st in self._streams):
            self.buffer = _Both(getattr(first, "buffer"), getattr(second, "buffer"))  # noqa: B009 - typed IO lacks it

    def write(self, data: Any) -> int:
        for stream in self._streams:
            try:
                stream.write(data)
            except (OSError, ValueError):
                pass
        return len(data)

    def flush(self) -> None:
        for stream in self._streams:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def log_to_rank_files(out_path: Path, err_path: Path, own: bool = False) -> None:
    """Make sure this rank's output lands in its per-rank log files (what `hpc-serve logs` and submitit read).
    `own`: the rendered `.sub`'s replica steps, whose srun cannot name the files (their names count ranks in the
    whole job, srun's `%t` in the step): stdout and stderr are moved to the files (appended: a requeued job's
    runs follow each other), so tritonserver's and every later line go there and nowhere else. Otherwise (the
    local executor's redirected files, a hand-typed `srun --mpi=pmix hpc-serve launch spec.yaml` in salloc that
    writes to the terminal) output already in the file stays as is, and a terminal's is copied to the files."""
    for fd, path, name in ((1, out_path, "stdout"), (2, err_path, "stderr")):
        if _same_file(fd, path):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if own:
            getattr(sys, name).flush()
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
            os.close(target)
            continue
        copy = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
        setattr(sys, name, _Both(getattr(sys, name), copy))
