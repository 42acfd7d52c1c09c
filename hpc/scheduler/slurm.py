"""The login side's Slurm gateway: `launcher.contracts.slurm`'s commands and states, plus what only this side needs.

Every Slurm command and every reading of a job state is defined once, in `launcher/contracts/slurm.py` (standard library
only, so the renewer inside a job runs the same code); this module names them for `hpc/` (its callers import
`hpc.scheduler.slurm`, and tests replace `default`) and adds which cluster the commands talk to (`cluster_name`:
SLURM_CONF's ClusterName, asked once per file), which a process on the login side asks for every job it
indexes or lists. A job of another cluster is asked about and cancelled with `-M <its cluster>` (`cluster=`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from launcher.contracts import slurm as _stdlib
from launcher.contracts.slurm import (
    ATTEMPTS,
    BACKOFF_S,
    DEFAULT_TIMEOUT_S,
    GONE,
    STATE_CLASS,
    TERMINAL,
    TERMINAL_RAW,
    TRANSIENT,
    UNREACHED,
    Result,
    Runner,
    SlurmError,
    SlurmNotInstalled,
    SlurmTimeout,
    ended,
    on_cluster,
    run_subprocess,
    state_class,
)

__all__ = [
    "ATTEMPTS",
    "BACKOFF_S",
    "DEFAULT_TIMEOUT_S",
    "GONE",
    "MAX_DELAY_S",
    "STATE_CLASS",
    "TERMINAL",
    "TERMINAL_RAW",
    "TRANSIENT",
    "UNREACHED",
    "Result",
    "Runner",
    "Slurm",
    "SlurmError",
    "SlurmNotInstalled",
    "SlurmTimeout",
    "default",
    "ended",
    "on_cluster",
    "run_subprocess",
    "state_class",
]

#: the longest an answer of Slurm's is reused: the watcher's slowest refresh (hpc/scheduler/watch.py), and how long a
#: failed ClusterName lookup stands before `cluster_name` asks again
MAX_DELAY_S = 30.0


class Slurm(_stdlib.Slurm):
    """`launcher.contracts.slurm.Slurm` (timeouts, errors, retries), and the cluster it talks to, cached."""

    def __init__(
        self,
        runner: Runner = run_subprocess,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        attempts: int = ATTEMPTS,
        backoff_s: float = BACKOFF_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        super().__init__(runner, sleep=sleep, attempts=attempts, backoff_s=backoff_s, timeout_s=timeout_s)
        self.clock = clock
        # by SLURM_CONF (the file names the cluster): (ClusterName or None, until when: None for good)
        self._cluster_names: dict[str | None, tuple[str | None, float | None]] = {}

    def cluster_name(self) -> str | None:
        """The cluster the commands talk to: `scontrol show config`'s ClusterName, asked once per SLURM_CONF
        (another file may name another cluster). None when Slurm cannot say: no ClusterName, or the question
        failed; a failure stands for MAX_DELAY_S, so that `list` over many jobs asks once (with its retries), not
        once per job, and a long-lived process asks again later."""
        conf = os.environ.get("SLURM_CONF")
        known = self._cluster_names.get(conf)
        if known is not None and (known[1] is None or self.clock() < known[1]):
            return known[0]
        until: float | None = None
        try:
            out = self.run(["scontrol", "show", "config"]).stdout
        except SlurmNotInstalled:
            out = ""
        except SlurmError:
            out, until = "", self.clock() + MAX_DELAY_S
        match = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.MULTILINE)
        self._cluster_names[conf] = (match.group(1) if match else None, until)
        return self._cluster_names[conf][0]

    def queued(self, name: str, script: Path) -> dict[str, tuple[str, float | None, float | None]]:
        """{job id: (state, start, end)} of this user's jobs named `name` running `script` that Slurm still lists,
        in one call: a PENDING job's start is the scheduler's estimate (`squeue --start`'s column; None while it has
        none), a running job's end its time limit. The autoscaling controller's view of the queue
        (hpc/jobs/autoscale.py): it shows the jobs submitted by hand too (`sbatch D/tensorrt_llm_triton.sub`), and
        not those of another deployment of the same name (another workdir: another script)."""
        out = self._answer(["squeue", "--me", "-h", "--name", name, "-o", "%i|%T|%S|%e|%Z|%o"]) or ""
        found: dict[str, tuple[str, float | None, float | None]] = {}
        mine = os.path.realpath(script)
        for line in out.splitlines():
            parts = line.strip().split("|", 5)
            if len(parts) == 6 and os.path.realpath(os.path.join(parts[4], parts[5])) == mine:
                found[parts[0]] = (parts[1], _stdlib.parse_slurm_time(parts[2]), _stdlib.parse_slurm_time(parts[3]))
        return found


#: the process's gateway; call sites use `slurm.default`, so tests can replace it.
default = Slurm()
