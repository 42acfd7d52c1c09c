"""hpc/scheduler/index.py: the job index (register/find/list), job folder paths, JobNotFound, and finding a job submitted
by hand with `sbatch tensorrt_llm_triton.sub` on the real cluster (mark `cluster`) through scontrol and sacct."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc.jobs.executors import LocalExecutor, SlurmExecutor, executor_of
from hpc.scheduler.index import JobNotFound, JobRef, find_job, index_dir, list_jobs, register
from launcher.contracts.layout import SUB_NAME, JobPaths
from tests.e2e import wait_for
from tests.plans import write_plan

pytestmark = pytest.mark.timeout(120)


def make_job_dir(root: Path, job_id: str, *, replicas: int = 1, world_per_replica: int = 2) -> Path:
    deploy = root / f"deploy-{job_id}"
    deploy.mkdir(parents=True, exist_ok=True)
    write_plan(deploy, replicas=replicas, world_size_per_replica=world_per_replica)
    return JobPaths(deploy, job_id).create().folder


@pytest.fixture
def no_scheduler(monkeypatch):
    """Hide scontrol and sacct from hpc.scheduler.index: only the index and paths are left."""
    real_which = shutil.which
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name, *a, **k: None if name in ("scontrol", "sacct") else real_which(name, *a, **k),
    )


# ---------------------------------------------------------------------------------------------------------
# the index


def test_index_dir_follows_hpc_serve_home(hpc_home):
    assert index_dir() == hpc_home / "jobs"


def test_index_dir_default_is_home(monkeypatch, tmp_path):
    monkeypatch.delenv("HPC_SERVE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert index_dir() == tmp_path / ".hpc-serve" / "jobs"


def test_register_then_find_by_id(hpc_home, tmp_path, no_scheduler):
    job_dir = make_job_dir(tmp_path, "123")
    register("123", job_dir)
    link = hpc_home / "jobs" / "123"
    assert link.is_symlink() and link.resolve() == job_dir.resolve()
    ref = find_job("123")
    assert ref == JobRef("123", job_dir.resolve())
    assert ref.deploy_dir == job_dir.parent.parent.resolve()
    assert isinstance(executor_of(ref), SlurmExecutor)


def test_register_again_replaces_the_link_and_leaves_no_temporary(hpc_home, tmp_path, no_scheduler):
    first, second = make_job_dir(tmp_path / "a", "77"), make_job_dir(tmp_path / "b", "77")
    register("77", first)
    register("77", second)  # the .sub registers again at job start; a resubmission may point elsewhere
    assert find_job("77").job_dir == second.resolve()
    assert [p.name for p in (hpc_home / "jobs").iterdir()] == ["77"]


def test_find_by_job_folder_path(hpc_home, tmp_path, no_scheduler, monkeypatch):
    job_dir = make_job_dir(tmp_path, "555")  # never registered
    ref = find_job(str(job_dir))
    assert ref.job_id == "555" and ref.job_dir == job_dir.resolve()
    monkeypatch.chdir(job_dir.parent.parent)
    assert find_job("jobs/555").job_dir == job_dir.resolve()
    assert find_job("jobs/555/").job_id == "555"


def test_a_folder_that_is_not_a_job_folder_is_not_taken_for_one(hpc_home, tmp_path, no_scheduler):
    job_dir = make_job_dir(tmp_path, "556")
    with pytest.raises(JobNotFound):
        find_job(str(job_dir.parent.parent))  # the deployment folder itself: which job?


def test_local_job_ids(hpc_home, tmp_path, no_scheduler):
    job_dir = make_job_dir(tmp_path, "local-1a2b3c", world_per_replica=1)
    register("local-1a2b3c", job_dir)
    ref = find_job("local-1a2b3c")
    assert isinstance(executor_of(ref), LocalExecutor) and ref.world_size == 1


def test_job_not_found_says_what_was_tried(hpc_home, no_scheduler):
    with pytest.raises(JobNotFound) as err:
        find_job("31337")
    text = str(err.value)
    assert text.startswith("job 31337: ")
    assert str(hpc_home / "jobs") in text
    assert "scontrol" in text and "sacct" in text
    assert "DEPLOY_DIR/jobs/JOB" in text, "the message must say what to pass instead"


def test_deleted_job_folder_is_not_found(hpc_home, tmp_path, no_scheduler):
    import shutil

    job_dir = make_job_dir(tmp_path, "900")
    register("900", job_dir)
    shutil.rmtree(job_dir.parent.parent)
    with pytest.raises(JobNotFound):
        find_job("900")
    assert list_jobs() == []


def test_jobref_paths(tmp_path):
    job_dir = make_job_dir(tmp_path, "4242", replicas=3, world_per_replica=4)
    ref = JobRef("4242", job_dir)
    assert ref.endpoints_dir == job_dir / "endpoints" and ref.ranks_dir == job_dir / "ranks"
    assert ref.world_size == 12 and ref.launch_plan().replicas == 3
    assert ref.rank_log(5) == job_dir / "4242_5_log.out"
    assert ref.rank_log(0, "err") == job_dir / "4242_0_log.err"
    from submitit.core.utils import JobPaths as SubmititPaths  # the naming submitit's SlurmJob reads

    theirs = SubmititPaths(job_dir.parent / "%j", job_id="4242", task_id=5)
    assert (ref.rank_log(5), ref.rank_log(5, "err")) == (theirs.stdout, theirs.stderr)


# ---------------------------------------------------------------------------------------------------------
# list_jobs


def test_list_jobs_empty(hpc_home):
    assert list_jobs() == []


def _set_times(job_dir: Path, link_time: float, folder_time: float) -> None:
    os.utime(index_dir() / job_dir.name, (link_time, link_time), follow_symlinks=False)
    os.utime(job_dir, (folder_time, folder_time))


def test_list_jobs_newest_submission_first(hpc_home, tmp_path):
    dirs = {job: make_job_dir(tmp_path, job) for job in ("101", "local-aaaaaa", "103")}
    for job, job_dir in dirs.items():
        register(job, job_dir)
    (index_dir() / ".103.999").symlink_to(dirs["103"])  # a register() in progress
    _set_times(dirs["101"], 1000, 1000)
    _set_times(dirs["local-aaaaaa"], 2000, 2000)
    _set_times(dirs["103"], 3000, 3000)
    assert [r.job_id for r in list_jobs()] == ["103", "local-aaaaaa", "101"]
    assert all(r.job_dir == dirs[r.job_id].resolve() for r in list_jobs())


def test_list_jobs_order_is_not_changed_by_activity_in_an_old_job(hpc_home, tmp_path):
    """Cancelling (or a rank writing its record in) an old job must not make it the 'newest' one, which
    `hpc-serve status` with no job id shows."""
    old, new = make_job_dir(tmp_path, "201"), make_job_dir(tmp_path, "202")
    register("201", old)
    register("202", new)
    _set_times(old, 1000, 5000)  # registered first, its folder written to last (local.json rewritten)
    _set_times(new, 2000, 2000)
    assert [r.job_id for r in list_jobs()] == ["202", "201"]


# ---------------------------------------------------------------------------------------------------------
# by hand on the real cluster


def _hand_deployment(root: Path) -> Path:
    deploy = root / "by-hand"
    deploy.mkdir()
    write_plan(deploy)
    (deploy / SUB_NAME).write_text("#!/bin/bash\nsleep 30\n")
    return deploy


def _sbatch(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, cwd=cwd, check=True)
    return proc.stdout.strip().split(";")[0]


@pytest.fixture
def cancel_after(slurm_cluster):
    started: list[str] = []
    yield started
    for job in started:
        subprocess.run(["scancel", job], capture_output=True)


@pytest.mark.cluster
def test_hand_submitted_pending_job_is_found_through_scontrol(cancel_after, hpc_home, tmp_path):
    from hpc.jobs.track import job_status

    deploy = _hand_deployment(tmp_path)
    job = _sbatch(["--hold", "-o", f"{tmp_path}/%j.out", str(deploy / SUB_NAME)], cwd=tmp_path)
    cancel_after.append(job)
    assert not (hpc_home / "jobs" / job).exists(), "nothing registered it: only Slurm knows the script"
    ref = find_job(job)
    assert ref == JobRef(job, JobPaths(deploy, job).folder)
    st = job_status(ref)
    assert (st.state, st.reason) == ("PENDING", "JobHeldUser")


@pytest.mark.cluster
def test_hand_submitted_with_a_relative_path_is_found(cancel_after, hpc_home, tmp_path, monkeypatch):
    """`cd D && sbatch tensorrt_llm_triton.sub`: scontrol's Command= is absolute, sacct's SubmitLine is not
    (it is relative to the job's WorkDir), and this shell's cwd is elsewhere."""
    deploy = _hand_deployment(tmp_path)
    job = _sbatch(["--hold", "-o", f"{tmp_path}/%j.out", SUB_NAME], cwd=deploy)
    cancel_after.append(job)
    monkeypatch.chdir("/")
    assert find_job(job).job_dir == JobPaths(deploy, job).folder  # scontrol

    subprocess.run(["scancel", job], check=True, capture_output=True)
    # slurmdbd fills SubmitLine/WorkDir of a job that never started a few seconds after it ended
    sacct = ["sacct", "-n", "-X", "-P", "-j", job, "-o", "SubmitLine"]
    wait_for(
        lambda: SUB_NAME in subprocess.run(sacct, capture_output=True, text=True).stdout,
        60,
        "sacct to record the cancelled job's submit line",
    )
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "scontrol" else real_which(name))
    assert find_job(job).job_dir == JobPaths(deploy, job).folder  # sacct: SubmitLine + WorkDir


@pytest.mark.cluster
def test_a_job_that_is_not_hpc_serve_is_not_found(cancel_after, hpc_home, tmp_path):
    job = _sbatch(["--hold", "-o", f"{tmp_path}/%j.out", "--wrap", "sleep 30"], cwd=tmp_path)
    cancel_after.append(job)
    with pytest.raises(JobNotFound, match=f"job {job}: "):
        find_job(job)


@pytest.mark.cluster
def test_refused_submission_leaves_no_deployment_folder(slurm_cluster, hpc_home, tmp_path, tiny_gpt2):
    """sbatch says no (an unknown partition): exit 2 with sbatch's words, and no rendered folder remains."""
    from tests.e2e import cli, write_spec

    spec = write_spec(tmp_path, "refused", tiny_gpt2, slurm={"partition": "nosuchpartition"})
    proc = cli("submit", str(spec), check=False)
    assert proc.returncode == 2
    assert "sbatch refused the job" in proc.stderr and "partition" in proc.stderr.lower()
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.cluster
def test_a_refused_serving_job_cancels_the_gateway_job_made_for_it(slurm_cluster, hpc_home, tmp_path, tiny_gpt2):
    """`submit` starts the gateway before the serving job (hpc/jobs/submit.py `submit_jobs`); when sbatch then refuses
    the serving job (an unknown partition, the gateway's own being a real one), the gateway job this submission
    made is cancelled, not left to hold a node, and no rendered folder remains, not even when the gateway job had
    started (its script makes its job folder) before the cancel reached it."""
    import yaml

    from hpc.scheduler import slurm
    from launcher.contracts.job_index import parse_entry
    from tests.e2e import cli, write_spec

    spec = write_spec(tmp_path, "halfway", tiny_gpt2, slurm={"partition": "nosuchpartition"})
    data = yaml.safe_load(spec.read_text())
    data["gateway"] = {"cpus": 1, "mem": "1G", "time": "00:05:00", "partition": "debug"}
    spec.write_text(yaml.safe_dump(data))
    proc = cli("submit", str(spec), check=False)
    assert proc.returncode == 2 and "sbatch refused the job" in proc.stderr, proc.stderr
    # the gateway job was indexed at its sbatch; its folder went with the deployment's
    (gateway,) = [parse_entry(entry.name)[0] for entry in index_dir().iterdir()]
    cancelled = lambda: slurm.default.sacct_states([gateway]).get(gateway) == "CANCELLED"
    try:
        wait_for(cancelled, 60, f"the gateway job {gateway} to be CANCELLED")
    finally:
        subprocess.run(["scancel", gateway], capture_output=True, check=False)  # if not: it holds a node no more
    runs = tmp_path / "runs"
    assert not runs.exists() or not [p for p in runs.iterdir() if p.is_dir()]
