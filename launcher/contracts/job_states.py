"""The states hpc-serve reads a job as: Slurm's words for where a job is in its life, and hpc-serve's own for what
a running job's records say (STARTING, READY, BUILDING) and for a stop under way (CANCELLING, STOPPING).

Standard library only, Python 3.10: the login side (`status`, `wait`, the watcher) and the renewer inside a job
(launcher/jobscript/renew.py) read the same words. A member is the word itself (`JobState.READY == "READY"`, and
`str`, f-strings and JSON give the bare word), so every record and `status --json` say what they said before.
"""

from __future__ import annotations

from launcher.contracts.text_enum import TextEnum


class JobState(TextEnum):
    """A job's state as `hpc-serve status` shows it (hpc/jobs/kinds.py has the state machine)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"  # the scheduler's word, before a job kind reads its records
    STARTING = "STARTING"
    READY = "READY"
    BUILDING = "BUILDING"
    CANCELLING = "CANCELLING"
    STOPPING = "STOPPING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    UNKNOWN = "UNKNOWN"  # nothing could tell (the scheduler does not know the job, or could not be asked)


#: the end states, as hpc-serve names them: a job in one of these does not leave it
TERMINAL: tuple[JobState, ...] = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)
#: Slurm's raw word for a job that ended whose processes are still being killed (squeue's COMPLETING)
COMPLETING = "COMPLETING"
