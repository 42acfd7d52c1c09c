"""The launcher against the real tritonserver 2.51 of nvidia-pytriton (CPU, python backend).

Each test builds its own tiny model repository and deployment folder, runs ``python -m launcher DIR`` as a
subprocess like srun would, and checks the files and processes it leaves behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher.contracts.layout import JobPaths
from launcher.contracts.rank import JOB_ID_ENV
from launcher.contracts.stop_records import StopNotice
from launcher.node.server import ServerNotFound, resolve

SOURCE_ROOT = Path(__file__).resolve().parent.parent

try:
    SERVER = resolve(None, {})
    SKIP = ""
except ServerNotFound as exc:  # pragma: no cover - depends on the machine
    SERVER, SKIP = None, str(exc)

pytestmark = [
    pytest.mark.triton,
    pytest.mark.timeout(180),
    pytest.mark.skipif(SERVER is None, reason=f"no tritonserver: {SKIP}"),
]

IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
"""

# Emulates a TRT-LLM follower: never returns from initialize() (it would sit in the TP collectives).
BLOCKER = """
import os, subprocess, time

class TritonPythonModel:
    def initialize(self, args):
        # a helper process that would outlive everyone unless the launcher kills the whole process group
        subprocess.Popen(["/bin/sh", "-c", "sleep 300; echo " + args["model_repository"]])
        open(os.environ["BLOCKER_MARKER"], "w").write(str(os.getpid()))
        while True:
            time.sleep(1)

    def execute(self, requests):
        return []
"""

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def make_deployment(root: Path, models: dict[str, str], **plan: object) -> Path:
    repo = root / "triton_model_repo"
    for name, source in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(source)
    launch = {
        "version": 1,
        "name": root.name,
        "deployment_dir": str(root),
        "model_repository": str(repo),
        "tp_size": 1,
        "pp_size": 1,
        "replicas": 1,
        "world_size_per_replica": 1,
        "mode": "leader",
        "tritonserver": None,
        "ports": {"http": "auto", "grpc": "auto", "metrics": "auto"},
        "follower_models": ["identity"],
        "server_args": ["--log-verbose=0"],
        "ready_timeout_s": 60,
        "env": {"PMIX_MCA_gds": "hash"},
        "stop_grace_s": 10,
    }
    launch.update(plan)
    (root / "launch.json").write_text(json.dumps(launch))
    return root


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "PMI_", "HPC_SERVE_"))}
    env["PYTHONPATH"] = str(SOURCE_ROOT)
    env.update(extra)
    return env


class Launcher:
    """``python -m launcher DIR`` in the background, output to files (as srun's per-rank files)."""

    def __init__(self, deployment: Path, job_id: str, **env: str) -> None:
        self.dir, self.job_id = deployment, job_id
        self.out = deployment / f"{job_id}_log.out"
        self.err = deployment / f"{job_id}_log.err"
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", str(deployment)],
            env=clean_env(**{JOB_ID_ENV: job_id}, **env),
            stdout=self.out.open("wb"),
            stderr=self.err.open("wb"),
            cwd=deployment,
        )

    @property
    def paths(self) -> JobPaths:
        return JobPaths(self.dir, self.job_id)

    def wait_for(self, check: Callable[[], object], timeout: float = 60, what: str = "") -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited {self.proc.returncode} while waiting for {what}\n" + self.logs())
            time.sleep(0.02)
        raise AssertionError(f"timeout waiting for {what}\n" + self.logs())

    def endpoint(self, replica: int = 0) -> dict:
        path = self.paths.endpoint(replica)
        return self.wait_for(lambda: path.exists() and json.loads(path.read_text()), what=str(path))  # type: ignore

    def logs(self) -> str:
        return self.out.read_text(errors="replace")[-3000:] + self.err.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def launchers():
    started: list[Launcher] = []
    yield started
    for launcher in started:
        launcher.stop()


def pids_matching(text: str) -> list[int]:
    """PIDs whose command line mentions ``text`` (our tmp repository path is unique per test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and int(entry.name) != os.getpid():
                found.append(int(entry.name))
    return found


def listening_ports(pid: int) -> list[int]:
    """TCP ports in LISTEN state owned by ``pid`` (socket inodes of its fds matched against /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def in_main_loop(pid: int) -> bool:
    """Whether tritonserver ``pid`` reached its main loop, past the point where it starts its endpoints.

    tritonserver 2.51's main(): load the models, install its SIGINT/SIGTERM handler, start the endpoints that
    are allowed, then sleep on its exit condition variable until a signal comes. So: SIGTERM caught (while models
    load it has the disposition it was started with), and its main thread asleep in a futex. With every endpoint
    disallowed nothing between the handler and that sleep blocks; before the handler, the main thread also sleeps
    (waiting for the models' load), which is why both are needed."""
    task = Path(f"/proc/{pid}/task/{pid}")
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        wchan = (task / "wchan").read_text()
        syscall = (task / "syscall").read_text().split()[:1]
    except OSError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    futex = {"x86_64": "202", "aarch64": "98"}.get(os.uname().machine)
    asleep = "futex" in wchan or (futex is not None and syscall == [futex])
    return bool(caught & (1 << (signal.SIGTERM - 1))) and asleep


def http_ready(port: int) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as resp:
        return resp.status


def infer(port: int) -> list[float]:
    body = json.dumps({"inputs": [{"name": "IN", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/identity/infer", data=body, method="POST")
    with opener.open(req, timeout=10) as resp:
        return json.loads(resp.read())["outputs"][0]["data"]


def wait_gone(text: str, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pids_matching(text):
        time.sleep(0.1)
    return pids_matching(text)


def test_leader_publishes_endpoint_and_stops_cleanly_on_sigterm(tmp_path: Path, launchers: list) -> None:
    dep = make_deployment(tmp_path / "dep", {"identity": IDENTITY})
    repo = str(dep / "triton_model_repo")
    run = Launcher(dep, "t1")
    launchers.append(run)
    ep = run.endpoint()
    assert ep["job_id"] == "t1" and ep["replica"] == 0 and ep["rank"] == 0 and ep["version"] == 1
    assert ep["host"] == socket.gethostname()
    assert len({ep["http_port"], ep["grpc_port"], ep["metrics_port"]}) == 3
    assert ep["ready_at"] >= ep["started_at"]
    assert http_ready(ep["http_port"]) == 200
    assert infer(ep["http_port"]) == [1.0, 2.0, 3.0]
    first = run.out.read_text().splitlines()[0]
    assert first.startswith("[hpc-serve] rank 0/1 on ") and "replica 0, leader, cmd: " in first
    assert "shm-region-prefix-name=prefix0_t1_" in first
    stub_pids = [p for p in pids_matching(repo) if p != ep["pid"]]
    assert stub_pids, "python backend stub not found"

    t0 = time.time()
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(40) == 0, run.logs()  # tritonserver stops gracefully → 0
    record = json.loads(run.paths.rank_record(0).read_text())
    assert record["exit_code"] == 0 and record["signal"] is None and record["rank"] == 0
    # the model was told when the stop began and until when its in-flight requests may drain (drain_s 10)
    stop = StopNotice.read(run.paths.stopping(0))
    assert stop is not None and stop.signal == "SIGTERM" and t0 <= stop.at and stop.drain_until == stop.at + 10
    assert "--exit-timeout-secs=10" in first
    assert record["log_tail"] and len(record["log_tail"]) <= 21
    assert not run.paths.endpoint(0).exists()
    assert wait_gone(repo, 30) == [], "tritonserver or triton_python_backend_stub left behind"
    assert "Signal (15) received." in run.err.read_text() + run.out.read_text()  # logs reached our stdout/err


def test_two_deployments_on_one_node_get_different_ports(tmp_path: Path, launchers: list) -> None:
    a = Launcher(make_deployment(tmp_path / "a", {"identity": IDENTITY}), "t1")
    b = Launcher(make_deployment(tmp_path / "b", {"identity": IDENTITY}), "t2")
    launchers += [a, b]
    ea, eb = a.endpoint(), b.endpoint()
    pa = {ea["http_port"], ea["grpc_port"], ea["metrics_port"]}
    pb = {eb["http_port"], eb["grpc_port"], eb["metrics_port"]}
    assert not pa & pb
    assert http_ready(ea["http_port"]) == 200 and http_ready(eb["http_port"]) == 200
    assert infer(eb["http_port"]) == [1.0, 2.0, 3.0]


def test_auto_port_collision_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process grabs the port between our probe and tritonserver's bind: tritonserver fails with
    "already in use", the launcher retries with new ports (in-process, with the probe rigged)."""
    from launcher.contracts import rank
    from launcher.contracts.plan import LaunchPlan
    from launcher.node import ports, run

    dep = make_deployment(tmp_path / "dep", {"identity": IDENTITY})
    holder = socket.socket()
    holder.bind(("", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    real = ports.free_ports
    calls: list[list[int]] = []

    def rigged(count: int, exclude=(), host: str = "") -> list[int]:
        picked = real(count, exclude, host)
        if not calls:
            picked[1] = taken  # grpc port is stolen on the first attempt
        calls.append(picked)
        return picked

    monkeypatch.setattr(ports, "free_ports", rigged)
    plan = LaunchPlan.read(dep)
    info = rank.RankInfo(0, 0, 1, socket.gethostname(), "t1", "single")
    result: dict = {}

    import threading

    def serve() -> None:
        result["rc"] = run.serve(plan, info, rank.role(info, 1, 1, 1), SERVER)  # type: ignore[arg-type]

    thread = threading.Thread(target=serve)
    try:
        thread.start()
        ep_path = JobPaths(dep, "t1").endpoint(0)
        deadline = time.monotonic() + 60
        while not ep_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        ep = json.loads(ep_path.read_text())
        assert len(calls) == 2 and ep["grpc_port"] != taken and taken not in calls[1]
        assert http_ready(ep["http_port"]) == 200
        os.kill(ep["pid"], signal.SIGTERM)
        thread.join(40)
        assert result["rc"] == 0
    finally:
        holder.close()
        wait_gone(str(dep / "triton_model_repo"), 20)


def _follower(
    tmp_path: Path, models: dict[str, str], follower_models: list[str], **plan: object
) -> tuple[Launcher, Path]:
    dep = make_deployment(
        tmp_path / "dep", models, tp_size=2, world_size_per_replica=2, follower_models=follower_models, **plan
    )
    marker = tmp_path / "blocker.pid"
    run = Launcher(
        dep,
        "t1",
        OMPI_COMM_WORLD_RANK="1",
        OMPI_COMM_WORLD_LOCAL_RANK="1",
        OMPI_COMM_WORLD_SIZE="2",
        BLOCKER_MARKER=str(marker),
    )
    return run, marker


def _server_pid(run: Launcher) -> int:
    repo = str(run.dir / "triton_model_repo")
    pids = run.wait_for(
        lambda: [p for p in pids_matching(repo) if Path(f"/proc/{p}/exe").resolve().name == "tritonserver"],
        what="tritonserver",
    )
    return pids[0]  # type: ignore[index]


def test_blocked_follower_opens_no_port_and_sigkill_is_recorded(tmp_path: Path, launchers: list) -> None:
    run, marker = _follower(tmp_path, {"identity": IDENTITY, "blocker": BLOCKER}, ["blocker"])
    launchers.append(run)
    run.wait_for(marker.exists, what="follower model initialize()")
    first = run.out.read_text().splitlines()[0]
    assert "rank 1/2" in first and "replica 0, follower" in first and "--load-model=blocker" in first
    assert "prefix1_t1_" in first
    assert "--allow-http=false --allow-grpc=false --allow-metrics=false" in first
    pid = _server_pid(run)
    assert not in_main_loop(pid), "still loading: a model's initialize() runs"
    assert listening_ports(pid) == []
    assert not run.paths.endpoints_dir.exists()

    os.kill(pid, signal.SIGKILL)
    assert run.proc.wait(30) == 128 + signal.SIGKILL
    record = json.loads(run.paths.rank_record(1).read_text())
    assert record["signal"] == "SIGKILL" and record["exit_code"] == -signal.SIGKILL and record["rank"] == 1
    assert pids_matching(str(run.dir / "triton_model_repo")) == [], "blocked stub or its helper left behind"


def test_follower_that_finishes_loading_still_opens_no_port(tmp_path: Path, launchers: list) -> None:
    """tensorrtllm_backend#243: a follower that does load binds the leader's ports.  Ours cannot bind anything."""
    run, _ = _follower(tmp_path, {"identity": IDENTITY}, ["identity"], release_wait_s=1)
    launchers.append(run)
    run.wait_for(
        lambda: "successfully loaded 'identity'" in run.err.read_text() + run.out.read_text(),
        what="identity loaded on the follower",
    )
    pid = _server_pid(run)
    # not a pause: the point where it would have opened its ports (they start right after loading) has passed
    run.wait_for(lambda: in_main_loop(pid), what="the follower's tritonserver in its main loop")
    assert run.proc.poll() is None and listening_ports(pid) == []
    run.proc.send_signal(signal.SIGTERM)  # no leader to release it: after release_wait_s, SIGTERM (graceful)
    assert run.proc.wait(40) == 0
    assert wait_gone(str(run.dir / "triton_model_repo"), 5) == []


def test_sigterm_on_blocked_follower_waits_for_a_release_then_kills_its_group(tmp_path: Path, launchers: list) -> None:
    """Slurm signals every process of the step: a follower stuck in initialize() survives its own SIGTERM (it
    waits for its leader), and with no release within release_wait_s the launcher kills the whole group."""
    run, marker = _follower(tmp_path, {"blocker": BLOCKER}, ["blocker"], release_wait_s=2)
    launchers.append(run)
    run.wait_for(marker.exists, what="follower model initialize()")
    server = _server_pid(run)
    t0 = time.monotonic()
    for pid in (run.proc.pid, server):
        os.kill(pid, signal.SIGTERM)
    run.wait_for(lambda: "waiting up to 2 s for the leader" in run.err.read_text(), what="the launcher to wait")
    # the bound that is the feature: no release within release_wait_s (2 s) ends the rank. 60 s is for a starved
    # machine; a rank that never gave up would also be caught by it
    assert run.proc.wait(60) == 128 + signal.SIGKILL
    assert time.monotonic() - t0 >= 2.0, "gave up before release_wait_s"  # a timer never fires early
    record = json.loads(run.paths.rank_record(1).read_text())
    # SIGKILL, not the SIGTERM sent above: tritonserver outlived its SIGTERM until the launcher gave up
    assert record["signal"] == "SIGKILL"
    assert "no release from the leader within 2 s" in run.err.read_text()
    assert pids_matching(str(run.dir / "triton_model_repo")) == []  # immediately: the group was killed


# A CPU-engine follower in miniature: sits in initialize() until "the leader says stop" (a file here), then
# leaves exactly as the real one does (backend/models/tensorrt_llm_cpu.py _end_follower_process).
RELEASED = """
import os, time

class TritonPythonModel:
    def initialize(self, args):
        open(os.environ["BLOCKER_MARKER"], "w").write(str(os.getpid()))
        while not os.path.exists(os.environ["BLOCKER_MARKER"] + ".stop"):
            time.sleep(0.05)
        from backend.models.tensorrt_llm_cpu import _end_follower_process
        _end_follower_process()

    def execute(self, requests):
        return []
"""


def test_follower_released_by_its_leader_during_a_stop_exits_cleanly(tmp_path: Path, launchers: list) -> None:
    """The ordered stop of a follower: SIGTERM to the launcher and to tritonserver (as Slurm sends it) changes
    nothing until the leader releases the rank; then the rank ends at once, with exit code 0."""
    run, marker = _follower(tmp_path, {"released": RELEASED}, ["released"], release_wait_s=60)
    launchers.append(run)
    run.wait_for(marker.exists, what="follower model initialize()")
    server = _server_pid(run)
    for pid in (run.proc.pid, server):
        os.kill(pid, signal.SIGTERM)
    run.wait_for(lambda: "waiting up to 60 s for the leader" in run.err.read_text(), what="the launcher to wait")
    assert Path(f"/proc/{server}").exists(), "tritonserver left on its SIGTERM, before its leader"
    Path(str(marker) + ".stop").write_text("")
    # exit 0 is the proof that the release ended it: waiting out release_wait_s (60 s) ends in SIGKILL
    assert run.proc.wait(60) == 0, run.logs()
    record = json.loads(run.paths.rank_record(1).read_text())
    assert record["exit_code"] == 0 and record["signal"] is None
    assert "released by the leader" in run.err.read_text()
    assert wait_gone(str(run.dir / "triton_model_repo"), 5) == []


HANGS_IN_FINALIZE = (
    IDENTITY
    + """
    def finalize(self):
        import time
        while True:
            time.sleep(1)
"""
)


def test_graceful_stop_that_hangs_is_escalated_to_sigkill(tmp_path: Path, launchers: list) -> None:
    """A server that does not finish its graceful stop within stop_grace_s is SIGKILLed with its whole group."""
    dep = make_deployment(
        tmp_path / "dep", {"identity": HANGS_IN_FINALIZE}, stop_grace_s=3, server_args=["--exit-timeout-secs=120"]
    )
    run = Launcher(dep, "t1")
    launchers.append(run)
    run.endpoint()
    t0 = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    # the bound that is the feature: the escalation comes (the drain's ack, then stop_grace_s or the unload's time;
    # ~10 s here). 60 s is for a starved machine; a stop that never escalated would also be caught by it
    assert run.proc.wait(60) == 128 + signal.SIGKILL
    assert time.monotonic() - t0 >= 3, "SIGKILL before stop_grace_s"  # a timer never fires early
    record = json.loads(run.paths.rank_record(0).read_text())
    assert record["signal"] == "SIGKILL"
    assert "still running 3 s after SIGTERM; sending SIGKILL" in run.err.read_text()
    assert not run.paths.endpoint(0).exists()
    assert wait_gone(str(dep / "triton_model_repo"), 2) == []


def test_leader_not_ready_in_time(tmp_path: Path, launchers: list) -> None:
    """ready_timeout_s expires: stop tritonserver, exit 124, rank record says why, no endpoint, no leftovers."""
    dep = make_deployment(tmp_path / "dep", {"blocker": BLOCKER}, ready_timeout_s=2, stop_grace_s=3)
    run = Launcher(dep, "t1", BLOCKER_MARKER=str(tmp_path / "m"))
    launchers.append(run)
    # the bound that is the feature: ready_timeout_s (2 s) ends a rank that never gets ready (then stop_grace_s);
    # 120 s is for a starved machine, and still ends a launcher that waited for good
    assert run.proc.wait(120) == 124
    record = json.loads(run.paths.rank_record(0).read_text())
    assert "ready_timeout_s=2" in record["error"] and "ready_timeout_s=2" in record["log_tail"][-1]
    assert not run.paths.endpoints_dir.exists() or not list(run.paths.endpoints_dir.iterdir())
    assert pids_matching(str(dep / "triton_model_repo")) == []


def test_sigkilled_launcher_leaves_no_tritonserver(tmp_path: Path, launchers: list) -> None:
    """PR_SET_PDEATHSIG: even SIGKILL of the launcher (no chance to clean up) takes tritonserver down."""
    dep = make_deployment(tmp_path / "dep", {"identity": IDENTITY})
    run = Launcher(dep, "t1")
    launchers.append(run)
    run.endpoint()
    run.proc.kill()
    run.proc.wait(10)
    assert wait_gone(str(dep / "triton_model_repo"), 10) == []


def test_two_jobs_with_one_id_on_one_node_keep_their_own_shared_memory(tmp_path: Path, launchers: list) -> None:
    """Two clusters' jobs share ids, and both may run on one host (its /dev/shm shared). The python backend opens its
    regions with open_or_create and builds a new allocator in whatever it opened, so two servers with one region
    name would corrupt each other; 2.51's names its regions <prefix><uuid>, so one job id is safe (which rules
    this cause of the start crash out: docs/decisions.md "The start crash"). Were a release to name them
    <prefix><count> again, this fails."""
    a = Launcher(make_deployment(tmp_path / "a", {"identity": IDENTITY}), "7")
    launchers.append(a)
    ea = a.endpoint()
    assert infer(ea["http_port"]) == [1.0, 2.0, 3.0]
    b = Launcher(make_deployment(tmp_path / "b", {"identity": IDENTITY}), "7")
    launchers.append(b)
    eb = b.endpoint()
    for _ in range(20):  # the first one's stub, after the second's came up beside it
        assert infer(ea["http_port"]) == [1.0, 2.0, 3.0] and infer(eb["http_port"]) == [1.0, 2.0, 3.0]
    a.stop()
    b.stop()
    assert a.proc.returncode == 0 and b.proc.returncode == 0, a.logs() + b.logs()
