"""Helpers of the llmapi tests on the CPU engine (tests/test_llmapi_cpu*.py): the engine's nodes in TensorRT-LLM's
process layout (a leader node, under mpirun with worker nodes for tp > 1), a repository with a decoupled and a
unary `tensorrt_llm`, and tritonclient calls shaped like upstream's llmapi clients (docs/decisions.md "The llmapi
model as upstream ships it")."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from backend.cpu_engine.llmapi import protocol as p
from backend.llmapi_repository import write_llmapi_repository
from launcher.contracts.llmapi import (
    CPU_MIN_STEP_VAR,
    IPC_ADDR_VAR,
    IPC_HMAC_KEY_VAR,
    SPAWN_PROXY_VAR,
    STANDIN_DEFAULT_VERSION,
    STANDIN_ROOT,
    STANDIN_VERSION_VAR,
    new_hmac_key,
    proxy_env,
)
from launcher.contracts.trtllm_versions import LEADER_NODE_MODULE, WORKER_NODE_MODULE, has_stop_action
from tests._triton import Server, find_tritonserver, free_port, tritonserver
from tests.e2e import processes_under

ROOT = Path(__file__).resolve().parent.parent
DECOUPLED, UNARY = "tensorrt_llm", "tensorrt_llm_unary"
PROMPT = "The current time is"  # test_llmapi_cancel.py's prompt
#: what Open MPI needs here (root in a container, no InfiniBand, PMIx's shared-memory store off)
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,tcp",
    "PMIX_MCA_gds": "hash",
}


@dataclass
class Job:
    server: Server
    env: dict[str, str]
    nodes: subprocess.Popen

    def stats(self) -> p.Stats:
        """The leader node's counters, over a connection of the test's own (it does not stop the node)."""
        channel = p.connect(p.endpoint(self.env), timeout_s=5)
        try:
            channel.send(p.StatsQuery())
            return channel.recv()
        finally:
            channel.close()

    def wait_for(self, what: str, ready: Callable[[p.Stats], bool], timeout: float = 60) -> p.Stats:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.stats()
            if ready(stats):
                return stats
            time.sleep(0.01)
        raise AssertionError(f"the leader node never reached: {what} (last {self.stats()})")


def repository(tmp: Path, checkpoint: str, tp: int = 1) -> Path:
    """`tensorrt_llm` (decoupled, cancellation polled every 10 ms) and `tensorrt_llm_unary` (decoupled false)."""
    args = {
        "model": checkpoint,
        "tensor_parallel_size": tp,
        "max_batch_size": 4,
        "kv_cache_config": {"event_buffer_max_size": 256},  # the KV-cache events request (hpc-serve's model)
    }
    out = tmp / "repo"
    write_llmapi_repository(out, {**args, "triton_config": {"cancellation_check_period_ms": 10}})
    write_llmapi_repository(tmp / "unary", {**args, "triton_config": {"decoupled": False}})
    shutil.move(tmp / "unary" / DECOUPLED, out / UNARY)
    config = out / UNARY / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{DECOUPLED}"', f'name: "{UNARY}"', 1))
    return out


def node_command(tp: int) -> list[str]:
    """The leader node alone (an MPI singleton) for tp 1; else mpirun with rank 0 the leader node and ranks
    1..tp-1 worker nodes (one MPI job: COMM_WORLD = the replica), as the launcher starts them under srun."""
    leader = [sys.executable, "-m", LEADER_NODE_MODULE]
    if tp == 1:
        return leader
    if not shutil.which("mpirun"):
        pytest.fail("mpirun not found: the test command installs Open MPI (scripts/install.sh --test)")
    passed = [
        a
        for v in (
            "PYTHONPATH",
            "OPENBLAS_NUM_THREADS",
            SPAWN_PROXY_VAR,
            IPC_ADDR_VAR,
            IPC_HMAC_KEY_VAR,
            CPU_MIN_STEP_VAR,
            STANDIN_VERSION_VAR,
        )
        for a in ("-x", v)
    ]
    worker = [sys.executable, "-m", WORKER_NODE_MODULE]
    return ["mpirun", "--oversubscribe", "--tag-output", *passed, "-n", "1", *leader, ":", "-n", str(tp - 1), *worker]


#: PYTHONPATH of the engine's processes and tritonserver: the stand-in of TensorRT-LLM first, as the launcher sets it
#: for backend cpu (launcher/node/server_env.py)
STANDIN_PATH = os.pathsep.join([str(ROOT / STANDIN_ROOT), str(ROOT)])


@contextlib.contextmanager
def engine_nodes(env: dict[str, str], log: Path, tp: int = 1) -> Iterator[subprocess.Popen]:
    """The engine's processes; they must stop once their release's stop came (`stop_engine_nodes`), else they are
    killed, by group."""
    full_env = {**os.environ, **env, **MPI_ENV, "PYTHONPATH": STANDIN_PATH, "OPENBLAS_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            node_command(tp), env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(10)


def stop_engine_nodes(env: dict[str, str]) -> None:
    """What trtllm-llmapi-launch does once tritonserver exited: `mgmn_leader_node --action stop`, on the releases
    that have it (older ones end with the LLM's shutdown)."""
    version = env.get(STANDIN_VERSION_VAR) or STANDIN_DEFAULT_VERSION
    if has_stop_action(version):
        subprocess.run(
            [sys.executable, "-m", LEADER_NODE_MODULE, "--action", "stop"],
            env={**os.environ, **env, "PYTHONPATH": STANDIN_PATH},
            check=True,
            timeout=60,
        )


@contextlib.contextmanager
def running_job(tmp: Path, checkpoint: str, tp: int = 1, extra_env: dict[str, str] | None = None) -> Iterator[Job]:
    """The engine's nodes and tritonserver with the spawn-proxy variables (a port and key of the job's own); at
    the end tritonserver stops, its model unloads, the nodes get their release's stop, and must end by themselves,
    exit 0. `extra_env`: e.g. the engine's pace (CPU_MIN_STEP_VAR), the release the stand-in behaves as."""
    if find_tritonserver() is None:
        pytest.fail("tritonserver not found: the test command installs nvidia-pytriton (scripts/install.sh --test)")
    env = {**proxy_env(free_port(), new_hmac_key()), **(extra_env or {})}
    repo = repository(tmp, checkpoint, tp)
    log = tmp / "nodes.log"
    with engine_nodes(env, log, tp) as nodes:
        with tritonserver(
            repo, tmp, env={**env, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / STANDIN_ROOT)}
        ) as server:
            yield Job(server, env, nodes)
        stop_engine_nodes(env)
        assert nodes.wait(30) == 0, log.read_text()[-3000:]


# ------------------------------------------------------------------------------------------------ clients
def grpc(job: Job):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(f"127.0.0.1:{job.server.grpc_port}")


def inputs(text: str | bytes | None = PROMPT, max_tokens: int | None = 16, **extra: np.ndarray) -> list:
    """llmapi_client.py's inputs (text_input BYTES [1], sampling_param_max_tokens INT32 [1]) plus any others."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    arrays: dict[str, np.ndarray] = {}
    if text is not None:
        arrays["text_input"] = np.array([text.encode() if isinstance(text, str) else text], dtype=np.object_)
    if max_tokens is not None:
        arrays["sampling_param_max_tokens"] = np.array([max_tokens], np.int32)
    arrays.update(extra)
    out = []
    for name, arr in arrays.items():
        tensor = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        tensor.set_data_from_numpy(arr)
        out.append(tensor)
    return out


def flag(value: bool = True) -> np.ndarray:
    return np.array([value], dtype=bool)


def stop_inputs() -> list:
    """llmapi_client.py's stop: text_input = np.empty([1], dtype=np.bytes_) and stop = [True]."""
    return inputs(np.empty([1], dtype=np.bytes_)[0], None, stop=flag())


def text_of(result) -> str:
    return result.as_numpy("text_output")[0].decode()


def infer_async(job: Job, model: str, inputs: list, request_id: str) -> queue.Queue:
    """llmapi_client.py's call: a unary async_infer; the completion (result or error) arrives on the queue."""
    done: queue.Queue = queue.Queue()
    client = grpc(job)
    future = client.async_infer(
        model,
        inputs,
        lambda result, error: done.put((result, error)),
        request_id=request_id,
        parameters={"Streaming": False},
    )
    done.future = future  # type: ignore[attr-defined]
    done.client = client  # type: ignore[attr-defined]
    return done


def stream(job: Job, inputs: list, request_id: str = "s") -> tuple[object, queue.Queue]:
    client = grpc(job)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    client.async_stream_infer(DECOUPLED, inputs, request_id=request_id)
    return client, events


def collect(events: queue.Queue, timeout: float = 60) -> list:
    """A stream's responses up to the final one (a gRPC stream ends a request with its final response)."""
    out = []
    while True:
        result, error = events.get(timeout=timeout)
        assert error is None, error
        out.append(result)
        if result.get_response().parameters["triton_final_response"].bool_param:
            return out


# -- a cluster job's llmapi processes (tests/test_e2e_llmapi_cluster.py, tests/test_gateway_llmapi_cluster.py) --


def of_job(job: str) -> list[tuple[int, str]]:
    """Live processes of a Slurm job by their environment: the leader and worker nodes' command lines are
    TensorRT-LLM's (`python -m MODULE`), naming no folder, so processes_under would not see them."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"SLURM_JOB_ID={job}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                if (entry / "stat").read_text().split(") ")[-1].split()[0] != "Z":
                    found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except OSError:
            continue
    return found


def job_processes(deploy: Path, what: str, job: str = "") -> list[int]:
    return sorted({pid for pid, cmd in [*processes_under(deploy), *of_job(job)] if what in cmd})


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def grpc_client(endpoint: dict):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(f"{endpoint['address']}:{endpoint['grpc_port']}")


def token_headers(token: str) -> dict[str, str]:
    """The token as tritonserver's gRPC API wants it (hpc/serving/auth.py)."""
    from hpc.serving.auth import grpc_headers

    return grpc_headers(token)


def leader_of(deploy: Path, job: str) -> Job:
    """The leader node's counters, through its IPC address and key (read from its environment: the test runs on
    the node; nothing else has them), for waiting on engine steps instead of time."""
    (pid,) = job_processes(deploy, LEADER_NODE_MODULE, job)
    env = environ_of(pid)
    return Job(server=None, env={k: env[k] for k in (SPAWN_PROXY_VAR, IPC_ADDR_VAR, IPC_HMAC_KEY_VAR)}, nodes=None)  # type: ignore[arg-type]
