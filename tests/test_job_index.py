"""launcher/contracts/job_index.py and what reads it: job ids are unique per Slurm cluster only, and clusters share $HOME.

Unit tests, no scheduler: the `.sub`'s shell lines and `link_index` make the same entry and cluster record; a job
id held for two clusters finds the current cluster's; a job of another cluster is asked about and cancelled with
`-M <its cluster>` and never under its bare id (a fake command runner records every command); when its cluster
cannot be asked it reads UNKNOWN and says whose it is. The same against two real clusters:
tests/test_two_clusters.py.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpc.cli import jobs as jobs_cli
from hpc.cli.support import EXIT_JOB_FAILED
from hpc.jobs.executors import SlurmExecutor, watch
from hpc.jobs.kinds import GatewayJob
from hpc.jobs.status import JobStatus
from hpc.jobs.track import cancel, job_status, wait
from hpc.scheduler import slurm
from hpc.scheduler import watch as slurm_watch
from hpc.scheduler.index import JobNotFound, find_job, list_jobs, register
from hpc.scheduler.slurm import Result, Slurm, SlurmError
from hpc.scheduler.watch import SlurmWatcher
from hpc.serving.auth import Tokens
from hpc.serving.balancer import Balancer
from hpc.serving.deployment import Target, as_replica, deployment_folders, names_indexed_job, published
from hpc.serving.discovery import Discovery, draining_jobs, mark_draining
from launcher.contracts import job_index
from launcher.contracts.layout import JobPaths
from launcher.contracts.records import ChainRecord, EndpointRecord, GatewayRecord, StartupRecord, write_json_atomic
from launcher.contracts.stop_records import DrainingMark
from tests.plans import write_plan

pytestmark = pytest.mark.timeout(60)


def job_folder(root: Path, job_id: str, name: str = "deploy") -> Path:
    deploy = root / f"{name}-{job_id}"
    deploy.mkdir(parents=True, exist_ok=True)
    write_plan(deploy)
    return JobPaths(deploy, job_id).create().folder


# ---------------------------------------------------------------------------------------------------------
# the index and the job folder's record


@pytest.mark.parametrize("home", [None, "", "/opt/hs"])
@pytest.mark.parametrize("slurm_env", [{"SLURM_JOB_ID": "7", "SLURM_CLUSTER_NAME": "twin"}, {}])
def test_the_subs_lines_make_the_entry_link_index_makes(home, slurm_env, tmp_path, monkeypatch) -> None:
    """The `.sub` indexes a hand-run sbatch job with the shell form of the same rules (INDEX_JOB_SHELL): the
    index folder, the entry's name with the job's cluster, the cluster recorded in the job folder. Outside Slurm
    (the local executor runs gateway.sub with $HPC_SERVE_JOB_ID) no cluster."""
    monkeypatch.setenv("HOME", str(tmp_path))  # what `~` means to index_dir too
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "JOB_ID": "7", **slurm_env}
    if home is not None:
        env[job_index.HOME_ENV] = home if home != "/opt/hs" else str(tmp_path / "hs")
    job_dir = job_folder(tmp_path, "7")
    env["JOB_DIR"] = str(job_dir)
    script = f"set -euo pipefail\n{job_index.INDEX_JOB_SHELL}\n"
    subprocess.run(["bash", "-c", script], env=env, check=True)
    cluster = slurm_env.get("SLURM_CLUSTER_NAME")
    entry = job_index.index_dir(env) / job_index.entry_name("7", cluster)
    assert entry.is_symlink() and entry.resolve() == job_dir.resolve()
    assert JobPaths.of_folder(job_dir).cluster == cluster
    assert [p.name for p in job_dir.iterdir() if p.name.startswith(".")] == [], "no temporary left behind"


def test_the_subs_lines_leave_a_sites_variables_alone(tmp_path, monkeypatch) -> None:
    """A site's environment may export CLUSTER, INDEX or JOB_ID for its own tools, and the `.sub`'s steps inherit
    what its lines set: they set only HPC_SERVE_ variables, and take the job's id from its folder."""
    monkeypatch.setenv("HOME", str(tmp_path))
    site = {"CLUSTER": "site-cluster", "INDEX": "/site/index", "JOB_ID": "site-job"}
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_CLUSTER_NAME": "twin", **site}
    job_dir = job_folder(tmp_path, "7")
    env["JOB_DIR"] = str(job_dir)
    script = f"set -euo pipefail\n{job_index.INDEX_JOB_SHELL}\nenv\n"
    out = subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True, text=True).stdout
    exported = dict(line.partition("=")[::2] for line in out.splitlines())
    assert {name: exported.get(name) for name in site} == site
    assert (job_index.index_dir(env) / "7@twin").resolve() == job_dir.resolve()
    assert [p.name for p in job_index.index_dir(env).iterdir()] == ["7@twin"]


def test_link_index_records_the_cluster_and_keys_the_entry(tmp_path, hpc_home) -> None:
    first, second = job_folder(tmp_path, "33", "a"), job_folder(tmp_path, "33", "b")
    register("33", first, "hpcserve")
    register("33", second, "twin")  # the other cluster's job 33: an entry of its own, not a replacement
    assert sorted(p.name for p in job_index.index_dir().iterdir()) == ["33@hpcserve", "33@twin"]
    assert JobPaths.of_folder(first).cluster == "hpcserve" and JobPaths.of_folder(second).cluster == "twin"
    assert {k: v.resolve() for k, v in job_index.entries("33").items()} == {"hpcserve": first, "twin": second}
    assert list(job_index.entries("33@twin")) == ["twin"] and job_index.entries("33@nowhere") == {}
    assert job_index.entry_of(JobPaths.of_folder(second)) == job_index.index_dir() / "33@twin"
    assert {(ref.job_id, ref.cluster, ref.job_dir) for ref in list_jobs()} == {
        ("33", "hpcserve", first),
        ("33", "twin", second),
    }
    assert job_index.parse_entry("local-1a2b") == ("local-1a2b", None)
    assert job_index.job_cluster({"SLURM_CLUSTER_NAME": "twin"}) is None, "only inside a Slurm job"
    assert job_index.job_cluster({"SLURM_JOB_ID": "5", "SLURM_CLUSTER_NAME": "twin"}) == "twin"


def test_an_id_of_two_clusters_means_the_current_ones(tmp_path, hpc_home, monkeypatch) -> None:
    """`status 33` with jobs 33 of two clusters indexed: the current cluster's (SLURM_CONF's); an entry without a
    cluster (indexed before clusters were recorded) counts as the current cluster's; `33@twin` names the other;
    with neither the current's nor an old entry it is ambiguous, and the error names what to type."""
    first, second = job_folder(tmp_path, "33", "a"), job_folder(tmp_path, "33", "b")
    register("33", first, "hpcserve")
    register("33", second, "twin")
    current: list[str | None] = ["hpcserve"]
    monkeypatch.setattr(slurm.default, "cluster_name", lambda: current[0])
    assert find_job("33").job_dir == first and find_job("33").cluster == "hpcserve"
    assert find_job("33@twin").job_dir == second and find_job("33@twin").cluster == "twin"
    current[0] = "twin"
    assert find_job("33").job_dir == second
    current[0] = None
    with pytest.raises(JobNotFound, match="33@hpcserve, 33@twin"):
        find_job("33")
    old = job_folder(tmp_path, "33", "old")
    register("33", old)  # an entry from before clusters were recorded
    assert find_job("33").job_dir == old and find_job("33").cluster is None
    register("34", job_folder(tmp_path, "34"), "twin")
    assert find_job("34").cluster == "twin", "the only job of that id, whatever cluster it is of"


def test_records_without_a_cluster_still_read() -> None:
    """Records written before the field (and by a newer hpc-serve, with fields this one does not know) read."""
    old = {"version": 1, "job_id": 5, "replica": 0, "address": "10.0.0.5", "http_port": 8000, "future": 1}
    assert EndpointRecord.from_dict(old).cluster == ""
    assert EndpointRecord.from_dict({**old, "cluster": "twin"}).to_dict()["cluster"] == "twin"
    assert StartupRecord.from_dict({"job_id": "5"}).cluster == ""
    assert ChainRecord.from_dict({"job_id": 5, "cluster": None}).cluster == ""
    assert GatewayRecord.from_dict({"name": "x", "url": "http://h:1"}).cluster == ""


# ---------------------------------------------------------------------------------------------------------
# asking a job's own cluster, with a fake command runner


class TwoClusters:
    """Answers sacct/squeue/scontrol/scancel for two clusters: `hpcserve` (no -M) and the others (-M NAME);
    a cluster in `away` fails like one slurmdbd does not know. Records every command."""

    def __init__(self) -> None:
        self.states: dict[tuple[str, str], str] = {}  # (cluster, job id) → state
        self.away: set[str] = set()
        self.config_error = ""  # `scontrol show config`'s stderr while it fails ("": it answers)
        self.commands: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float, **_: object) -> Result:
        argv = list(argv)
        self.commands.append(argv)
        cluster = argv[argv.index("-M") + 1] if "-M" in argv else "hpcserve"
        if argv[:3] == ["scontrol", "show", "config"]:
            if self.config_error:
                return Result(1, "", self.config_error)
            return Result(0, "ClusterName             = hpcserve\nFirstJobId = 1\n", "")
        if cluster in self.away and argv[0] != "sacct":  # sacct -M of a cluster dbd lacks: nothing, rc 0
            error = f"{argv[0]}: error: No cluster '{cluster}' known by database."
            return Result(1, "", error)
        ids = argv[argv.index("-j") + 1].split(",") if "-j" in argv else [argv[-1]]
        known = [j for j in ids if (cluster, j) in self.states]
        if argv[0] == "sacct":
            return Result(0, "".join(f"{j}|{self.states[(cluster, j)]}\n" for j in known), "")
        if argv[0] == "squeue":
            if not known:
                return Result(1, "", "slurm_load_jobs error: Invalid job id specified")
            return Result(0, "".join(f"{j}|{self.states[(cluster, j)]}|None\n" for j in known), "")
        if argv[0] == "scontrol":
            return Result(1, "", "slurm_load_jobs error: Invalid job id specified")
        if argv[0] == "scancel":
            self.states[(cluster, ids[0])] = "CANCELLED"
            return Result(0, "", "")
        raise AssertionError(f"unexpected command {argv}")

    def about(self, job_id: str) -> list[list[str]]:
        return [argv for argv in self.commands if job_id in ",".join(argv)]


@pytest.fixture
def clusters(monkeypatch) -> TwoClusters:
    fake = TwoClusters()
    monkeypatch.setattr(slurm, "default", Slurm(runner=fake, sleep=lambda s: None))
    monkeypatch.setattr(slurm_watch, "shared", SlurmWatcher())
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return fake


def test_a_job_of_another_cluster_shows_its_own_state(tmp_path, hpc_home, clusters) -> None:
    """The bug: twin's job 33 listed with hpcserve's job 33's state. Now its state comes from twin (-M twin)."""
    clusters.states.update({("hpcserve", "33"): "CANCELLED", ("twin", "33"): "PENDING"})
    register("33", job_folder(tmp_path, "33", "a"), "twin")
    refs = list_jobs()
    watch(refs)
    status = job_status(refs[0])
    assert (status.state, status.cluster, status.other_cluster) == ("PENDING", "twin", True)
    assert status.summary().startswith("33@twin PENDING") and not status.unreachable
    about = [argv for argv in clusters.about("33") if argv[0] in ("sacct", "squeue", "scontrol")]
    assert about and all(argv[1:3] == ["-M", "twin"] for argv in about), about


def test_a_job_of_an_unreachable_cluster_says_whose_it_is(tmp_path, hpc_home, clusters, monkeypatch) -> None:
    """A cluster slurmdbd does not know (or whose controller is away): UNKNOWN, the reason naming both clusters
    and Slurm's words; `wait` returns at once; `cancel` sends nothing and writes no cancel marker."""
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    clusters.states[("hpcserve", "33")] = "RUNNING"
    clusters.away.add("ghost")
    folder = job_folder(tmp_path, "33")
    register("33", folder, "ghost")
    ref = find_job("33")
    status = job_status(ref)
    assert (status.state, status.unreachable) == ("UNKNOWN", True)
    assert status.reason == (
        "job 33 belongs to cluster 'ghost'; this is 'hpcserve' (SLURM_CONF=/etc/slurm/slurm.conf); cluster 'ghost' "
        "cannot be asked from here: squeue: error: No cluster 'ghost' known by database."
    )
    assert status.summary() == f"33@ghost UNKNOWN ({status.reason})"
    assert wait(ref, timeout=30).unreachable
    with pytest.raises(SlurmError, match="not sent: job 33 belongs to cluster 'ghost'"):
        cancel(ref, grace_s=1)
    assert not ref.cancel_marker.exists()
    assert not [argv for argv in clusters.commands if argv[0] == "scancel"]
    assert all("-M" in argv for argv in clusters.about("33")), "never hpcserve's job 33"


def test_cancel_of_another_clusters_job_goes_to_that_cluster(tmp_path, hpc_home, clusters, monkeypatch) -> None:
    monkeypatch.setattr("hpc.jobs.track.after_cancel", lambda ref, grace_s: None)  # no deployment (spec.yaml) here
    clusters.states.update({("hpcserve", "33"): "RUNNING", ("twin", "33"): "PENDING"})
    register("33", job_folder(tmp_path, "33"), "twin")
    ref = find_job("33")
    assert cancel(ref, grace_s=1).state == "CANCELLED"
    assert clusters.states == {("hpcserve", "33"): "RUNNING", ("twin", "33"): "CANCELLED"}
    assert [argv[:3] for argv in clusters.commands if argv[0] == "scancel"] == [["scancel", "-M", "twin"]]


def test_a_job_without_a_recorded_cluster_is_the_current_clusters(tmp_path, hpc_home, clusters) -> None:
    """Folders from before clusters were recorded: the current cluster's job of that id (DEVELOPERS.md "The job
    index")."""
    clusters.states.update({("hpcserve", "33"): "PENDING", ("twin", "33"): "RUNNING"})
    register("33", job_folder(tmp_path, "33"))
    status = job_status(find_job("33"))
    assert (status.state, status.cluster, status.other_cluster) == ("PENDING", None, False)
    assert not any("-M" in argv for argv in clusters.commands)
    assert SlurmExecutor().other_cluster(find_job("33")) is None


def test_a_failed_cluster_name_lookup_makes_no_job_anothers(tmp_path, hpc_home, clusters) -> None:
    """`scontrol show config` failing (the controller away a moment): the current cluster's jobs (recorded
    `hpcserve`) must not read as another cluster's, asked with -M, UNKNOWN and unreachable (`wait` would return at
    once). The failure stands a while (slurm.MAX_DELAY_S): a listing of many jobs asks once, with its retries, not
    once per job; after that it is asked again."""
    now = [1000.0]
    slurm.default.clock = lambda: now[0]
    clusters.config_error = "scontrol: error: Unable to contact slurm controller (connect failure)"
    jobs = [str(n) for n in range(40, 45)]
    for job in jobs:
        clusters.states[("hpcserve", job)] = "PENDING"
        register(job, job_folder(tmp_path, job), "hpcserve")
    refs = list_jobs()
    watch(refs)
    statuses = [job_status(ref) for ref in refs]
    assert [(s.state, s.other_cluster, s.unreachable) for s in statuses] == [("PENDING", False, False)] * len(jobs)
    assert not any("-M" in argv for argv in clusters.commands), "asked as the current cluster's jobs"
    config = [argv for argv in clusters.commands if argv[:3] == ["scontrol", "show", "config"]]
    assert len(config) == slurm.ATTEMPTS, "one lookup (with its retries) for the whole listing"
    clusters.config_error = ""
    now[0] += slurm.MAX_DELAY_S - 1
    assert slurm.default.cluster_name() is None, "the failure stands a while"
    now[0] += 2
    assert slurm.default.cluster_name() == "hpcserve", "then it is asked again"
    assert len([argv for argv in clusters.commands if argv[:3] == ["scontrol", "show", "config"]]) == len(config) + 1


def test_cancel_of_a_deployment_goes_past_a_job_it_cannot_cancel(tmp_path, hpc_home, clusters, monkeypatch, capsys):
    """A deployment whose jobs are of three clusters, one that cannot be asked (`ghost`): `cancel` of the
    deployment names that job, its cluster and why, cancels every other one on its own cluster (two of them job
    33, in two folders: told apart by folder, not by id), and exits non-zero."""
    monkeypatch.setattr("hpc.jobs.track.after_cancel", lambda ref, grace_s: None)  # no gateway here
    clusters.away.add("ghost")
    clusters.states.update({("hpcserve", "33"): "PENDING", ("twin", "33"): "PENDING", ("hpcserve", "34"): "PENDING"})
    for name, job, cluster in (("dep-a", "33", "ghost"), ("dep-b", "33", "hpcserve"), ("dep-c", "33", "twin")):
        register(job, job_folder(tmp_path, job, name), cluster)
    register("34", job_folder(tmp_path, "34", "dep-d"), "hpcserve")
    for deploy in tmp_path.glob("dep-*"):
        (deploy / "spec.yaml").write_text("name: dep\n")
    target = Target(tmp_path, "dep", tmp_path)
    monkeypatch.setattr(jobs_cli, "job_or_deployment", lambda targets: (target, []))
    code = jobs_cli.cmd_cancel(argparse.Namespace(target="dep", grace=1.0))
    out, err = capsys.readouterr()
    assert code == EXIT_JOB_FAILED
    assert sorted(out.split()[::2]) == ["33", "33@twin", "34"] and out.count("CANCELLED") == 3, out
    assert (
        err.startswith(
            "hpc-serve: job 33 of cluster 'ghost' not cancelled: job 33 belongs to cluster 'ghost'; this is 'hpcserve' "
        )
        and "No cluster 'ghost' known by database" in err
    ), err
    assert clusters.states == {
        ("hpcserve", "33"): "CANCELLED",
        ("twin", "33"): "CANCELLED",
        ("hpcserve", "34"): "CANCELLED",
    }
    scancels = sorted(" ".join(argv) for argv in clusters.commands if argv[0] == "scancel")
    assert scancels == ["scancel -M twin 33", "scancel 33", "scancel 34"], scancels
    assert not (tmp_path / "dep-a-33" / "jobs" / "33" / "cancel_requested").exists()


def test_cancel_of_a_gateway_job_asks_no_state_first(tmp_path, hpc_home, clusters, monkeypatch) -> None:
    """A gateway job has no ranks to stop in order, so `cancel` does not ask its state before the scancel (that
    probes the gateway); whether its cluster can be asked is the scheduler's answer alone."""
    monkeypatch.setattr("hpc.jobs.track.after_cancel", lambda ref, grace_s: None)
    waited = JobStatus("35", "CANCELLED")
    monkeypatch.setattr("hpc.jobs.track.wait", lambda ref, until, timeout: waited)
    asked: list[str] = []

    def job_status(ref, with_gateway=False) -> JobStatus:
        asked.append(ref.job_id)
        return JobStatus(ref.job_id, "READY")

    monkeypatch.setattr("hpc.jobs.track.job_status", job_status)
    clusters.states.update({("hpcserve", "35"): "RUNNING", ("twin", "36"): "RUNNING"})
    for job, cluster in (("35", "hpcserve"), ("36", "twin")):
        folder = job_folder(tmp_path, job)
        GatewayJob.mark(JobPaths.of_folder(folder))
        register(job, folder, cluster)
        assert cancel(find_job(job), grace_s=1) is waited
    assert asked == []
    assert [argv for argv in clusters.commands if argv[0] == "scancel"] == [
        ["scancel", "35"],
        ["scancel", "-M", "twin", "36"],
    ]


def test_the_gateway_tells_the_replicas_of_two_clusters_jobs_of_one_id_apart(tmp_path, hpc_home) -> None:
    """One deployment, two folders, job 33 in each: one of the test cluster, one of twin (which is handing over:
    draining), each folder with its own token. Their replicas are two (keys `33@hpcserve/0`, `33@twin/0`), only
    twin's drains, each is sent its own folder's token; a local job's key is its id, as before."""
    tokens = {"dep-a": "hpcs_first-0123456789ab", "dep-b": "hpcs_second-0123456789a"}
    for (name, token), cluster, port in zip(tokens.items(), ("hpcserve", "twin"), (8001, 8002), strict=True):
        paths = JobPaths.of_folder(job_folder(tmp_path, "33", name))
        (paths.deploy_dir / "spec.yaml").write_text("name: dep\n")
        (paths.deploy_dir / "access_token").write_text(token)
        paths.record_cluster(cluster)
        record = EndpointRecord(job_id="33", cluster=cluster, address="10.0.0.1", http_port=port, grpc_port=port + 1)
        write_json_atomic(paths.endpoint(0), record.to_dict())
        if cluster == "twin":
            DrainingMark(at=1.0, successor="34").write(paths.draining)
    target = Target(tmp_path, "dep", tmp_path)
    replicas = sorted((as_replica(r) for r in published(target)), key=lambda r: r.key)
    assert [(r.key, r.http_url) for r in replicas] == [
        ("33@hpcserve/0", "http://10.0.0.1:8001"),
        ("33@twin/0", "http://10.0.0.1:8002"),
    ]
    draining = draining_jobs(target)
    assert draining == {"33@twin": False}
    mark_draining(replicas, draining)
    assert [r.draining for r in replicas] == [False, True]
    tokens_of_jobs = Tokens.of_folders(deployment_folders(target))
    discovery = Discovery(target, Balancer(), http=None, replica_tokens=tokens_of_jobs)  # no health check asked here
    assert [discovery.token_for(r) for r in replicas] == list(tokens.values())
    local = EndpointRecord(job_id="local-1a2b", address="127.0.0.1", http_port=9000)
    assert as_replica(local).key == "local-1a2b/0"
    unary = EndpointRecord(address="127.0.0.1", http_port=9000, workflow="llmapi", decoupled=False)
    assert (as_replica(unary).workflow, as_replica(unary).decoupled) == ("llmapi", False), "how clients ask it"
    assert as_replica(EndpointRecord.from_dict(local.to_dict() | {"decoupled": None})).decoupled is True


def test_a_job_indexed_without_its_cluster_and_then_with_it_is_one_job(tmp_path, hpc_home, monkeypatch) -> None:
    """`submit` indexed job 33 as `33` (Slurm could not say its cluster then), the `.sub` at job start as
    `33@hpcserve`, both at one folder: `list` shows it once, with its cluster, and `33` finds it; the `.sub`'s
    lines and link_index remove such a plain entry, never one at another folder (a job 34 of before clusters)."""
    monkeypatch.setattr(slurm.default, "cluster_name", lambda: None)
    index = job_index.index_dir()
    folder = job_folder(tmp_path, "33")
    register("33", folder)
    (index / "33@hpcserve").symlink_to(folder)  # as an older `.sub` left them
    assert [(ref.job_id, ref.cluster, ref.job_dir) for ref in list_jobs()] == [("33", "hpcserve", folder)]
    assert find_job("33").cluster == "hpcserve" and list(job_index.entries("33")) == ["hpcserve"]
    (index / "33@hpcserve").unlink()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HPC_SERVE_HOME": str(hpc_home), "JOB_DIR": str(folder)}
    env |= {"SLURM_JOB_ID": "33", "SLURM_CLUSTER_NAME": "hpcserve"}
    subprocess.run(["bash", "-c", f"set -euo pipefail\n{job_index.INDEX_JOB_SHELL}\n"], env=env, check=True)
    assert sorted(p.name for p in index.iterdir()) == ["33@hpcserve"]
    register("34", job_folder(tmp_path, "34", "old"))  # indexed before clusters were recorded: another job
    register("34", job_folder(tmp_path, "34", "new"), "hpcserve")
    register("35", job_folder(tmp_path, "35"))
    register("35", job_folder(tmp_path, "35"), "hpcserve")
    assert sorted(p.name for p in index.iterdir()) == ["33@hpcserve", "34", "34@hpcserve", "35@hpcserve"]


def test_an_id_with_glob_characters_names_no_other_job(tmp_path, hpc_home) -> None:
    """`hpc-serve status '*'` (or `3?`, `[3]3`): the id is looked up as typed, never as a pattern."""
    register("33", job_folder(tmp_path, "33"), "hpcserve")
    register("34", job_folder(tmp_path, "34"))
    for text in ("*", "3*", "3?", "[3]3", "*@hpcserve"):
        assert job_index.entries(text) == {}, text
        assert not names_indexed_job(text), text
    assert list(job_index.entries("33")) == ["hpcserve"]


def test_status_without_a_target_shows_the_newest_serving_job_not_its_gateway(tmp_path, hpc_home) -> None:
    """A submit with `gateway:` indexes its gateway job last; `status` of that is one line, where the
    serving job's status shows the job and its gateway."""
    import os

    from hpc.cli.query import _latest_job
    from launcher.contracts.layout import GATEWAY_JOB_MARKER_NAME

    serving, gateway = job_folder(tmp_path, "40", "a"), job_folder(tmp_path, "41", "a")
    (gateway / GATEWAY_JOB_MARKER_NAME).touch()
    register("40", serving, "hpcserve")
    register("41", gateway, "hpcserve")
    entry = job_index.index_dir() / "41@hpcserve"
    os.utime(entry, (entry.lstat().st_atime, entry.lstat().st_mtime + 5), follow_symlinks=False)  # indexed last
    assert [ref.job_id for ref in list_jobs()] == ["41", "40"]
    assert _latest_job().job_id == "40"
