"""The launcher's llmapi pieces that need no engine (launcher/node/llmapi.py): the image's model files copied into
the repository or a clear refusal, tritonserver's environment without the MPI job, the leader node's end."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from launcher.contracts.llmapi import IPC_ADDR_VAR, IPC_HMAC_KEY_VAR, MODEL_FILES, SPAWN_PROXY_VAR, without_mpi
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.records import RankExitRecord
from launcher.node.llmapi import LeaderNode, ModelFilesMissing, copy_model_files, model_version_dir
from launcher.node.warmup import LLMAPI_BODY, choose
from launcher.node.watch import _stat_fields
from tests.plans import make_plan


def _plan(tmp_path: Path, **keys) -> LaunchPlan:
    repo = tmp_path / "repo"
    (repo / "tensorrt_llm" / "1").mkdir(parents=True, exist_ok=True)
    return make_plan(tmp_path, model_repository=str(repo), workflow="llmapi", **keys)


def test_the_images_model_files_are_copied_into_the_repository(tmp_path):
    image = tmp_path / "app"
    image.mkdir()
    for name in MODEL_FILES:
        (image / name).write_text(f"# {name} of the image\n")
    plan = _plan(tmp_path, model_files_from=str(image))
    written = copy_model_files(plan)
    assert [p.name for p in written] == list(MODEL_FILES)
    for name in MODEL_FILES:
        assert (model_version_dir(plan) / name).read_text() == f"# {name} of the image\n"
    assert sorted(p.name for p in model_version_dir(plan).iterdir()) == sorted(MODEL_FILES)  # no temporary left


def test_a_missing_model_file_names_it_and_the_fix(tmp_path):
    image = tmp_path / "app"
    image.mkdir()
    (image / "model.py").write_text("")
    plan = _plan(tmp_path, model_files_from=str(image))
    with pytest.raises(ModelFilesMissing) as info:
        copy_model_files(plan)
    assert str(image / "helpers.py") in str(info.value) and "model_files_from" in str(info.value)
    assert not (model_version_dir(plan) / "model.py").exists()  # nothing half-done


def test_no_source_means_the_model_is_in_the_repository_already(tmp_path):
    assert copy_model_files(_plan(tmp_path)) == []


def test_tritonserver_runs_without_the_mpi_job_and_with_the_proxy(tmp_path):
    env = {"OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0", "SLURM_PROCID": "0", "PMI_SIZE": "2", "PATH": "/bin"}
    env |= {"HPC_SERVE_JOB_ID": "7", "UCX_TLS": "tcp", "CUDA_VISIBLE_DEVICES": "0,1"}
    node = LeaderNode(_plan(tmp_path, backend="cpu"), env)
    server = node.server_env(env)
    assert server == without_mpi(env) | node.proxy
    assert {"PATH", "HPC_SERVE_JOB_ID", "CUDA_VISIBLE_DEVICES"} <= server.keys()
    assert not any(k.startswith(("OMPI_", "PMIX_", "SLURM_", "PMI_", "UCX_")) for k in server)
    assert node.env["SLURM_PROCID"] == "0" and node.env[IPC_HMAC_KEY_VAR] == server[IPC_HMAC_KEY_VAR]
    assert server[SPAWN_PROXY_VAR] == "1" and server[IPC_ADDR_VAR] == f"tcp://127.0.0.1:{node.port}"
    assert bytes.fromhex(server[IPC_HMAC_KEY_VAR])  # TensorRT-LLM reads it with bytes.fromhex
    assert LeaderNode(_plan(tmp_path, backend="cpu"), env).proxy[IPC_HMAC_KEY_VAR] != server[IPC_HMAC_KEY_VAR]


@pytest.mark.slow
def test_a_leader_node_that_ignores_sigterm_is_ended_with_its_group(tmp_path):
    """end(): SIGTERM is ignored by the leader node (Slurm signals every process of a step), so SIGKILL ends it
    and the child it started, and the rank leaves nothing behind."""
    node = LeaderNode(_plan(tmp_path, backend="cpu"), dict(os.environ))
    script = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); time.sleep(300)"
    node.argv = [sys.executable, "-c", script]
    child = node.start()
    assert child.proc.stdout is not None
    while not node.ring:  # its first line: the grandchild's pid
        assert child.proc.poll() is None
        time.sleep(0.01)
    grandchild = int(node.ring[0])
    node.end_patience = (0.1, 0.2)
    rc = node.end()
    assert (rc, node.signalled) == (-signal.SIGKILL, "SIGKILL"), "the rank's record says what it took"
    while (fields := _stat_fields(grandchild)) is not None and fields[0] != "Z":  # gone, or dead and not yet reaped
        time.sleep(0.01)


def test_a_killed_leader_node_is_a_failure_naming_it_and_its_signal(tmp_path):
    """death(): the leader node SIGKILLed while tritonserver serves is the rank's failure; its record counts as
    failed (records.RankExitRecord.failed), so peers stop and `status` names rank 0."""
    node = LeaderNode(_plan(tmp_path, backend="cpu"), dict(os.environ))
    node.argv = [sys.executable, "-c", "import time; time.sleep(300)"]
    child = node.start()
    assert node.death() is None
    child.proc.kill()
    child.proc.wait()
    failure = node.death()
    assert failure is not None and failure.signal == "SIGKILL" and failure.exit_code == -signal.SIGKILL
    assert "the leader node" in failure.why and "SIGKILL" in failure.why
    record = RankExitRecord(rank=0, exit_code=failure.exit_code, signal=failure.signal)
    assert record.failed and RankExitRecord(rank=0, signal="SIGKILL").failed
    node.end()


def test_the_warmup_of_an_llmapi_repository_speaks_its_contract(tmp_path):
    plan = _plan(tmp_path)
    (model_version_dir(plan) / "model.yaml").write_text("backend: pytorch\n")
    warm = choose(Path(plan.model_repository), 30.0)
    assert warm is not None and warm.model == "tensorrt_llm" and warm.body == LLMAPI_BODY
    assert set(LLMAPI_BODY) == {"text_input", "sampling_param_max_tokens"}


#: a leader node's stand-in for send_stop_action: as the leader it sleeps; run with `--action stop` it writes its
#: pid to the file named by STOP_MARK, then does what STOP_HOW says (return, or hang)
_STOP_SCRIPT = """
import os, sys, time
if "--action" in sys.argv:
    with open(os.environ["STOP_MARK"], "w") as f:
        f.write(str(os.getpid()))
    if os.environ.get("STOP_HOW") == "hang":
        time.sleep(300)
    sys.exit(0)
time.sleep(300)
"""


def _stop_node(tmp_path: Path, how: str, version: str = "1.2.1") -> LeaderNode:
    node = LeaderNode(_plan(tmp_path, backend="cpu"), dict(os.environ))
    node.argv = [sys.executable, "-c", _STOP_SCRIPT]
    node.env = {**node.env, "STOP_MARK": str(tmp_path / "stop.pid"), "STOP_HOW": how}
    node.version = version
    return node


def test_the_stop_action_goes_only_to_a_live_leader_node_of_a_release_that_has_it(tmp_path):
    """send_stop_action: `--action stop` reaches a running leader node of 1.0 or later; a dead leader node gets
    nothing (a stop sent then would start a leader node of its own on 1.x, and a server on 0.x), and neither does
    a release before 1.0 (its module takes no arguments: it would start a second server)."""
    mark = tmp_path / "stop.pid"
    for release, sent in [("1.2.1", True), ("1.0.0", True), ("1.1.0", True), ("0.20.0", False)]:
        mark.unlink(missing_ok=True)
        node = _stop_node(tmp_path, "return", release)
        node.start()
        node.send_stop_action()
        assert mark.exists() == sent, release
        node.end_patience = (0.1, 0.1)
        node.end()
    mark.unlink(missing_ok=True)
    dead = _stop_node(tmp_path, "return")
    child = dead.start()
    child.proc.kill()
    child.proc.wait()
    dead.send_stop_action()
    assert not mark.exists(), "a dead leader node is sent no stop"
    dead.end()


def test_a_hung_stop_action_is_cut_at_its_time_box(tmp_path, monkeypatch, capsys):
    """A `--action stop` that never returns (a leader node that does not answer) is ended at STOP_ACTION_S: the
    launcher goes on to end the leader node itself, and the hung command is not left behind."""
    import launcher.node.llmapi as llmapi

    monkeypatch.setattr(llmapi, "STOP_ACTION_S", 0.5)
    node = _stop_node(tmp_path, "hang")
    node.start()
    node.send_stop_action()  # returns: the time box cut it
    hung = int((tmp_path / "stop.pid").read_text())
    while (fields := _stat_fields(hung)) is not None and fields[0] != "Z":  # killed by the time box
        time.sleep(0.01)
    assert "timed out" in capsys.readouterr().err
    node.end_patience = (0.1, 0.1)
    assert node.end() == -signal.SIGKILL, "the leader node ignores SIGTERM, as it does under Slurm"
