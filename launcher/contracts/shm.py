"""The names of the python backend's shared-memory regions a rank's tritonserver asks for (``/dev/shm``): the rank
passes the prefix to tritonserver and removes what is left of them (launcher/node/command.py), and the `.sub`'s
backstop globs them after a replica ended (render writes the glob). Standard library only, Python 3.10.
"""

from __future__ import annotations

import re
from pathlib import Path

#: where the python backend's shared-memory regions live (POSIX shm_open)
SHM_DIR = Path("/dev/shm")


def shm_prefix(rank: int | str, job_id: str) -> str:
    """``prefix<rank>_<job>_``: upstream's ``prefix<rank>_`` shape (tensorrtllm_backend#684), plus the job id so two
    deployments sharing a node's /dev/shm never collide (newer python_backend releases also randomise region names,
    triton-inference-server/python_backend#351; the prefix is cheap insurance).
    Job ids keep letters, digits and '-' only, so no rank's prefix starts another's (`prefix1_7_` vs `prefix1_70_`)."""
    return _prefix(rank, re.sub(r"[^A-Za-z0-9-]", "-", job_id))


def _prefix(rank: int | str, job: str) -> str:
    return f"prefix{rank}_{job}_"


def shm_glob_shell(rank: int, job_variable: str = "${JOB_ID}") -> str:
    """The rank's regions as a shell glob, the job id left to the shell (the `.sub`'s backstop after a replica
    ended: it removes what a rank killed with its launcher left; Slurm's ids and the local executor's `local-<hex>`
    need no sanitising)."""
    return f"{SHM_DIR}/{_prefix(rank, job_variable)}*"
