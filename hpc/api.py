"""The Python API: what the CLI does, for notebooks and scripts.

from hpc.api import Job, submit
job = submit("configs/tiny-cpu.yaml", executor="local")
job.wait()                       # READY, or raises JobFailed naming the rank
print(job.client().generate("Hello", max_tokens=16))
job.cancel()

Job("1234").status().state       # any job, from its id alone
"""

from __future__ import annotations

from pathlib import Path

from hpc.client import Client, Endpoint, job_endpoints
from hpc.jobs.executors import watch
from hpc.jobs.status import JobStatus
from hpc.jobs.track import job_status, wait
from hpc.scheduler.index import JobRef, find_job
from launcher.contracts.config import CANCEL_GRACE_S


class JobFailed(RuntimeError):
    """The job ended (FAILED, CANCELLED, TIMEOUT) or did not become READY in time."""

    def __init__(self, status: JobStatus):
        self.status = status
        super().__init__(status.summary())


class Job:
    """A submitted deployment, found from its id (or job folder) alone."""

    def __init__(self, job: str | JobRef):
        self.ref = job if isinstance(job, JobRef) else find_job(job)
        watch([self.ref])  # many Job objects, one sacct per refresh for all of them

    @property
    def job_id(self) -> str:
        return self.ref.job_id

    def status(self) -> JobStatus:
        return job_status(self.ref)

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until READY; raise JobFailed if the job ends first or the timeout passes."""
        status = wait(self.ref, until=("READY",), timeout=timeout)
        if status.state != "READY":
            raise JobFailed(status)
        return status

    def endpoints(self) -> list[Endpoint]:
        return job_endpoints(self.ref)

    def client(self, replica: int | None = None, model: str | None = None) -> Client:
        """A client of the job's deployment (its gateway, or every ready replica); `replica`: only that one."""
        return Client.from_job(self.ref, replica=replica, model=model)

    def cancel(self, grace_s: float = CANCEL_GRACE_S) -> JobStatus:
        """Ordered stop, then scancel, then wait for the end: the same `hpc.jobs.track.cancel` as the CLI's."""
        from hpc.jobs.track import cancel

        return cancel(self.ref, grace_s)

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, folder={str(self.ref.job_dir)!r})"


def submit(spec: str | Path, executor: str | None = None) -> Job:
    """Validate, render and submit a spec file (raises hpc.spec.SpecError listing every problem)."""
    from hpc.doctor.preflight import check_before_submit
    from hpc.jobs.submit import submit as submit_spec
    from hpc.spec import load_spec

    loaded = load_spec(spec)
    check_before_submit(loaded, executor)  # a job Slurm would queue and never start: SpecError, none submitted
    return Job(submit_spec(loaded, executor=executor))
