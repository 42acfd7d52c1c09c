"""launcher/contracts/slurm.py and hpc/scheduler/slurm.py (the gateway for Slurm commands, both sides) and hpc/scheduler/watch.py (polite,
shared polling). The end states every reader shares: tests/test_slurm_states.py.

The gateway is tested with fake commands on PATH (timeouts, errors, retries); the watcher with a fake command
runner and a fake clock: a minute of watching 20 jobs takes no real minute, and every scheduler call is
counted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest

from hpc.jobs import track
from hpc.jobs.executors import watch
from hpc.jobs.track import job_status, wait
from hpc.scheduler import slurm
from hpc.scheduler import watch as slurm_watch
from hpc.scheduler.index import JobRef
from hpc.scheduler.slurm import Result, Slurm, SlurmError, SlurmNotInstalled, SlurmTimeout
from hpc.scheduler.watch import SlurmWatcher
from launcher.contracts.layout import JobPaths
from tests.plans import write_plan

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------------------------------------------------
# the gateway, with fake commands on PATH


def fake_command(bin_dir: Path, name: str, body: str) -> None:
    """A bash script `name` on the test's PATH; `$COUNT` is how many times it ran before this call."""
    bin_dir.mkdir(exist_ok=True)
    counter = bin_dir / f"{name}.count"
    (bin_dir / name).write_text(
        f"#!/bin/bash\nCOUNT=$(cat {counter} 2>/dev/null || echo 0)\necho $((COUNT + 1)) > {counter}\n{body}\n"
    )
    (bin_dir / name).chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", f"{path}:{os.environ['PATH']}")
    return path


class Sleeps(list):
    """Records the gateway's back-off instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def test_an_error_carries_the_command_its_exit_code_and_stderr(bin_dir):
    fake_command(bin_dir, "sbatch", 'echo "sbatch: error: invalid partition specified: nope" >&2; exit 1')
    gateway = Slurm(sleep=Sleeps())
    with pytest.raises(SlurmError) as err:
        gateway.sbatch(Path("/d/job.sub"))
    assert err.value.argv == ("sbatch", "--parsable", "/d/job.sub") and err.value.returncode == 1
    assert str(err.value) == (
        "`sbatch --parsable /d/job.sub` exited with 1: sbatch: error: invalid partition specified: nope"
    )
    assert gateway.calls["sbatch"] == 1, "a refusal is not retried"


@pytest.mark.slow
def test_a_command_that_hangs_times_out(bin_dir):
    fake_command(bin_dir, "squeue", "exec sleep 30")
    sleeps = Sleeps()
    gateway = Slurm(sleep=sleeps, timeout_s=0.2, attempts=2)
    with pytest.raises(SlurmTimeout) as err:
        gateway.squeue(["7"])
    assert "`squeue -h -j 7 -o %i|%T|%r` did not answer within 0.2 s" in str(err.value)
    assert gateway.calls["squeue"] == 2 and sleeps == [1.0], "a query that timed out is asked again"


def test_sbatch_that_timed_out_is_not_repeated(bin_dir):
    """It may have queued the job: a second sbatch would queue another."""
    fake_command(bin_dir, "sbatch", "exec sleep 30")
    gateway = Slurm(sleep=Sleeps(), timeout_s=0.2)
    with pytest.raises(SlurmTimeout):
        gateway.sbatch(Path("job.sub"))
    assert gateway.calls["sbatch"] == 1


def test_transient_controller_trouble_is_retried_with_back_off(bin_dir):
    fake_command(
        bin_dir,
        "squeue",
        """if [ "$COUNT" -lt 2 ]; then
  echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2; exit 1
fi
echo "7|PENDING|Priority"
""",
    )
    sleeps = Sleeps()
    gateway = Slurm(sleep=sleeps)
    assert gateway.squeue(["7"]) == {"7": ("PENDING", "Priority")}
    assert gateway.calls["squeue"] == 3 and sleeps == [1.0, 2.0]


def test_transient_trouble_that_lasts_fails_after_the_last_attempt(bin_dir):
    fake_command(
        bin_dir, "sacct", 'echo "sacct: error: Unable to contact slurm controller (connect failure)" >&2; exit 1'
    )
    gateway = Slurm(sleep=Sleeps(), attempts=3)
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        gateway.sacct_states(["7"])
    assert gateway.calls["sacct"] == 3


@pytest.mark.parametrize(
    "stderr, calls",
    [
        ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)", 3),
        ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", 1),
    ],
)
def test_sbatch_is_repeated_only_when_the_controller_was_never_reached(bin_dir, stderr, calls):
    fake_command(bin_dir, "sbatch", f'echo "{stderr}" >&2; exit 1')
    gateway = Slurm(sleep=Sleeps())
    with pytest.raises(SlurmError):
        gateway.sbatch(Path("job.sub"))
    assert gateway.calls["sbatch"] == calls


def test_a_job_slurm_does_not_know_is_an_answer_not_an_error(bin_dir):
    fake_command(bin_dir, "squeue", 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1')
    fake_command(
        bin_dir, "scancel", 'echo "scancel: error: Kill job error on job id 7: Invalid job id specified" >&2; exit 1'
    )
    gateway = Slurm(sleep=Sleeps())
    assert gateway.squeue(["7"]) == {}
    assert gateway.scancel("7", signal="TERM") is False
    assert gateway.calls == {"squeue": 1, "scancel": 1}, "not retried"


def test_sbatch_runs_in_the_environment_and_folder_it_is_given(bin_dir, tmp_path):
    """The renewer submits its successor with its own job's variables taken out, from the deployment folder."""
    seen = tmp_path / "seen"
    fake_command(bin_dir, "sbatch", f'echo "$HPC_SERVE_PREDECESSOR $PWD" > {seen}; echo "12;hpcserve"')
    env = {"PATH": os.environ["PATH"], "HPC_SERVE_PREDECESSOR": "7"}
    assert Slurm().sbatch(Path("job.sub"), env=env, cwd=str(tmp_path)) == "12"
    assert seen.read_text().split() == ["7", str(tmp_path)]


def test_sbatch_that_names_no_job_fails(bin_dir):
    fake_command(bin_dir, "sbatch", "exit 0")
    with pytest.raises(SlurmError, match="printed no job id"):
        Slurm(sleep=Sleeps()).sbatch(Path("job.sub"))


def test_a_jobs_start_and_end_and_none_for_a_job_gone(bin_dir):
    fake_command(
        bin_dir,
        "squeue",
        """case "$3" in
  7) echo "2031-05-01T12:00:00|2031-05-01T14:00:00";;
  8) echo "N/A|2031-05-01T14:00:00";;
  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1;;
esac""",
    )
    start, end = datetime(2031, 5, 1, 12).timestamp(), datetime(2031, 5, 1, 14).timestamp()
    gateway = Slurm(sleep=Sleeps())
    assert gateway.job_times("7") == (start, end) and gateway.job_times("8") == (None, end)
    assert gateway.job_times("9") == (None, None) and gateway.calls["squeue"] == 3, "a job gone is not retried"


def test_a_missing_command_says_so(bin_dir, monkeypatch):
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(SlurmNotInstalled, match="`sacct .*` failed: not found on PATH"):
        Slurm().sacct_states(["7"])


# ---------------------------------------------------------------------------------------------------------
# the watcher, with a fake cluster and a fake clock


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeCluster:
    """Answers sacct, squeue and scontrol from `sacct` / `queue` tables and records every command."""

    def __init__(self) -> None:
        self.sacct: dict[str, str] = {}
        self.queue: dict[str, tuple[str, str]] = {}
        self.commands: list[list[str]] = []

    def count(self, name: str) -> int:
        return sum(1 for argv in self.commands if argv[0] == name)

    def __call__(self, argv: Sequence[str], timeout: float, **_: object) -> Result:
        self.commands.append(list(argv))
        if argv[0] == "sacct":
            ids = argv[argv.index("-j") + 1].split(",")
            return Result(0, "".join(f"{j}|{self.sacct[j]}\n" for j in ids if j in self.sacct), "")
        if argv[0] == "squeue":
            ids = [j for j in argv[argv.index("-j") + 1].split(",") if j in self.queue]
            if not ids:
                return Result(1, "", "slurm_load_jobs error: Invalid job id specified")
            return Result(0, "".join(f"{j}|{self.queue[j][0]}|{self.queue[j][1]}\n" for j in ids), "")
        if argv[0] == "scontrol":
            return Result(1, "", "slurm_load_jobs error: Invalid job id specified")
        raise AssertionError(f"unexpected command {argv}")


@pytest.fixture
def cluster(monkeypatch) -> tuple[FakeCluster, Clock]:
    """The fake cluster behind `hpc.scheduler.slurm.default`, and a fresh process watcher on a fake clock."""
    fake, clock = FakeCluster(), Clock()
    monkeypatch.setattr(slurm, "default", Slurm(runner=fake, sleep=clock.sleep))
    monkeypatch.setattr(slurm_watch, "shared", SlurmWatcher(clock=clock.monotonic))
    monkeypatch.setattr(track, "time", clock)
    return fake, clock


def make_job(root: Path, job_id: str) -> JobRef:
    deploy = root / f"deploy-{job_id}"
    JobPaths(deploy, job_id).create()
    write_plan(deploy, world_size_per_replica=2)
    return JobRef(job_id, JobPaths(deploy, job_id).folder)


@pytest.mark.slow
def test_watching_20_jobs_for_a_minute_makes_a_bounded_number_of_scheduler_calls(tmp_path, cluster):
    """A dashboard asking for the status of 20 pending jobs every second for a minute (`hpc-serve list` and
    `hpc.api.Job` register their jobs first): the watcher asks Slurm about all of them at once, at 0, 3, 7, 15
    and 31 s (submitit's 2, 4, 8 … s schedule), not 20 x 60 times."""
    fake, clock = cluster
    refs = [make_job(tmp_path, str(100 + i)) for i in range(20)]
    for ref in refs:
        fake.sacct[ref.job_id] = "PENDING"
        fake.queue[ref.job_id] = ("PENDING", "Priority")
    watch(refs)
    start = clock.now
    while clock.now - start < 60:
        assert {job_status(ref).summary() for ref in refs} == {f"{r.job_id} PENDING (Priority)" for r in refs}
        clock.sleep(1.0)
    sacct, squeue = fake.count("sacct"), fake.count("squeue")
    print(f"\n20 jobs, 60 s, 1 Hz status each: {sacct} sacct + {squeue} squeue calls (was 1200 + 1200)")
    assert (sacct, squeue) == (5, 5)
    assert fake.count("scontrol") == 0
    assert all(len(argv[argv.index("-j") + 1].split(",")) == 20 for argv in fake.commands), "one call for all"


def test_a_wait_on_a_pending_job_backs_off(tmp_path, cluster, monkeypatch):
    """`hpc-serve wait` on a job that stays PENDING for a minute: the job folder is read at 1 s, then ever
    more slowly (at most every 5 s); Slurm is asked at the watcher's pace."""
    fake, clock = cluster
    ref = make_job(tmp_path, "7")
    fake.sacct["7"], fake.queue["7"] = "PENDING", ("PENDING", "Priority")
    polls: list[float] = []
    real_status = track.job_status
    monkeypatch.setattr(track, "job_status", lambda r: polls.append(clock.now) or real_status(r))
    status = wait(ref, timeout=60)
    print(f"\nwait: {len(polls)} polls, {fake.count('sacct')} sacct + {fake.count('squeue')} squeue calls in 60 s")
    assert status.state == "PENDING"
    gaps = [b - a for a, b in pairwise(polls)]
    assert gaps[0] == 1.0 and max(gaps) == 5.0 and gaps == sorted(gaps), gaps
    assert fake.count("sacct") <= 6 and fake.count("squeue") <= 6


def test_arm_makes_the_next_status_ask_at_once(tmp_path, cluster):
    """What the user did (submit, cancel) is seen at once, not at the next scheduled refresh."""
    fake, clock = cluster
    fake.sacct["7"], fake.queue["7"] = "RUNNING", ("RUNNING", "None")
    watcher = slurm_watch.watcher()
    assert watcher.state("7") == ("RUNNING", None)
    clock.sleep(0.5)
    fake.sacct["7"] = "CANCELLED"
    del fake.queue["7"]
    assert watcher.state("7") == ("RUNNING", None), "cached: the next refresh is not due yet"
    watcher.arm("7")
    assert watcher.state("7") == ("CANCELLED", None)


def test_an_ended_job_is_cached_and_never_asked_about_again(tmp_path, cluster):
    fake, clock = cluster
    fake.sacct.update({"7": "COMPLETED", "8": "RUNNING"})
    watcher = slurm_watch.watcher()
    watcher.watch("7", "8")
    assert watcher.state("7") == ("COMPLETED", None)
    for _ in range(120):
        clock.sleep(1.0)
        watcher.state("8")
    assert fake.count("sacct") > 2 and all(
        "7" not in argv[argv.index("-j") + 1].split(",") for argv in fake.commands[1:] if argv[0] == "sacct"
    )


def test_a_state_the_job_can_leave_is_not_cached_as_final(tmp_path, cluster):
    """submitit's watcher treats SUSPENDED (and anything off its short list) as finished."""
    fake, clock = cluster
    fake.sacct["7"] = "SUSPENDED"
    watcher = slurm_watch.watcher()
    assert watcher.state("7")[0] == "SUSPENDED"
    fake.sacct["7"] = "RUNNING"
    clock.sleep(60)
    assert watcher.state("7")[0] == "RUNNING"


def test_an_ended_job_still_completing_is_completing(tmp_path, cluster):
    """sacct records the end as soon as the job starts ending; squeue's COMPLETING (processes still being
    killed) wins until squeue no longer lists the job, or lists it as ended."""
    fake, _ = cluster
    watcher = slurm_watch.watcher()
    fake.sacct["7"], fake.queue["7"] = "CANCELLED", ("COMPLETING", "None")
    assert watcher.state("7")[0] == "COMPLETING"
    fake.queue["7"] = ("CANCELLED", "None")
    watcher.arm("7")
    assert watcher.state("7")[0] == "CANCELLED"
    fake.sacct["8"] = "CANCELLED"  # squeue forgot the job: it is gone
    assert watcher.state("8")[0] == "CANCELLED"


def test_squeue_failing_for_a_moment_keeps_the_last_answer(tmp_path, cluster, monkeypatch):
    fake, clock = cluster
    fake.sacct["7"], fake.queue["7"] = "PENDING", ("PENDING", "Priority")
    watcher = slurm_watch.watcher()
    assert watcher.state("7") == ("PENDING", "Priority")

    def away(argv: Sequence[str], timeout: float, **_: object) -> Result:
        if argv[0] == "squeue":
            return Result(1, "", "squeue: error: Unable to contact slurm controller (connect failure)")
        return fake(argv, timeout)

    monkeypatch.setattr(slurm, "default", Slurm(runner=away, sleep=clock.sleep))
    watcher.arm("7")
    assert watcher.state("7") == ("PENDING", "Priority"), "not PENDING without its reason, nor UNKNOWN"
