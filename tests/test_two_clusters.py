"""Two Slurm clusters that share $HOME, and so the job index, on this machine (docs/decisions.md "The job index
keys jobs by cluster").

The module starts a second one-node cluster (ci/cluster/twin.sh: ClusterName `twin`, registered in the test
cluster's slurmdbd) whose first job id is the id of an hpc-serve job just queued, held, on the test cluster: the
two jobs share an id, as jobs of two clusters do. Then, with SLURM_CONF at either cluster, `list`, `status` and
`cancel` must each see and act on its own job: the other cluster's through `-M`, and a job of a cluster that cannot
be asked says whose it is, never the test cluster's folder with twin's job's state.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import CLI, private_job_index, wait_for, write_spec
from tests.plans import write_plan

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
TWIN = "/etc/slurm-twin/slurm.conf"  # ci/cluster/twin.sh's (its default name, twin)


def first_cluster() -> tuple[str, str]:
    """(SLURM_CONF, ClusterName) of the test cluster (ci/cluster/up.sh) as this environment reaches it, in Slurm's
    own words (`scontrol show config`), rather than copies of ci/cluster/common.sh's defaults."""
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60, check=True)
    config = dict(re.findall(r"^(\S+)\s*=\s*(.*?)\s*$", out.stdout, re.MULTILINE))
    return config["SLURM_CONF"], config["ClusterName"]


def hs(conf: str, *args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
    """`hpc-serve ARGS` with SLURM_CONF at one cluster."""
    env = {**os.environ, "SLURM_CONF": conf}
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"hpc-serve {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def slurm(conf: str, *argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "SLURM_CONF": conf}).stdout


def listing(conf: str) -> dict[str, dict]:
    """`hpc-serve list --json` at one cluster: its rows by job folder."""
    return {row["job_dir"]: row for row in json.loads(hs(conf, "list", "--json").stdout)}


def ended_on_twin(first_conf: str, job: str) -> bool:
    """twin's controller lists the job no more (or as ended, not COMPLETING): none of its processes is left."""
    state = slurm(first_conf, "squeue", "-M", "twin", "-h", "-j", job, "-o", "%T").strip()
    return state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING")


@pytest.fixture(scope="module")
def two(slurm_cluster, tmp_path_factory, tiny_gpt2, tritonserver) -> Iterator[dict]:
    """{"job": the shared id, "first_dir"/"twin_dir": each cluster's job folder, "home": the job index,
    "first_conf"/"first": the test cluster's SLURM_CONF and name}: the test cluster's job held (PENDING,
    JobHeldUser), twin's the same id READY, started by a hand-run sbatch."""
    if os.geteuid() != 0:
        pytest.skip("ci/cluster/twin.sh starts daemons: root only")
    first_conf, first = first_cluster()
    folder = tmp_path_factory.mktemp("two-clusters")
    job = ""
    with private_job_index(folder) as home:
        try:
            held = write_spec(folder, "first", tiny_gpt2, slurm={"sbatch_args": ["--hold"]})
            out = hs(first_conf, "submit", str(held)).stdout.split()
            job, first_dir = out[0], Path(out[1])
            subprocess.run(["bash", str(ROOT / "ci/cluster/twin.sh"), "up", job], check=True, timeout=120)
            deploy = folder / "twin-deploy"
            hs(TWIN, "render", str(write_spec(folder, "second", tiny_gpt2)), "-o", str(deploy))
            twin_job = slurm(TWIN, "sbatch", "--parsable", str(deploy / "tensorrt_llm_triton.sub")).strip()
            assert twin_job == job, f"twin's first job should share the test cluster's id {job}, got {twin_job!r}"
            # the .sub indexes it at job start (a hand-run sbatch: nothing else does), then it serves
            wait_for(lambda: (home / "jobs" / f"{job}@twin").exists(), 120, "twin's job to start and index itself")
            hs(TWIN, "wait", f"{job}@twin", "--timeout", "180", timeout=240)
            yield {
                "job": job,
                "first_dir": first_dir,
                "twin_dir": deploy / "jobs" / job,
                "home": home,
                "first_conf": first_conf,
                "first": first,
            }
        finally:
            if job:
                subprocess.run(["scancel", job], capture_output=True, env={**os.environ, "SLURM_CONF": first_conf})
                subprocess.run(["scancel", "-M", "twin", job], capture_output=True)
                wait_for(lambda: ended_on_twin(first_conf, job), 90, f"twin's job {job} to end before twin stops")
            subprocess.run(["bash", str(ROOT / "ci/cluster/twin.sh"), "down"], check=False, timeout=120)


def test_each_cluster_sees_each_job_with_its_own_state(two) -> None:
    """The index holds both jobs `<id>` (one per cluster); every folder records its cluster; at either cluster
    `list` shows the held job PENDING (JobHeldUser) and twin's READY, never one job's state for the other."""
    job, home, first_conf, name = two["job"], two["home"], two["first_conf"], two["first"]
    assert sorted(p.name for p in (home / "jobs").iterdir()) == sorted([f"{job}@{name}", f"{job}@twin"])
    assert (two["first_dir"] / "cluster").read_text().strip() == name  # by submit: it has not started
    assert (two["twin_dir"] / "cluster").read_text().strip() == "twin"  # by the .sub at job start
    for conf, here in ((first_conf, name), (TWIN, "twin")):
        rows = listing(conf)
        first, second = rows[str(two["first_dir"])], rows[str(two["twin_dir"])]
        assert (first["state"], first["reason"], first["cluster"]) == ("PENDING", "JobHeldUser", name), first
        assert (second["state"], second["cluster"]) == ("READY", "twin"), second
        assert first["other_cluster"] == (here != name) and second["other_cluster"] == (here != "twin")
        (endpoint,) = second["endpoints"]
        assert endpoint["cluster"] == "twin" and endpoint["job_id"] == job
        text = hs(conf, "list").stdout
        print(f"\nhpc-serve list with SLURM_CONF={conf}:\n{text}")
        other = f"{job}@twin" if here == name else f"{job}@{name}"
        assert other in text, text
    # a bare id means the current cluster's job; `<id>@<cluster>` the other's
    assert hs(TWIN, "status", job).stdout.startswith(f"{job} READY")
    assert hs(TWIN, "status", f"{job}@{name}").stdout.startswith(f"{job}@{name} PENDING (JobHeldUser: held")
    assert hs(first_conf, "status", job).stdout.startswith(f"{job} PENDING (JobHeldUser: held")
    assert hs(first_conf, "status", f"{job}@twin").stdout.startswith(f"{job}@twin READY")


def test_a_job_of_a_cluster_that_cannot_be_asked_says_whose_it_is(two) -> None:
    """A folder recorded for a cluster this slurmdbd does not know: UNKNOWN, naming both clusters and the
    SLURM_CONF, never twin's job of that id; `cancel` refuses and sends nothing."""
    job, home = two["job"], two["home"]
    ghost = two["twin_dir"].parent.parent.parent / "ghost-deploy" / "jobs" / job
    ghost.mkdir(parents=True)
    write_plan(ghost.parent.parent)
    (ghost / "cluster").write_text("ghost\n")
    (home / "jobs" / f"{job}@ghost").symlink_to(ghost)
    try:
        row = listing(TWIN)[str(ghost)]
        assert (row["state"], row["unreachable"], row["scheduler_state"]) == ("UNKNOWN", True, "UNKNOWN")
        assert row["reason"].startswith(f"job {job} belongs to cluster 'ghost'; this is 'twin' (SLURM_CONF={TWIN});")
        assert "No cluster 'ghost' known by database" in row["reason"], row["reason"]
        refused = hs(TWIN, "cancel", f"{job}@ghost", check=False)
        assert refused.returncode != 0 and "not sent: job" in refused.stderr, refused.stderr
        assert not (ghost / "cancel_requested").exists()
        assert hs(TWIN, "status", job).stdout.startswith(f"{job} READY"), "twin's job of that id untouched"
    finally:
        (home / "jobs" / f"{job}@ghost").unlink()


def test_cancel_reaches_the_jobs_own_cluster_only(two) -> None:
    """At twin, `cancel <id>@<test cluster>` cancels the test cluster's job (scancel -M) and leaves twin's job of the
    same id serving; then twin's own job, which the test cluster sees CANCELLED through -M."""
    job, first_conf, name = two["job"], two["first_conf"], two["first"]
    assert "CANCELLED" in hs(TWIN, "cancel", f"{job}@{name}").stdout
    assert slurm(first_conf, "sacct", "-n", "-X", "-P", "-j", job, "-o", "State").split()[0] == "CANCELLED"
    assert hs(TWIN, "status", job).stdout.startswith(f"{job} READY")
    assert hs(TWIN, "cancel", job, timeout=180).stdout.startswith(f"{job} CANCELLED")
    assert hs(first_conf, "status", f"{job}@twin").stdout.startswith(f"{job}@twin CANCELLED")
    assert hs(first_conf, "status", job).stdout.startswith(f"{job} CANCELLED")
