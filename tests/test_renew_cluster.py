"""Renewal on the real Slurm test cluster (spec `renew:`, launcher/jobscript/renew.py): 3-minute jobs, a 2-minute lead
(each successor is submitted a minute after its predecessor started, and has a minute and a half to be READY before
the predecessor's ordered stop: room on a machine as busy as CI's), and a 30-second drain.

It takes minutes (Slurm's time limits are whole minutes), so one module-scoped run does everything once, and
the tests below each assert a part of it:

- deployment `renew` (the llmapi workflow, the default: each handover stops its job once the replicas' metrics
  read nothing in flight, the engine's count and hpc-serve's model's own, or at the drain time): A → B → C, two handovers, while two clients send requests through `hpc-serve gateway`
  without a pause (the `openai` package, retries off; one plain, one streaming): none fails, each job serves
  some, A and B end COMPLETED (not TIMEOUT), the chain is linked both ways and `status SPEC` shows it, and
  `cancel SPEC` ends the chain with nothing more submitted.
- deployment `renewq` (the engine workflow's ensemble), beside it, with `--dependency=singleton` (a successor cannot start while its predecessor
  runs): its successor pends, `status` says why, and `cancel SPEC` stops the pending successor too.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpc.scheduler.index import find_job
from hpc.serving.deployment import job_of_key
from launcher.contracts.job_index import parse_entry
from launcher.contracts.layout import JobPaths
from launcher.contracts.records import read_chain, read_endpoints
from launcher.contracts.slurm import parse_slurm_time
from tests.e2e import (
    cli,
    gateway_process,
    job_token,
    kill_quietly,
    private_job_index,
    processes_under,
    submit,
    wait_for,
    write_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timelimit, pytest.mark.timeout(900)]

SLURM = {"time": "00:03:00"}
RENEW = {"before": "2m", "drain": "30s"}


@dataclass
class Outcome:
    at: float
    job: str = ""
    error: str = ""
    stream: bool = False


@dataclass
class Run:
    """What the module's one run saw."""

    jobs: list[str] = field(default_factory=list)  # A, B, C of `renew`
    folder: Path = Path()
    outcomes: list[Outcome] = field(default_factory=list)
    ready_at: dict[str, float] = field(default_factory=dict)  # job → its replica's ready_at
    status_text: str = ""
    cancel_text: str = ""
    sacct: dict[str, tuple[str, float]] = field(default_factory=dict)  # job → (state, end)
    after_cancel: list[str] = field(default_factory=list)  # job folders of both deployments, once all ended
    folders_at_cancel: list[str] = field(default_factory=list)
    pending: dict[str, str] = field(default_factory=dict)  # renewq: first, successor, status text, cancel text


def _clients(url: str, token: str | None, name: str, stop: threading.Event, outcomes: list[Outcome]) -> list:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=token or "none", max_retries=0, timeout=60)

    def loop(stream: bool) -> None:
        while not stop.is_set():
            outcome = Outcome(time.time(), stream=stream)
            try:
                raw = client.completions.with_raw_response.create(
                    model=name, prompt="Once upon a time", max_tokens=24 if stream else 6, stream=stream
                )
                # the replica's key names its job as the index does (`33@hpcserve/0`): its id
                outcome.job = parse_entry(job_of_key(raw.headers.get("x-hpc-serve-replica", "")))[0]
                parsed = raw.parse()
                if stream:
                    assert "".join(c.choices[0].text for c in parsed if c.choices)
            except Exception as exc:  # noqa: BLE001 - every failure is counted, whatever it is
                outcome.error = repr(exc)[:300]
            outcomes.append(outcome)

    return [threading.Thread(target=loop, args=(stream,), daemon=True) for stream in (False, True)]


def _queued() -> str | None:
    """squeue's ids of the jobs of both deployments (pending or running); None when squeue failed, which says
    nothing about what is queued (an empty answer of a failed squeue is not "none")."""
    out = subprocess.run(["squeue", "-h", "-n", "renew,renewq", "-o", "%i"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def _sacct(jobs: list[str]) -> dict[str, tuple[str, float]]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", ",".join(jobs), "-o", "JobID,State,End"], capture_output=True, text=True
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
    return {job: (state.split()[0], parse_slurm_time(end) or 0.0) for job, state, end in rows}


def _chain(deploy_dir: Path, job: str):
    return read_chain(JobPaths(deploy_dir, job))


def _folders(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("runs/*/jobs/*"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, slurm_cluster, tritonserver, tiny_gpt2) -> Run:
    folder = tmp_path_factory.mktemp("renew")
    with private_job_index(folder):
        spec = write_spec(folder, "renew", tiny_gpt2, slurm=SLURM, renew=RENEW, workflow="llmapi")
        specq = write_spec(
            folder, "renewq", tiny_gpt2, slurm={**SLURM, "sbatch_args": ["--dependency=singleton"]}, renew=RENEW
        )
        result = Run(folder=folder)
        stop = threading.Event()
        try:
            first_q = cli("submit", str(specq)).stdout.split()[0]
            a, a_dir = submit(spec)
            deploy = a_dir.parent.parent
            result.jobs.append(a)
            with gateway_process(str(spec), folder / "gateway.log") as (_, record):
                threads = _clients(record.url, job_token(a), "renew", stop, result.outcomes)
                for thread in threads:
                    thread.start()
                # renewq: its successor is submitted at its first job's 1-minute mark, and pends (singleton)
                q_dir = find_job(first_q).deploy_dir  # its index entry names the cluster too
                successor_q = wait_for(lambda: (r := _chain(q_dir, first_q)) and r.successor, 120, "renewq's successor")
                result.pending = {"first": first_q, "successor": successor_q}
                result.pending["status"] = wait_for(
                    lambda: "pending: Dependency" in (t := cli("status", str(specq), check=False).stdout) and t,
                    30,
                    "status to say why renewq's successor pends",
                )
                result.pending["cancel"] = cli("cancel", str(specq)).stdout

                # renew: A → B → C, each handover once the successor is READY
                def chain_moves():
                    job = result.jobs[-1]
                    for e in read_endpoints(JobPaths(deploy, job)):
                        result.ready_at.setdefault(job, e.ready_at)
                    record = _chain(deploy, job)
                    if record is not None and record.successor and len(result.jobs) < 3:
                        result.jobs.append(record.successor)
                    return len(result.jobs) == 3 and result.jobs[-1] in result.ready_at

                wait_for(chain_moves, 300, "two renewals (A → B → C, C READY)", interval=0.2)
                wait_for(
                    lambda: (
                        all(s in ("COMPLETED", "FAILED", "TIMEOUT") for s, _ in _sacct(result.jobs[:2]).values())
                        and len(_sacct(result.jobs[:2])) == 2
                    ),
                    120,
                    "A and B to end",
                )
                # C serves alone for a moment: the last requests of the run go to it (or one fails: stop there)
                c, alone = result.jobs[-1], len(result.outcomes)
                wait_for(
                    lambda: (
                        sum(o.job == c and not o.error for o in result.outcomes[alone:]) >= 4
                        or any(o.error for o in result.outcomes[alone:])
                    ),
                    120,
                    f"requests served by {c} alone",
                )
                stop.set()
                for thread in threads:
                    thread.join(90)
                result.status_text = cli("status", str(spec)).stdout
            result.folders_at_cancel = _folders(folder)
            result.cancel_text = cli("cancel", str(spec)).stdout
            # nothing can submit a job any more once no process of either deployment is left (a renewer runs in
            # its job's batch script) and no job of theirs is queued: then the folders are final
            wait_for(
                lambda: not processes_under(folder) and _queued() == "", 120, "every job of both deployments to end"
            )
            result.after_cancel = _folders(folder)
            result.sacct = _sacct(result.jobs + [first_q, result.pending["successor"]])
            yield result
        finally:
            stop.set()
            out = subprocess.run(["squeue", "-h", "-n", "renew,renewq", "-o", "%i"], capture_output=True, text=True)
            for job in out.stdout.split():
                subprocess.run(["scancel", job], capture_output=True)
            kill_quietly(pid for pid, _ in processes_under(folder))


def _handed_over(run: Run) -> None:
    """Each successor started while its predecessor still ran. On a cluster that other jobs fill, one may have
    waited in the queue past its predecessor's end (that job then served to its end, and requests sent in the gap
    fail): say so, rather than report it as a failed handover."""
    for p in map(Path, run.folders_at_cancel):
        record = _chain(p.parent.parent, p.name) if p.name in run.jobs else None
        if record is not None and "still PENDING" in record.note:
            pytest.fail(f"the test cluster was busy: job {p.name}: {record.note}; run again on an idle cluster")


def test_no_request_fails_across_two_handovers(run):
    _handed_over(run)
    failed = [o for o in run.outcomes if o.error]
    served = {job: sum(1 for o in run.outcomes if o.job == job and not o.error) for job in run.jobs}
    streams = sum(1 for o in run.outcomes if o.stream and not o.error)
    print(f"\nrequests: {len(run.outcomes)} sent ({streams} streamed), {len(failed)} failed; served by job: {served}")
    assert not failed, failed[:5]
    assert all(served.values()), f"every job of the chain serves some requests: {served}"


def test_predecessors_end_completed_after_handing_over(run):
    _handed_over(run)
    a, b, c = run.jobs
    assert run.sacct[a][0] == "COMPLETED" and run.sacct[b][0] == "COMPLETED", run.sacct
    for job, successor in ((a, b), (b, c)):
        record = next(_chain(p.parent.parent, job) for p in map(Path, run.folders_at_cancel) if p.name == job)
        assert record.successor == successor and record.stopped_at, record
        assert record.note.startswith(f"handed over to {successor}"), record
        ready, ended = run.ready_at[successor], run.sacct[job][1]
        print(
            f"\nhandover {job} → {successor}: successor submitted → READY {ready - record.submitted_at:.1f} s, "
            f"READY → predecessor's stop {record.stopped_at - ready:.1f} s, READY → predecessor ended "
            f"{ended - ready:.1f} s (its time limit was {record.ends_at - ended:.1f} s later)"
        )
        assert record.handover_at >= ready and ended < record.ends_at


def test_chain_is_linked_both_ways_and_status_shows_it(run):
    a, b, c = run.jobs
    records = {p.name: _chain(p.parent.parent, p.name) for p in map(Path, run.folders_at_cancel) if p.name in run.jobs}
    assert [records[j].index for j in (a, b, c)] == [1, 2, 3], records
    assert (records[b].predecessor, records[c].predecessor) == (a, b), records
    assert re.search(rf"^\s+{a}\s+COMPLETED\s+\S+ \S+\s+\S+ \S+\s+{b} COMPLETED$", run.status_text, re.M), (
        run.status_text
    )
    assert re.search(rf"^\s+{b}\s+COMPLETED\s+\S+ \S+\s+\S+ \S+\s+{c} READY$", run.status_text, re.M), run.status_text
    assert re.search(rf"^\s+{c}\s+READY\s+\S+ \S+\s+\S+ \S+\s+-$", run.status_text, re.M), run.status_text


#: Slurm's word for a serving job that `hpc-serve cancel` stopped: its ranks stop in order by themselves, then a
#: plain scancel ends what is left; when the batch script ended first (seen with two busy loops on the 2 cores),
#: Slurm records COMPLETED. hpc-serve's own state is CANCELLED either way (the cancel marker), which `cancel` prints.
STOPPED_BY_CANCEL = ("CANCELLED", "COMPLETED")


def test_pending_successor_is_explained_and_cancelled_with_its_deployment(run):
    first, successor = run.pending["first"], run.pending["successor"]
    assert f"successor {successor} pending: Dependency; {first} serves until its end" in run.pending["status"]
    assert run.sacct[successor][0] == "CANCELLED" and run.sacct[first][0] in STOPPED_BY_CANCEL, run.sacct
    assert f"{successor} CANCELLED" in run.pending["cancel"] and f"{first} CANCELLED" in run.pending["cancel"]


def test_cancel_of_the_deployment_ends_the_chain_and_submits_nothing(run):
    c = run.jobs[-1]
    assert run.sacct[c][0] in STOPPED_BY_CANCEL, run.sacct
    assert f"{c} CANCELLED" in run.cancel_text, run.cancel_text
    assert run.after_cancel == run.folders_at_cancel, "a job was submitted after the cancel"
    out = subprocess.run(["squeue", "-h", "-n", "renew,renewq", "-o", "%i %T"], capture_output=True, text=True)
    assert not out.stdout.strip(), out.stdout
