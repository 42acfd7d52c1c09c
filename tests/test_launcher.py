"""Unit tests of the per-rank launcher (no tritonserver needed)."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from launcher.contracts import records
from launcher.contracts.layout import SOURCE_ROOT, JobPaths
from launcher.contracts.plan import LaunchPlan, PlanError
from launcher.contracts.rank import JOB_ID_ENV, RankInfo, WorldSizeError, detect, role
from launcher.node.command import build_argv, remove_orphan_regions, shm_prefix
from launcher.node.ports import PortError, Ports, allocate, check_fixed, free_ports, taken
from launcher.node.server import ServerBinary, ServerNotFound, merge_env, prepare_backends, resolve
from launcher.node.server_env import child_env
from launcher.node.supervise import exit_code, signal_name
from tests.plans import make_plan


# --- rank.py ---------------------------------------------------------------------------------------------------
def test_rank_from_slurm() -> None:
    env = {
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURMD_NODENAME": "node7",
        "SLURM_JOB_ID": "123",
        "PMIX_RANK": "3",
    }
    assert detect(env) == RankInfo(3, 1, 4, "node7", "123", "slurm")


def test_slurm_step_tasks_win_over_allocation_tasks() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_ID": "9"}
    assert detect(env).world_size == 2


def test_rank_from_openmpi_beats_stale_slurm() -> None:
    # mpirun inside an allocation: SLURM_PROCID belongs to the batch step / orted, OMPI_* to us.
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_ID": "55",
    }
    info = detect(env)
    assert (info.rank, info.local_rank, info.world_size, info.job_id, info.source) == (1, 1, 2, "55", "openmpi")


def test_rank_single_process_and_job_ids() -> None:
    info = detect({})
    assert (info.rank, info.local_rank, info.world_size, info.source) == (0, 0, 1, "single")
    assert info.job_id == f"local-{os.getpid()}"
    assert info.node == socket.gethostname()
    assert detect({JOB_ID_ENV: "local-7"}).job_id == "local-7"
    assert detect({JOB_ID_ENV: "local-7", "SLURM_JOB_ID": "42"}).job_id == "42"


def test_pmix_rank_alone_is_not_a_world() -> None:
    assert detect({"PMIX_RANK": "2"}).source == "single"  # PMIx exports no size


def test_world_size_mismatch_message() -> None:
    info = RankInfo(0, 0, 3, "n", "1", "slurm")
    with pytest.raises(WorldSizeError) as err:
        role(info, tp_size=2, pp_size=1, replicas=2)
    assert str(err.value) == (
        "srun started 3 tasks but the spec needs tp_size 2 × pp_size 1 × replicas 2 = 4; ask sbatch/srun for --ntasks=4"
    )


def test_roles_of_two_replicas_of_tp2() -> None:
    roles = [role(RankInfo(r, r % 2, 4, "n", "1", "slurm"), 2, 1, 2) for r in range(4)]
    assert [(x.replica, x.leader) for x in roles] == [(0, True), (0, False), (1, True), (1, False)]
    # orchestrator mode: one process per replica
    assert role(RankInfo(1, 0, 2, "n", "1", "slurm"), 4, 1, 2, world_size_per_replica=1).leader


# --- command.py ------------------------------------------------------------------------------------------------
def test_leader_argv() -> None:
    argv = build_argv(
        "/bin/ts",
        model_repository="/d/repo",
        rank=0,
        job_id="123",
        leader=True,
        ports=Ports(8000, 8001, 8002),
        follower_models=["tensorrt_llm"],
        backend_dir="/be",
        server_args=["--log-verbose=0"],
    )
    assert argv == [
        "/bin/ts",
        "--model-repository=/d/repo",
        "--disable-auto-complete-config",
        "--backend-directory=/be",
        "--backend-config=python,shm-region-prefix-name=prefix0_123_",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--log-verbose=0",
    ]
    bounded = build_argv(
        "/bin/ts",
        model_repository="/d/repo",
        rank=0,
        job_id="1",
        leader=True,
        ports=Ports(8000, 8001, 8002),
        exit_timeout_s=7.5,
        server_args=["--exit-timeout-secs=3"],
    )
    # the drain bound, before the user's own server_args (tritonserver keeps the last value)
    assert [a for a in bounded if a.startswith("--exit-timeout-secs")] == [
        "--exit-timeout-secs=8",
        "--exit-timeout-secs=3",
    ]
    assert bounded[-1] == "--exit-timeout-secs=3"


def test_follower_argv() -> None:
    argv = build_argv(
        "/bin/ts",
        model_repository="/d/repo",
        rank=1,
        job_id="123",
        leader=False,
        follower_models=["tensorrt_llm", "multimodal_encoders"],
    )
    assert "--model-control-mode=explicit" in argv
    assert [a for a in argv if a.startswith("--load-model=")] == [
        "--load-model=tensorrt_llm",
        "--load-model=multimodal_encoders",
    ]
    assert {"--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"} <= set(argv)
    assert not [a for a in argv if a.split("=")[0] in ("--http-port", "--grpc-port", "--metrics-port")]
    assert "--backend-config=python,shm-region-prefix-name=prefix1_123_" in argv
    with pytest.raises(ValueError):
        build_argv("/bin/ts", model_repository="/r", rank=1, job_id="1", leader=False, follower_models=[])


def test_shm_prefixes_distinct_per_rank_and_job() -> None:
    prefixes = {shm_prefix(r, j) for r in range(16) for j in ("123", "124", "local-5")}
    assert len(prefixes) == 48
    assert shm_prefix(0, "123").startswith("prefix0_")
    assert shm_prefix(2, "12_3/x") == "prefix2_12-3-x_"  # array job ids, odd characters


def test_regions_no_process_maps_are_swept_and_live_or_young_ones_kept(tmp_path: Path) -> None:
    """What killed ranks leave (a plain scancel past KillWait, a local job's SIGKILL sweep) adds up in /dev/shm
    (docs/decisions.md "Fail-fast"). A region some process maps is live
    (tritonserver and its stubs map theirs while they run), a young one may be a server's between shm_open and
    mmap, and a file not named as hpc-serve names regions is not its to remove."""
    import mmap

    old = {name: tmp_path / name for name in ("prefix0_3733_a", "prefix1_local-5ff342_b", "prefix0_3734_live")}
    young, other = tmp_path / "prefix2_3735_c", tmp_path / "triton_python_backend_shm_region"
    for path in [*old.values(), young, other]:
        path.write_bytes(b"\0" * 4096)
    for path in [*old.values(), other]:
        os.utime(path, (1.0, 1.0))
    with open(old["prefix0_3734_live"], "r+b") as live, mmap.mmap(live.fileno(), 4096):
        removed = remove_orphan_regions(tmp_path)
    assert sorted(removed) == ["prefix0_3733_a", "prefix1_local-5ff342_b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "prefix0_3734_live",
        "prefix2_3735_c",
        "triton_python_backend_shm_region",
    ]
    assert remove_orphan_regions(tmp_path / "none") == []


# --- server.py -------------------------------------------------------------------------------------------------
def _fake_exe(path: Path) -> str:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_resolution_order(tmp_path: Path) -> None:
    a, b = _fake_exe(tmp_path / "a"), _fake_exe(tmp_path / "b")
    assert resolve(a, {"TRITONSERVER": b}) == ServerBinary(a, {}, None, "launch.json tritonserver")
    assert resolve(None, {"TRITONSERVER": b}).argv0 == b
    with pytest.raises(ServerNotFound, match="TRITONSERVER"):
        resolve(None, {"TRITONSERVER": str(tmp_path / "missing")})
    with pytest.raises(ServerNotFound, match="launch.json"):
        resolve(str(tmp_path / "nope"), {"TRITONSERVER": b})


def test_resolution_falls_back_to_wheel_or_explains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("launcher.node.server.NGC_TRITONSERVER", str(tmp_path / "opt-missing"))
    monkeypatch.setattr("launcher.node.server._pytriton_root", lambda: None)
    with pytest.raises(ServerNotFound) as err:
        resolve(None, {})
    msg = str(err.value)
    assert "launch.json tritonserver: not set" in msg and "$TRITONSERVER: not set" in msg
    assert "opt-missing" in msg and "nvidia-pytriton" in msg
    monkeypatch.setattr("launcher.node.server.NGC_TRITONSERVER", _fake_exe(tmp_path / "ngc"))
    assert resolve(None, {}).source == "NGC default"


def test_private_backends_dir_is_built_once_atomically(tmp_path: Path) -> None:
    wheel = tmp_path / "wheel" / "backends"
    (wheel / "python").mkdir(parents=True)
    (wheel / "python" / "libtriton_python.so").write_bytes(b"so")
    stub = tmp_path / "stub"
    stub.write_bytes(b"stub")
    first = prepare_backends(wheel, stub, tmp_path / "cache")
    assert (first / "python" / "triton_python_backend_stub").read_bytes() == b"stub"
    assert os.access(first / "python" / "triton_python_backend_stub", os.X_OK)
    assert (first / "python" / "libtriton_python.so").is_file()
    assert prepare_backends(wheel, stub, tmp_path / "cache") == first
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]  # no temp leftovers


def test_env_merging_prepends_paths() -> None:
    env = merge_env({"LD_LIBRARY_PATH": "/x:/y", "A": "1"}, {"LD_LIBRARY_PATH": "/lib:/y", "A": "2"})
    assert env == {"LD_LIBRARY_PATH": "/lib:/y:/x", "A": "2"}


def test_child_env(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, model_repository="/r", env={"PMIX_MCA_gds": "hash"})
    env = child_env(plan, ServerBinary("/ts", {"LD_LIBRARY_PATH": "/libs"}), base={"PYTHONPATH": "/u"})
    assert env["PMIX_MCA_gds"] == "hash"
    assert env["LD_LIBRARY_PATH"] == "/libs"
    assert env["PYTHONPATH"].split(":") == [str(SOURCE_ROOT), "/u"]
    assert (SOURCE_ROOT / "launcher").is_dir()


def test_child_env_hands_the_model_its_place(tmp_path: Path) -> None:
    """The launcher decides world size, replica and ranks per replica; the model reads only that."""
    from launcher.contracts.rank import placement

    plan = make_plan(tmp_path, model_repository="/r", tp_size=2, replicas=2, world_size_per_replica=2)
    info = RankInfo(rank=3, local_rank=1, world_size=4, node="n", job_id="9", source="slurm")
    me = role(info, 2, 1, 2)
    env = child_env(plan, ServerBinary("/ts", {}), base={}, info=info, me=me)
    assert env["PMIX_MCA_gds"] == "hash", "launch.json's defaults apply to a hand-written plan too"
    place = placement(env)
    assert (place.world_size, place.replica, place.ranks_per_replica) == (4, 1, 2)
    assert place.release_file == str(JobPaths(tmp_path, "9").released(3)) and place.stop_file is None


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity API on this platform")
def test_blas_threads_stay_within_the_cores_the_rank_may_use(tmp_path: Path) -> None:
    """A rank confined to one core (taskset, a cgroup) gets one BLAS thread, not one per core of the node."""
    import subprocess

    code = (
        "import os, sys; from pathlib import Path; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "from launcher.contracts.plan import LaunchPlan; from launcher.contracts.rank import RankInfo, role;"
        "from launcher.node.server_env import child_env; from launcher.node.server import ServerBinary;"
        f"plan = LaunchPlan(deployment_dir=Path({str(tmp_path)!r}), model_repository='/r', replicas=1,"
        " world_size_per_replica=1);"
        "info = RankInfo(rank=0, local_rank=0, world_size=1, node='n', job_id='9', source='slurm');"
        "env = child_env(plan, ServerBinary('/ts', {}), base={}, info=info, me=role(info, 1, 1, 1));"
        "print(env['OPENBLAS_NUM_THREADS'], env['OMP_NUM_THREADS'])"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SOURCE_ROOT, check=True)
    assert run.stdout.split() == ["1", "1"], run.stderr


@pytest.mark.parametrize(("on_node", "per_node", "threads"), [("1", "1", "1"), ("2", "2(x3)", "1")])
def test_blas_threads_share_the_jobs_cores_on_the_node(tmp_path: Path, on_node: str, per_node: str, threads: str):
    """Slurm's SLURM_CPUS_ON_NODE (the job's cores there, which a cgroup enforces) shared by the node's ranks,
    not the node's core count."""
    plan = make_plan(tmp_path, model_repository="/r")
    info = RankInfo(rank=0, local_rank=0, world_size=1, node="n", job_id="9", source="slurm")
    base = {"SLURM_CPUS_ON_NODE": on_node, "SLURM_TASKS_PER_NODE": per_node}
    env = child_env(plan, ServerBinary("/ts", {}), base=base, info=info, me=role(info, 1, 1, 1))
    assert env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"] == threads


@pytest.mark.parametrize(
    ("env", "ranks"),
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}, 1),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "1"}, 2),
        ({"SLURM_STEP_TASKS_PER_NODE": "1,2(x2)", "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "4"}, 2),
        ({"SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1"}, 4),
        ({"SLURM_TASKS_PER_NODE": "garbled", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, 3),
        ({}, 1),
    ],
)
def test_ranks_on_this_node_read_slurms_per_node_counts_at_this_nodes_index(env: dict, ranks: int) -> None:
    from launcher.node.server_env import ranks_on_this_node

    assert ranks_on_this_node(env) == ranks


def test_placement_without_a_launcher_reads_the_starter_like_the_launcher() -> None:
    from launcher.contracts.rank import placement

    assert placement({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3"}).ranks_per_replica == 3
    assert placement({"PMIX_SIZE": "4", "SLURM_NTASKS": "4"}).world_size == 1, "not a world size (rank.py)"
    assert placement({}).world_size == 1


# --- ports.py --------------------------------------------------------------------------------------------------
def test_auto_ports_are_distinct_and_free() -> None:
    ports, auto = allocate({"http": "auto", "grpc": "auto", "metrics": "auto"})
    assert auto == {"http", "grpc", "metrics"}
    values = list(ports.as_dict().values())
    assert len(set(values)) == 3
    for p in values:  # really free
        with socket.socket() as s:
            s.bind(("", p))


def test_fixed_ports_honoured_and_avoid_list() -> None:
    ports, auto = allocate({"http": 18080, "grpc": "auto", "metrics": "auto"}, avoid={18081})
    assert ports.http == 18080 and auto == {"grpc", "metrics"}
    assert 18081 not in (ports.grpc, ports.metrics)
    with pytest.raises(PortError):
        allocate({"http": 18080, "grpc": 18080, "metrics": 1})
    with pytest.raises(PortError):
        allocate({"http": "eighty"})


def test_free_ports_skip_excluded(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = free_ports(1)[0]
    assert taken not in free_ports(3, exclude={taken})


def test_fixed_port_taken_is_a_clear_error() -> None:
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ports, auto = allocate({"http": port, "grpc": "auto", "metrics": "auto"})
        with pytest.raises(PortError, match=f"http port {port} .*already in use"):
            check_fixed(ports, auto)
    check_fixed(ports, auto)  # released → fine


def test_taken_ports_are_told_by_binding_them_not_by_log_text() -> None:
    """A collision is a port another process holds now (launcher/node/ports.py `taken`), whatever a log says."""
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        free = free_ports(2, exclude={port})
        ports = Ports(http=free[0], grpc=port, metrics=free[1])
        assert taken(ports) == {"grpc": port}
    assert taken(ports) == {}, "released: free again"
    with socket.socket() as client, socket.socket() as server:  # a closed connection in TIME_WAIT is no collision
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", free[0]))
        server.listen()
        client.connect(("127.0.0.1", free[0]))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end waits in TIME_WAIT
    assert taken(Ports(http=free[0], grpc=free[1], metrics=port)) == {}


# --- records / supervise ---------------------------------------------------------------------------------------
def test_atomic_json(tmp_path: Path) -> None:
    path = JobPaths(tmp_path, "7").endpoint(1)
    records.write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert path == tmp_path / "jobs" / "7" / "endpoints" / "replica-1.json"
    assert [p.name for p in path.parent.iterdir()] == ["replica-1.json"]


def test_advertised_address_never_loopback_multi_node() -> None:
    addr = records.advertised_address(
        "no-such-host.invalid", single_node=False, env={"HPC_SERVE_ROUTE_PROBE": "10.255.255.255"}
    )
    assert not addr.startswith("127.")
    assert records.advertised_address("n", False, {"HPC_SERVE_ADVERTISE_ADDRESS": "10.1.2.3"}) == "10.1.2.3"


def test_exit_codes() -> None:
    assert (exit_code(0), exit_code(3), exit_code(-9), exit_code(-15)) == (0, 3, 137, 143)
    assert (signal_name(-9), signal_name(0), signal_name(None)) == ("SIGKILL", None, None)


def test_plan_loading(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="not found"):
        LaunchPlan.read(tmp_path)
    shape = {"replicas": 1, "world_size_per_replica": 2}
    (tmp_path / "launch.json").write_text(json.dumps({"version": 1, "model_repository": "repo", "tp_size": 2, **shape}))
    plan = LaunchPlan.read(tmp_path)
    assert plan.model_repository == str(tmp_path / "repo") and plan.tp_size == 2 and plan.replicas == 1


def test_main_refuses_wrong_world_and_writes_rank_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import launcher

    (tmp_path / "launch.json").write_text(
        json.dumps(
            {
                "version": 1,
                "model_repository": "repo",
                "tp_size": 2,
                "pp_size": 1,
                "replicas": 2,
                "world_size_per_replica": 2,
            }
        )
    )
    for k in [k for k in os.environ if k.startswith(("SLURM_", "OMPI_", "PMI"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert launcher.main([str(tmp_path)]) == 2
    assert "ask sbatch/srun for --ntasks=4" in capsys.readouterr().err
    record = json.loads(JobPaths(tmp_path, "77").rank_record(0).read_text())
    assert record["exit_code"] == 2 and "--ntasks=4" in record["error"]


@pytest.mark.slow
def test_stdlib_only() -> None:
    """launcher/ may run where only the source tree is mounted: import it with site-packages disabled."""
    import subprocess

    code = (
        "import sys; sys.path=[p for p in sys.path if 'site-packages' not in p]; "
        "import launcher, launcher.node.run, launcher.node.server, launcher.node.server_env, launcher.node.supervise; print('ok')"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=SOURCE_ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_dry_run_prints_the_follower_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import launcher

    exe = _fake_exe(tmp_path / "ts")
    (tmp_path / "launch.json").write_text(
        json.dumps(
            {
                "version": 1,
                "model_repository": "repo",
                "tp_size": 2,
                "replicas": 1,
                "world_size_per_replica": 2,
                "tritonserver": exe,
                "follower_models": ["tensorrt_llm"],
                "server_args": ["--log-verbose=1"],
            }
        )
    )
    for k in [k for k in os.environ if k.startswith(("SLURM_", "OMPI_", "PMI"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv(JOB_ID_ENV, "local-3")
    assert launcher.main([str(tmp_path), "--dry-run"]) == 0
    assert capsys.readouterr().out.split() == [
        exe,
        f"--model-repository={tmp_path / 'repo'}",
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix1_local-3_",
        "--exit-timeout-secs=10",
        "--model-control-mode=explicit",
        "--load-model=tensorrt_llm",
        "--allow-http=false",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--log-verbose=1",
    ]


def test_every_workflow_and_rank_has_one_role(tmp_path: Path) -> None:
    """launcher/node/run.py ROLES: the launcher's one workflow decision covers every workflow, leader or not, and
    each role says what it runs: a leader serves on ports, a follower on none; an llmapi worker runs no
    tritonserver."""
    from launcher.contracts.llmapi import LLMAPI, WORKFLOWS
    from launcher.node import run

    assert set(run.ROLES) == {(workflow, leader) for workflow in WORKFLOWS for leader in (True, False)}
    server = ServerBinary("/ts")
    for (workflow, leader), kind in run.ROLES.items():
        info = RankInfo(0 if leader else 1, 0, 2, "n", "7", "single")
        plan = make_plan(tmp_path, world_size_per_replica=2, workflow=workflow)
        rank = run.rank_role(plan, info, role(info, 2, 1, 1), server)
        assert type(rank) is kind and rank.leads is leader
        ports = rank.dry_run_ports()
        assert (ports is not None) is leader
        argv = rank.argv(ports)
        assert (argv[0] == "/ts") is not (workflow == LLMAPI and not leader), (kind, argv)


def test_states_keep_their_text_in_records(tmp_path: Path) -> None:
    """The launcher's states are str Enums: a startup record carries the phase's text, as before, and one read
    back (plain text) equals its Phase."""
    from launcher.node.ready import ReadyState
    from launcher.node.stop import KILL, TERM, WAIT

    path = tmp_path / "replica-0.starting"
    records.StartupRecord(replica=0, phase=records.WARMING_UP, since=1.0).write(path)
    assert json.loads(path.read_text())["phase"] == "warming-up"
    read = records.StartupRecord.read(path)
    assert read is not None and read.phase == records.Phase.WARMING_UP and "warming up" in read.describe(2.0)
    assert [p.value for p in records.PHASES] == ["loading", "warming-up"]
    assert (WAIT, TERM, KILL) == ("wait", "term", "kill")
    assert ReadyState("ready-timeout") is ReadyState.READY_TIMEOUT
