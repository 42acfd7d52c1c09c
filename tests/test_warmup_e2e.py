"""READY means a token came back, against the real tritonserver 2.51 (nvidia-pytriton, CPU).

- the launcher with hand-made `ensemble` models (python backend): one that loads and fails every request, one
  that never answers, a decoupled one that answers: the first two end the rank with exit 4 and the server's
  error (or the timeout) in the exit record, and no endpoint is ever published;
- a local job of the real repository (CPU engine) whose postprocessing fails every request: `hpc-serve status`
  never says READY and ends FAILED naming the server's error; the same job unbroken reaches READY
  (tests/test_e2e_local.py, test_launcher_triton.py).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_launcher_triton import SERVER, SKIP, Launcher, make_deployment, pids_matching

pytestmark = [
    pytest.mark.triton,
    pytest.mark.timeout(240),
    pytest.mark.skipif(SERVER is None, reason=f"no tritonserver: {SKIP}"),
]

ENSEMBLE_CONFIG = """name: "ensemble"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: {decoupled} }}
input [ {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
        {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

FAILS = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("tokenizer is broken: every request fails"))
                for _ in requests]
"""

HANGS = """
import time

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(60)
        return []
"""

DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):  # one response per token, as a streaming engine sends them
                text = pb_utils.Tensor("text_output", np.array([f"t{i}".encode()], dtype=object))
                sender.send(pb_utils.InferenceResponse([text]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture
def launchers() -> Iterator[list[Launcher]]:
    """Launchers a test started, stopped at its end (SIGTERM, then SIGKILL)."""
    started: list[Launcher] = []
    yield started
    for run in started:
        run.stop()


def ensemble_deployment(root: Path, source: str, decoupled: bool = False, **plan: object) -> Path:
    (root / "triton_model_repo").mkdir(parents=True)
    dep = make_deployment(root, {}, **plan)
    model = dep / "triton_model_repo" / "ensemble"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(ENSEMBLE_CONFIG.format(decoupled=str(decoupled).lower()))
    (model / "1" / "model.py").write_text(source)
    return dep


def test_a_model_that_fails_every_request_never_publishes_and_fails_the_rank(tmp_path: Path, launchers) -> None:
    dep = ensemble_deployment(tmp_path / "dep", FAILS)
    run = Launcher(dep, "w1")
    launchers.append(run)
    assert run.proc.wait(120) == 4, run.logs()
    record = json.loads(run.paths.rank_record(0).read_text())
    assert record["exit_code"] == 4 and record["signal"] is None, record
    assert "warm-up request (one token through ensemble" in record["error"], record
    assert "tokenizer is broken: every request fails" in record["error"], "the server's own error text"
    assert record["log_tail"][-1] == record["error"]
    assert not run.paths.endpoints_dir.exists() or not list(run.paths.endpoints_dir.iterdir()), "nothing published"
    assert pids_matching(str(dep / "triton_model_repo")) == []


def test_a_warm_up_without_an_answer_times_out_and_says_what_it_waited_for(tmp_path: Path, launchers) -> None:
    dep = ensemble_deployment(tmp_path / "dep", HANGS, warmup_timeout_s=2, stop_grace_s=3)
    run = Launcher(dep, "w2")
    launchers.append(run)
    starting = run.paths.starting(0)
    phases = set()
    deadline = time.monotonic() + 120
    while run.proc.poll() is None and time.monotonic() < deadline:
        try:
            phases.add(json.loads(starting.read_text())["phase"])
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    assert run.proc.wait(30) == 4, run.logs()
    assert phases == {"loading", "warming-up"}, phases
    assert not starting.exists(), "removed when the rank ended"
    record = json.loads(run.paths.rank_record(0).read_text())
    assert "no answer within warmup_timeout_s=2 s" in record["error"], record
    assert pids_matching(str(dep / "triton_model_repo")) == []


def test_a_decoupled_model_streaming_several_responses_warms_up(tmp_path: Path, launchers) -> None:
    """generate_stream takes a decoupled model (generate refuses one that sends more than one response)."""
    dep = ensemble_deployment(tmp_path / "dep", DECOUPLED, decoupled=True)
    run = Launcher(dep, "w3")
    launchers.append(run)
    endpoint = run.endpoint()
    assert endpoint["ready_at"] > endpoint["started_at"]
    assert not run.paths.starting(0).exists(), "READY: no startup record left"
    assert "warm-up: one token through ensemble came back in" in run.err.read_text()


BROKEN_POSTPROCESSING = '''

import triton_python_backend_utils as pb_utils  # noqa: E402

from backend.models.postprocessing import TritonPythonModel as _Loads  # noqa: E402


class TritonPythonModel(_Loads):
    """Loads as the real one does; fails every request (a test's broken model)."""

    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("detokenizer broken on purpose"))
                for _ in requests]
'''


def test_local_job_whose_model_fails_every_request_is_never_ready_and_fails_with_the_reason(
    tmp_path, tiny_gpt2, hpc_home
) -> None:
    """The real repository (CPU engine) with a postprocessing model that loads and fails every request, run
    by the local executor: STARTING (loading the models, then warming up), never READY, then FAILED with the
    server's error in `status`; nothing of the job is left."""
    from hpc.jobs.executors import LocalExecutor
    from hpc.jobs.kinds import ServingJob
    from hpc.jobs.track import job_status
    from hpc.scheduler.index import JobRef
    from tests.e2e import cli, processes_under, wait_for, write_spec

    deploy = tmp_path / "broken"
    cli("render", str(write_spec(tmp_path, "broken", tiny_gpt2)), "-o", str(deploy))
    shim = deploy / "triton_model_repo" / "postprocessing" / "1" / "model.py"
    shim.write_text(shim.read_text() + BROKEN_POSTPROCESSING)
    ref: JobRef = LocalExecutor().submit(ServingJob, deploy)
    seen: list[str] = []

    def ended() -> bool:
        status = job_status(ref)
        if not seen or seen[-1] != status.summary():
            seen.append(status.summary())
        return status.done

    try:
        wait_for(ended, 120, "the job to end", interval=0.05)
    finally:
        if not job_status(ref).done:
            cli("cancel", ref.job_id, check=False)
    assert not any(" READY" in line.split("\n")[0] for line in seen), seen
    assert any("replica 0: loading the models" in line for line in seen), seen
    text = cli("status", ref.job_id, check=False).stdout
    assert re.match(rf"{ref.job_id} FAILED\nrank 0 on \S+ exited with exit code 4: warm-up request \(", text), text
    assert "detokenizer broken on purpose" in text, "the server's own error text"
    record = json.loads(cli("status", ref.job_id, "--json", check=False).stdout)["failed_rank"]
    assert record["exit_code"] == 4 and "detokenizer broken on purpose" in record["error"]
    assert wait_for(lambda: not processes_under(deploy), 30, "no process of the job left")


@pytest.mark.cluster
@pytest.mark.slow
def test_cluster_tp2_job_whose_model_fails_every_request_fails_with_the_reason(
    slurm_cluster, hpc_home, tritonserver, tmp_path, tiny_gpt2
) -> None:
    """The same broken model on the test cluster, tp 2 across node1/node2, submitted by hand (`sbatch D/….sub`):
    only the leader warms up; its failure ends the follower too (its peer watch), the job is FAILED naming rank
    0 and the server's error, never READY, and no process of it is left."""
    import subprocess

    from hpc.jobs.track import job_status
    from hpc.scheduler.index import JobRef
    from launcher.contracts.layout import JobPaths
    from tests.e2e import cli, processes_under, rank_records, wait_for, write_spec

    deploy = tmp_path / "broken-tp2"
    cli("render", str(write_spec(tmp_path, "broken2", tiny_gpt2, tp=2, nodes=2)), "-o", str(deploy))
    shim = deploy / "triton_model_repo" / "postprocessing" / "1" / "model.py"
    shim.write_text(shim.read_text() + BROKEN_POSTPROCESSING)
    sbatch = subprocess.run(["sbatch", "--parsable", str(deploy / "tensorrt_llm_triton.sub")], capture_output=True)
    assert sbatch.returncode == 0, sbatch.stderr
    job = sbatch.stdout.decode().strip().split(";")[0]
    ref = JobRef(job, JobPaths(deploy, job).folder)
    seen: list[str] = []

    def ended() -> bool:  # FAILED shows before Slurm ends the job (the rank record); wait for Slurm too
        status = job_status(ref)
        if not seen or seen[-1] != status.state:
            seen.append(status.state)
        return status.done and status.scheduler_state not in ("RUNNING", "COMPLETING")

    try:
        wait_for(ended, 240, "the job to end", interval=0.2)
    except AssertionError:
        subprocess.run(["scancel", job], capture_output=True)
        raise
    assert "READY" not in seen and seen[-1] == "FAILED", seen
    text = cli("status", job, check=False).stdout
    assert re.match(rf"{job} FAILED\nrank 0 on node\d exited with exit code 4: warm-up request \(", text), text
    assert "detokenizer broken on purpose" in text, text
    follower = rank_records(ref.job_dir)[1]
    assert follower.cause_rank == 0 or not follower.failed, follower
    wait_for(lambda: not processes_under(deploy), 60, "no process of the job left")


def test_local_job_not_decoupled_warms_up(tmp_path, tiny_gpt2, hpc_home) -> None:
    """`triton.decoupled: false` (the ensemble not decoupled): the same generate_stream warm-up serves it."""
    from tests.e2e import cli, processes_under, wait_for, write_spec

    spec = write_spec(tmp_path, "plain", tiny_gpt2, triton={"decoupled": False})
    proc = cli("submit", str(spec), "--executor", "local", "--wait", "--timeout", "200", check=False, timeout=240)
    job, job_dir = (proc.stdout.split() + ["?", "?"])[:2]
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert re.search(r" READY http://", proc.stderr), proc.stderr
        log = Path(job_dir, f"{job}_0_log.err").read_text()
        assert "warm-up: one token through ensemble came back in" in log, log
        assert (
            "decoupled: false"
            in (Path(job_dir).parent.parent / "triton_model_repo/tensorrt_llm/config.pbtxt").read_text()
        )
    finally:
        cli("cancel", job, check=False)
    wait_for(lambda: not processes_under(Path(job_dir).parent.parent), 30, "no process of the job left")
