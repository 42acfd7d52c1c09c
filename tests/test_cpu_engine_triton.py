"""The CPU ``tensorrt_llm`` model inside the real tritonserver (nvidia-pytriton's 2.51 + python backend stub).

Loads only the ``tensorrt_llm`` model of a repository written by ``backend.repository`` and streams over gRPC;
with mpirun, runs two tritonservers in leader mode (tp 2) where rank 1 stays in ``initialize()``.
"""
from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from backend.cpu_engine.engine import Engine
from backend.cpu_engine.init_model import create_checkpoint
from backend.cpu_engine.scheduler import GenerationRequest
from tests._env import unavailable

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
PROMPT = [1, 50, 51, 52, 53, 54, 55, 56, 57]


def _server():
    from launcher.server import ServerNotFound, merge_env, resolve

    try:
        return resolve(None), merge_env
    except ServerNotFound as e:
        unavailable(str(e))


def _repo(tmp: Path, ckpt: str, tp: int) -> Path:
    from backend.repository import UPSTREAM_DEFAULTS, write_model_repository

    params = {
        **UPSTREAM_DEFAULTS, "triton_max_batch_size": 4, "decoupled_mode": True, "logits_datatype": "TYPE_FP32",
        "encoder_input_features_data_type": "TYPE_FP16", "preprocessing_instance_count": 1,
        "postprocessing_instance_count": 1, "bls_instance_count": 1, "tokenizer_dir": ckpt, "engine_dir": ckpt,
        "tp_size": tp, "max_tokens_in_paged_kv_cache": 512,
    }
    out = tmp / "repo"
    write_model_repository(out, "cpu", params)
    return out


def _start(tmp: Path, repo: Path, tp: int) -> tuple[subprocess.Popen, int, int, int, Path]:
    from launcher.ports import free_ports

    server, merge_env = _server()
    http, grpc, metrics = free_ports(3)
    env = merge_env(dict(os.environ), {**server.env, "PYTHONPATH": str(ROOT)})
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OPENBLAS_NUM_THREADS": "1"})
    argv = [server.argv0, f"--model-repository={repo}", "--model-control-mode=explicit", "--load-model=tensorrt_llm",
            f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--disable-auto-complete-config",
            "--log-verbose=0"]
    if server.backend_dir:
        argv.append(f"--backend-directory={server.backend_dir}")
    if tp > 1:
        if not shutil.which("mpirun"):
            unavailable("mpirun not installed (apt-get install openmpi-bin)")
        argv = ["mpirun", "-n", str(tp), "--oversubscribe", "--tag-output"] + argv
    log = tmp / "server.log"
    proc = subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"tritonserver exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1).status == 200:
                return proc, http, grpc, metrics, log
        except OSError:
            pass
        time.sleep(0.5)
    _stop(proc)
    pytest.fail(f"tritonserver not ready after 180s:\n{log.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # our own session: the server (and its stubs / mpirun ranks)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode


def _stream(grpc_port: int, n: int) -> list[int]:
    import tritonclient.grpc as grpcclient

    def inp(name: str, arr: np.ndarray, dtype: str):
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(
        "tensorrt_llm",
        [
            inp("input_ids", np.array([PROMPT], np.int32), "INT32"),
            inp("input_lengths", np.array([[len(PROMPT)]], np.int32), "INT32"),
            inp("request_output_len", np.array([[n]], np.int32), "INT32"),
            inp("streaming", np.array([[True]]), "BOOL"),
        ],
        request_id="s1",
        enable_empty_final_response=True,
    )
    tokens: list[int] = []
    while True:
        result, error = results.get(timeout=60)
        assert error is None, error
        final = result.get_response().parameters["triton_final_response"].bool_param
        ids = result.as_numpy("output_ids")
        if ids is not None:
            tokens.extend(int(t) for t in ids.reshape(-1))
        if final:
            break
    client.stop_stream()
    return tokens


@pytest.mark.parametrize("tp", [1, 2])
def test_tensorrt_llm_cpu_streams_in_real_tritonserver(tp: int, tmp_path: Path) -> None:
    if tp > 1:
        pytest.importorskip("mpi4py")
    ckpt = create_checkpoint(tmp_path / "llama", family="llama", seed=6)
    expected = Engine(ckpt).generate(GenerationRequest(input_ids=PROMPT, max_new_tokens=12)).output_ids
    proc, http, grpc, metrics, log = _start(tmp_path, _repo(tmp_path, ckpt, tp), tp)
    try:
        assert _stream(grpc, 12) == expected
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
        assert 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"' in text
        assert "nv_trt_llm_request_metrics" in text
        if tp > 1:
            # stop only the leader's tritonserver (as when rank 0 shuts down): the follower must follow
            ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            os.kill(min(int(r) for r in ranks), signal.SIGTERM)
            proc.wait(90)
    finally:
        code = _stop(proc)
    out = log.read_text()
    if tp > 1:
        assert "follower, waiting for the leader" in out and "leader said stop" in out, out[-4000:]
        assert out.count("Started HTTPService") == 1  # the follower never opened ports
    else:
        assert code in (0, -signal.SIGTERM), out[-4000:]
