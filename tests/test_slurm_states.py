"""One set of end states, read by every user (launcher/contracts/slurm.py: `TERMINAL_RAW`, Slurm's words, and `TERMINAL`,
hpc-serve's): a reader whose list lacked one (REVOKED, say) would keep a predecessor waiting for a successor Slurm
revoked until the time limit. Here every reader is asked about every end state: a serving,
build and gateway job's status, the watcher's cache, the renewer's successor check and the cluster tests'
wait; and no other module may spell one of Slurm's own end words."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from hpc.jobs.executors import SlurmExecutor
from hpc.jobs.kinds import KINDS, JobKind
from hpc.jobs.status import SUMMARIES, JobStatus
from hpc.jobs.track import job_status
from hpc.scheduler import slurm
from hpc.scheduler import watch as slurm_watch
from hpc.scheduler.index import JobRef
from hpc.scheduler.watch import SlurmWatcher
from launcher.contracts.job_states import JobState
from launcher.contracts.layout import JobPaths
from launcher.contracts.slurm import STATE_CLASS, TERMINAL, TERMINAL_RAW, Result, Slurm, ended, state_class
from launcher.jobscript import renew
from tests.cluster_smoke import cluster_smoke_helpers
from tests.plans import write_plan

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parent.parent
END_STATES = sorted(TERMINAL_RAW)
#: Slurm's end words that are no hpc-serve state: only launcher/contracts/slurm.py may name them
SLURM_ONLY = sorted(TERMINAL_RAW - set(TERMINAL))


def test_what_the_end_states_are():
    assert {"REVOKED", "NODE_FAIL", "PREEMPTED", "DEADLINE", "OUT_OF_MEMORY", "BOOT_FAIL"} <= TERMINAL_RAW
    assert ended("CANCELLED by 0") and state_class("CANCELLED by 0") == "CANCELLED"
    for waiting in ("PENDING", "SUSPENDED", "REQUEUE_HOLD", "CONFIGURING", "RUNNING", "COMPLETING", "UNKNOWN", ""):
        assert not ended(waiting), waiting
    assert state_class("UNKNOWN") == "UNKNOWN" and state_class("") == ""


def _job(tmp_path: Path, kind: type[JobKind]) -> JobRef:
    """A job folder of a deployment whose spec loads (a gateway job's state reads it), marked as `kind`'s."""
    deploy = tmp_path / "deploy"
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir(exist_ok=True)
    spec = {
        "name": "st",
        "workdir": str(tmp_path),
        "model": {"backend": "cpu", "workflow": "engine", "checkpoint_dir": str(checkpoint)},
    }
    paths = JobPaths(deploy, "4242").create()
    (deploy / "spec.yaml").write_text(yaml.safe_dump(spec))
    write_plan(deploy)
    kind.mark(paths)
    return JobRef("4242", paths.folder)


@pytest.mark.parametrize("kind", KINDS, ids=[kind.kind for kind in KINDS])
@pytest.mark.parametrize("raw", END_STATES)
def test_a_job_in_an_end_state_is_done(tmp_path, monkeypatch, kind, raw):
    """`status`, `wait` and the API stop at it, whatever the job's kind."""
    monkeypatch.setattr(SlurmExecutor, "scheduler_state", lambda self, ref: (raw, None))
    status = job_status(_job(tmp_path, kind))
    assert status.done and status.state == STATE_CLASS[raw], (status.state, status.reason)


@pytest.mark.parametrize("raw", END_STATES)
def test_the_watcher_asks_no_more_about_a_job_in_an_end_state(raw):
    asked: list[list[str]] = []

    def cluster(argv, timeout, **_):  # sacct knows job 7 (ended) and 8 (running); squeue lists neither
        asked.append(list(argv))
        if argv[0] != "sacct":
            return Result(1, "", "slurm_load_jobs error: Invalid job id specified")
        ids = argv[argv.index("-j") + 1].split(",")
        return Result(0, "".join(f"{j}|{ {'7': raw, '8': 'RUNNING'}[j] }\n" for j in ids), "")

    watcher = SlurmWatcher(slurm.Slurm(runner=cluster), clock=lambda: 0.0)
    watcher.watch("7", "8")
    assert watcher.state("7")[0] == raw
    assert any("7" in argv for argv in asked)
    del asked[:]
    watcher.arm("8")
    assert watcher.state("8")[0] == "RUNNING"
    assert asked and not any("7" in ",".join(argv) for argv in asked), asked


@pytest.mark.parametrize("raw", END_STATES)
def test_the_renewer_gives_up_on_a_successor_in_an_end_state(tmp_path, monkeypatch, raw):
    """squeue lists a job for MinJobAge after its end: the successor will not serve, the job serves to its end."""
    squeue = tmp_path / "squeue"
    squeue.write_text(f'#!/bin/bash\necho "9|{raw}|None"\n')
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    state = renew.job_state("9")
    assert state == (raw, "") and renew.gone_or_ended(state)
    assert not renew.gone_or_ended(("PENDING", "Resources"))


def test_the_cluster_tests_wait_for_the_same_end_states():
    assert cluster_smoke_helpers.ended is ended


def test_no_other_module_names_a_slurm_end_state():
    """A list of end states written anywhere else would be a sixth one, free to miss a word again."""
    word = re.compile(r"\b(" + "|".join(SLURM_ONLY) + r")\b")
    found = []
    for folder in ("hpc", "launcher", "backend", "tests/cluster_smoke"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".j2", ".sh") and path != ROOT / "launcher" / "contracts" / "slurm.py":
                found += [f"{path.relative_to(ROOT)}: {m.group(1)}" for m in word.finditer(path.read_text())]
    assert found == []


def test_renewer_and_login_side_share_the_gateway():
    """hpc.scheduler.slurm's gateway is the launcher's, with the cluster's name on top: one retry and job-gone rule."""
    assert issubclass(slurm.Slurm, Slurm) and slurm.ended is ended and slurm.TERMINAL is TERMINAL
    assert isinstance(renew.SLURM, Slurm) and slurm_watch.ended is ended


def test_a_job_state_reads_as_its_word():
    """`JobState` members are the words themselves: compared with, printed, formatted and written to JSON
    (`status --json`, the records) as before they were members."""
    status = JobStatus("7", JobState.READY, kind="gateway", url="http://node1:8000")
    assert status.state == "READY" and str(status.state) == f"{status.state}" == "READY"
    assert json.loads(json.dumps(status.to_json()))["state"] == "READY"
    assert state_class("CANCELLED by 0") is JobState.CANCELLED and state_class("UNKNOWN") == "UNKNOWN"
    assert all(isinstance(state, JobState) for state in (*STATE_CLASS.values(), *TERMINAL))


def test_every_job_kind_words_its_own_summary():
    """`JobStatus.summary` is its kind's (`JobKind.describe`), for every kind there is."""
    assert {kind.kind for kind in KINDS} <= set(SUMMARIES)
    assert JobStatus("7", JobState.READY, kind="gateway", url="http://node1:8000").summary() == (
        "7 READY (gateway) http://node1:8000"
    )
    assert JobStatus("8", JobState.BUILDING, "step 1 (trtllm-build)", kind="build").summary() == (
        "8 BUILDING (build) step 1 (trtllm-build)"
    )
    assert (
        JobStatus("9", JobState.STOPPING).summary() == "9 STOPPING (the job is ending; Slurm is stopping its processes)"
    )
