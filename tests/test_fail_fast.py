"""Replica steps and fail-fast, without Slurm: a rank's place in a one-replica step (launcher/contracts/rank.py), the
placement of the steps (hpc/spec/placement.py), the stub and peer watches (launcher/node/watch.py) on real processes,
and the removal of a rank's shared-memory regions (launcher/node/command.py). The cluster runs them for real in
tests/test_e2e_replicas_cluster.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc.spec.placement import PlacementError, replica_steps
from launcher.contracts import records
from launcher.contracts.rank import STEP_REPLICA_ENV, RankInfo, WorldSizeError, detect, role
from launcher.contracts.shm import shm_glob_shell, shm_prefix
from launcher.node.command import remove_shm_regions
from launcher.node.watch import PeerWatch, StubWatch, group_stubs, zombie_returncode


# ------------------------------------------------------------------------------------------- rank and place
def test_a_step_is_one_replica_and_files_count_ranks_in_the_job() -> None:
    env = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_ID": "9", STEP_REPLICA_ENV: "3"}
    info = detect(env)
    assert (info.rank, info.world_size, info.step_replica, info.job_rank) == (1, 2, 3, 7)
    me = role(info, tp_size=2, pp_size=1, replicas=4)
    assert (me.replica, me.rank_in_replica, me.leader) == (3, 1, False)
    assert role(RankInfo(0, 0, 2, "n", "9", "slurm", 3), 2, 1, 4).leader
    # without the variable the world holds every replica (mpirun -n, an interactive srun): as before
    assert detect({k: v for k, v in env.items() if k != STEP_REPLICA_ENV}).job_rank == 1


def test_a_step_of_the_wrong_size_or_replica_is_refused_with_the_fix() -> None:
    with pytest.raises(WorldSizeError, match="srun started 4 tasks for replica 1 but a replica has 2 ranks"):
        role(RankInfo(0, 0, 4, "n", "9", "slurm", 1), 2, 1, 2)
    with pytest.raises(WorldSizeError, match=f"{STEP_REPLICA_ENV}=2, but the plan has 2 replicas"):
        role(RankInfo(0, 0, 2, "n", "9", "slurm", 2), 2, 1, 2)


@pytest.mark.parametrize(
    ("replicas", "wpr", "nodes", "tpn", "placed"),
    [
        (2, 2, 2, 2, [(1, 0, False), (1, 1, False)]),  # a replica per node
        (2, 8, 4, 4, [(2, 0, False), (2, 2, False)]),  # a replica on two nodes
        (4, 1, 2, 2, [(1, 0, True), (1, 0, True), (1, 1, True), (1, 1, True)]),  # two replicas per node
        (1, 6, 3, 2, [(3, 0, False)]),
    ],
)
def test_replica_steps_pack_each_replica_onto_its_own_nodes(replicas, wpr, nodes, tpn, placed) -> None:
    steps = replica_steps(replicas, wpr, nodes, tpn)
    assert [(s.nodes, s.relative, s.shares_node) for s in steps] == placed
    assert [list(s.ranks()) for s in steps] == [list(range(k * wpr, (k + 1) * wpr)) for k in range(replicas)]


def test_a_replica_straddling_nodes_is_refused() -> None:
    with pytest.raises(PlacementError, match="make ntasks_per_node divide"):
        replica_steps(2, 3, 3, 2)


# ------------------------------------------------------------------------------------------- shared memory
def test_only_the_ranks_own_regions_are_removed(tmp_path: Path) -> None:
    names = [shm_prefix(1, "70") + "a", shm_prefix(1, "70") + "b", shm_prefix(1, "7") + "c", shm_prefix(11, "70") + "d"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert sorted(remove_shm_regions(1, "70", tmp_path)) == names[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
    assert shm_glob_shell(1) == "/dev/shm/prefix1_${JOB_ID}_*"


# ------------------------------------------------------------------------------------------- the watches
def fake_stub(tmp_path: Path, code: str) -> subprocess.Popen:
    """A process that looks like a python backend stub in /proc (argv[0] the stub, argv[1] a model.py)."""
    model = tmp_path / "repo" / "tensorrt_llm" / "1" / "model.py"
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_text(code)
    return subprocess.Popen(
        [str(tmp_path / "triton_python_backend_stub"), str(model)], executable=sys.executable, start_new_session=True
    )


def wait_until(check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_zombie_returncode_is_read_before_the_reap() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert zombie_returncode(proc.pid) is None  # running
        os.kill(proc.pid, signal.SIGKILL)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped
        assert zombie_returncode(proc.pid) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
    assert zombie_returncode(proc.pid) is None  # reaped: gone


def test_stub_watch_reports_a_killed_stub_with_its_signal(tmp_path: Path) -> None:
    stub = fake_stub(tmp_path, "import time\ntime.sleep(600)\n")
    watch = StubWatch(stub.pid, rescan_s=0.05).start()
    try:
        assert wait_until(lambda: group_stubs(stub.pid)) == {stub.pid: "tensorrt_llm"}
        wait_until(lambda: watch.watching(stub.pid))  # killed before a scan found it, no watch could tell
        os.kill(stub.pid, signal.SIGKILL)
        death = wait_until(lambda: watch.death)
        assert death.signal == "SIGKILL" and death.exit_code == -signal.SIGKILL
        assert f"model 'tensorrt_llm' (pid {stub.pid}) was killed by SIGKILL" in death.why
    finally:
        watch.stop()
        stub.kill()
        stub.wait()


def test_stub_watch_ignores_a_stub_whose_model_was_unloaded(tmp_path: Path) -> None:
    go = tmp_path / "unload"
    stub = fake_stub(tmp_path, f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n")
    watch = StubWatch(stub.pid, rescan_s=0.05).start()
    try:
        wait_until(lambda: watch.watching(stub.pid))
        go.touch()  # exits 0, as at an unload
        os.waitid(os.P_PID, stub.pid, os.WEXITED | os.WNOWAIT)  # it ended (exit 0), not reaped
        wait_until(lambda: stub.pid in watch.ended)  # the watch saw the end: not a pause that may come too soon
        assert watch.ended[stub.pid] == 0 and watch.death is None
    finally:
        watch.stop()
        stub.wait()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_peer_watch_follows_a_failed_peer_to_its_cause(tmp_path: Path) -> None:
    peers = {r: tmp_path / f"rank-{r}.json" for r in (4, 6, 7)}
    clock = Clock()
    watch = PeerWatch(2, peers, every_s=0.5, clock=clock)
    assert watch.check() is None
    records.write_json_atomic(peers[4], records.RankExitRecord(rank=4, exit_code=0).to_dict())  # released: fine
    records.write_json_atomic(
        peers[7], records.RankExitRecord(rank=7, exit_code=-9, signal="SIGKILL", cause_rank=5).to_dict()
    )
    clock.now += 0.1
    assert watch.check() is None  # not yet time to look again
    clock.now += 0.5
    failure = watch.check()
    assert failure is not None and failure.cause_rank == 5
    assert failure.why == "rank 5 of replica 2 failed; this rank of the replica stopped with it"
    watch = PeerWatch(2, {7: peers[7], 6: peers[6]}, clock=clock)
    records.write_json_atomic(peers[6], records.RankExitRecord(rank=6, exit_code=3).to_dict())
    failure = watch.check()
    assert (
        failure is not None
        and failure.cause_rank == 6
        and failure.why.startswith("rank 6 of replica 2 failed (exit code 3)")
    )


def test_the_failed_ranks_record_is_asked_for_before_its_tritonserver_is_killed(tmp_path: Path) -> None:
    """The kill makes MPI peers abort and Slurm may SIGKILL the whole step before the launcher reaps tritonserver
    (a contended CI run lost the record so: `status` said "unknown status"); the record is written first."""
    from launcher.node.supervise import Supervisor
    from launcher.node.watch import Failure

    sup = Supervisor(stop_grace_s=5)
    failure = Failure("the stub died", signal="SIGKILL", exit_code=-signal.SIGKILL)
    sup.watch = lambda _stopping: failure
    seen: list[tuple[bool, float | None]] = []
    sup.before_kill = lambda child: seen.append((child.proc.poll() is None, sup.failed_at))
    child = sup.spawn([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    assert sup.wait(child, interval=0.01) == -signal.SIGKILL
    assert len(seen) == 1 and seen[0][0], "asked once, while tritonserver still ran"
    assert sup.failure is failure and seen[0][1] is not None
