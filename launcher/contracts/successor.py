"""What a renewer asks Slurm of its own job and of the successor it submitted, and at what pace: the same for
a serving job's renewer (launcher/jobscript/renew.py, inside the job) and a gateway job's (hpc/jobs/renewal.py,
in the gateway process), so both read a successor's state and their job's end alike.

Standard library only, Python 3.10: the renewer runs from the copy render put in ``D/python``.
"""

from __future__ import annotations

import sys
import time

from launcher.contracts.slurm import Slurm, SlurmError, ended

#: how often the job's end is read again (a time limit an admin changed is picked up within this)
END_REFRESH_S = 60.0
#: how often the successor's scheduler state is asked for while it is not READY
SUCCESSOR_STATE_S = 5.0
#: a failed sbatch is tried again this long after
SBATCH_RETRY_S = 30.0
#: successors a job submits at most when each ends before it is READY (a rank that died while loading: seen once
#: in 1,836 tests under load, tritonserver 2.51's python backend aborting on `boost::interprocess::lock_exception`,
#: a known intermittent crash); the job serves on meanwhile, and another successor may still take over in time
SUCCESSOR_ATTEMPTS = 3
#: each try of a question or a signal: with the retries of transient trouble (1 s, 2 s apart), one call stays
#: within about the sbatch timeout, so that a renewer still starts the ordered stop on time
QUERY_TIMEOUT_S = 10.0
#: job_state's word for a job squeue no longer lists (it ended more than MinJobAge ago, or never was)
NOT_LISTED = "GONE"


def log(msg: str) -> None:
    """To the batch script's stderr (``D/logs/<job>.err``), with a prefix and the time."""
    print(f"[hpc-serve renew {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def job_times(slurm: Slurm, job_id: str) -> tuple[float | None, float | None]:
    """(start, end) of a job as Slurm says now; None for what it cannot tell (a failure is logged)."""
    try:
        return slurm.job_times(job_id)
    except SlurmError as exc:
        log(str(exc))
        return None, None


def job_state(slurm: Slurm, job_id: str) -> tuple[str, str]:
    """(state, reason) as squeue says; ("", "") when it could not be asked, (NOT_LISTED, "") when it no longer
    lists the job."""
    try:
        listed = slurm.squeue([job_id])
    except SlurmError:
        return "", ""
    state, reason = listed.get(job_id, (NOT_LISTED, None))
    return state, reason or ""


def gone_or_ended(state: tuple[str, str]) -> bool:
    """Whether a job_state says the job will not serve: squeue no longer lists it, or lists it in an end state."""
    return state[0] == NOT_LISTED or ended(state[0])


def described(state: tuple[str, str]) -> str:
    """`PENDING (Resources)`: a job_state as the log and chain.json's note say it."""
    return state[0] + (f" ({state[1]})" if state[1] else "")
