"""Helpers the tests share: write specs, drive the real CLI, inspect real processes, serve a job behind a gateway, and
transformers' reference answers."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from launcher.contracts.layout import JobPaths
from launcher.contracts.records import RankExitRecord, read_rank_records

CLI = [sys.executable, "-m", "hpc.cli.main"]


def write_spec(
    folder: Path,
    name: str,
    checkpoint: Path,
    *,
    tp: int = 1,
    nodes: int = 1,
    ntasks_per_node: int | None = None,
    slurm: dict | None = None,
    triton: dict | None = None,
    auth: str | None = None,
    renew: dict | None = None,
    workflow: str = "engine",
    env: dict | None = None,
) -> Path:
    """A CPU-engine spec for the tiny checkpoint; ranks talk TCP across the emulated nodes. `auth`: the spec's
    (left out: its default, token); `renew`: its `renew:` section; `workflow` llmapi: the LLM API model with a
    batch of 8 (`llm_api.max_batch_size`, for the engine workflow's `triton_max_batch_size`); `env`: more of
    the job's environment."""
    spec = {
        "name": name,
        "workdir": str(folder / "runs"),
        "slurm": {
            "nodes": nodes,
            "ntasks_per_node": ntasks_per_node or max(1, tp // nodes),
            "time": "00:10:00",
            "env": {"OMPI_MCA_btl": "self,tcp", **(env or {})},
            **(slurm or {}),
        },
        "model": {"backend": "cpu", "workflow": workflow, "checkpoint_dir": str(checkpoint), "tp_size": tp},
        "triton": {"triton_max_batch_size": 8, "ready_timeout_s": 120, **(triton or {})},
    }
    if workflow == "llmapi":
        spec["llm_api"] = {"max_batch_size": spec["triton"].pop("triton_max_batch_size")}
    if auth is not None:
        spec["auth"] = auth
    if renew is not None:
        spec["renew"] = renew
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def bare_spec(folder: Path, name: str, time_limit: str = "00:10:00", **sections: Any) -> Path:
    """`folder`/`name`.yaml: a CPU-engine spec on an empty checkpoint folder, for the spec's checks and render (never
    served); `sections` are more of its top-level sections."""
    checkpoint = folder / "ckpt"
    checkpoint.mkdir(exist_ok=True)
    data = {
        "name": name,
        "workdir": str(folder / "runs"),
        "slurm": {"time": time_limit},
        "model": {"backend": "cpu", "workflow": "engine", "checkpoint_dir": str(checkpoint)},
        **sections,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def transformers_greedy(model: Any, prompt: list[int], new_tokens: int, **generate: Any) -> list[int]:
    """The new tokens of `transformers`' greedy `generate` of `model` on `prompt`: what the CPU engine must answer
    (`generate`: more of its arguments, e.g. pad and eos token ids)."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=new_tokens,
            **generate,
        )
    return out[0, len(prompt) :].tolist()


def cli(
    *args: str, timeout: float = 240, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`hpc-serve ARGS`; `env` adds to this process's environment."""
    proc = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env} if env else None
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"hpc-serve {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def submit(spec: Path, *extra: str, timeout: float = 240) -> tuple[str, Path]:
    """`hpc-serve submit SPEC --wait` → (job id, job folder); asserts READY. Never a second try: a job that crashes
    here is a product failure to find or to handle."""
    proc = cli("submit", str(spec), "--wait", "--timeout", str(timeout - 20), *extra, timeout=timeout, check=False)
    first = proc.stdout.splitlines()[0].split() if proc.stdout.strip() else ["?", "?"]
    assert proc.returncode == 0, f"submit did not reach READY:\n{proc.stdout}\n{proc.stderr}"
    return first[0], Path(first[1])


def rank_records(job_dir: Path) -> dict[int, RankExitRecord]:
    """Every rank's exit record in a job folder, by rank."""
    return {r.rank: r for r in read_rank_records(JobPaths.of_folder(job_dir))}


def status(job: str) -> dict:
    """`hpc-serve status JOB --json`; {} while the job is not known yet (exit 3, e.g. before rank 0 renders)."""
    proc = cli("status", job, "--json", check=False)
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def processes_under(path: Path) -> list[tuple[int, str]]:
    """Live processes whose command line mentions `path` (tritonserver, python stubs, launchers)."""
    from hpc.jobs.local import processes_mentioning

    return processes_mentioning(str(path))


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS's pick), for a server a test starts with a port of its choosing."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on (from `ss`, which names the owning pid)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    ports = set()
    for line in out.splitlines():
        if f"pid={pid}," in line:
            ports.add(int(line.split()[3].rsplit(":", 1)[1]))
    return ports


def kill_quietly(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def private_job_index(folder: Path) -> Iterator[Path]:
    """$HPC_SERVE_HOME at `folder`/hpc-home while the block runs, then as it was: a job index of its own for a
    fixture wider than one test (conftest's `hpc_home` uses monkeypatch, which lives for one test)."""
    home = folder / "hpc-home"
    old_home = os.environ.get("HPC_SERVE_HOME")
    os.environ["HPC_SERVE_HOME"] = str(home)
    try:
        yield home
    finally:
        if old_home is None:
            os.environ.pop("HPC_SERVE_HOME", None)
        else:
            os.environ["HPC_SERVE_HOME"] = old_home


@contextlib.contextmanager
def module_job(
    folder: Path, name: str, checkpoint: Path, executor: str | None = None, **spec: Any
) -> Iterator[tuple[str, dict]]:
    """(job id, endpoint record) of one READY job shared by a whole test module, under a private job index;
    scancel'ed at the end without waiting (its cancel is tested elsewhere), or cancelled (`executor` local)."""
    job = ""
    with private_job_index(folder):
        try:
            job, _ = submit(
                write_spec(folder, name, checkpoint, **spec), *(["--executor", executor] if executor else [])
            )
            (endpoint,) = status(job)["endpoints"]
            yield job, endpoint
        finally:
            if job and executor == "local":
                cli("cancel", job, check=False)
            elif job:
                subprocess.run(["scancel", job], capture_output=True, check=False)


def job_token(job_id: str) -> str | None:
    """The access token a job's tritonserver requires (its deployment folder's; None with auth: none)."""
    from hpc.scheduler.index import find_job
    from hpc.serving.auth import read_token

    return read_token(find_job(job_id).deploy_dir)


def core_model_stream(
    endpoint: dict,
    prompt_ids: list[int],
    n: int,
    on_piece=None,
    timeout: float = 60,
    headers: dict[str, str] | None = None,
) -> tuple[list[np.ndarray], str | None]:
    """Stream `n` tokens from the `tensorrt_llm` model (no end_id: exactly n unless stopped) → (token pieces,
    the error that ended the stream, if one did). ``on_piece`` is called after each piece. ``headers``: the
    gRPC metadata sent (default: the job's access token, as every client sends it)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from hpc.serving.auth import grpc_headers

    ids = np.array([prompt_ids], dtype=np.int32)
    arrays = {
        "input_ids": ids,
        "input_lengths": np.array([[ids.shape[1]]], dtype=np.int32),
        "request_output_len": np.array([[n]], dtype=np.int32),
        "streaming": np.array([[True]], dtype=bool),
    }
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == bool else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"{endpoint['address']}:{endpoint['grpc_port']}")
    headers = grpc_headers(job_token(endpoint["job_id"])) if headers is None else headers
    client.start_stream(callback=lambda result, error: results.put((result, error)), headers=headers)
    pieces: list[np.ndarray] = []
    try:
        try:
            client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        except InferenceServerException:  # refused at once (no access token): the callback got why
            return pieces, str(results.get(timeout=timeout)[1])
        while True:
            result, error = results.get(timeout=timeout)
            if error is not None:
                return pieces, str(error)
            output = result.as_numpy("output_ids")
            if output is not None and output.size:
                pieces.append(output)
                if on_piece is not None:
                    on_piece()
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return pieces, None


@contextlib.contextmanager
def gateway_process(target: str, log: Path, *extra: str) -> Iterator[tuple[subprocess.Popen, Any]]:
    """`hpc-serve gateway TARGET --port auto` as a process of its own → (the process, its GatewayRecord) once
    it answers at the address it published; stopped (SIGTERM, then SIGKILL) at the end, unless a test did."""
    from hpc.serving.deployment import resolve_target
    from hpc.serving.gateway_record import live_gateway

    deployment = resolve_target(target)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*CLI, "gateway", target, "--port", "auto", "--refresh", "1", *extra], stdout=out, stderr=subprocess.STDOUT
        )
    try:

        def up():
            assert proc.poll() is None, log.read_text()
            return live_gateway(deployment)

        yield proc, wait_for(up, 60, "the gateway's address record")
    finally:
        stop_process(proc)


@contextlib.contextmanager
def gateway_on_port(target: str, log: Path) -> Iterator[str]:
    """`hpc-serve gateway TARGET` on a free port, as a process of its own → its URL once it has found a replica;
    stopped (SIGTERM, then SIGKILL) at the end. Its output goes to `log`."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*CLI, "gateway", target, "--port", str(port), "--refresh", "1"], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            return gateway_ready(url)

        wait_for(up, 60, "the gateway to find the replica")
        yield url
    finally:
        stop_process(proc)


@contextlib.contextmanager
def served_on_the_cluster(folder: Path, spec: Path) -> Iterator[dict[str, Any]]:
    """The READY Slurm job of `spec`, under a private job index in `folder`, and a gateway on it (`gateway_on_port`):
    {"job", "deploy", "token", "url", "client" (an `openai` client with the token that does not retry), "log" (the
    gateway's)}; the gateway stopped and the job scancel'ed at the end."""
    import openai

    job = ""
    with private_job_index(folder):
        try:
            job, job_dir = submit(spec)
            deploy = Path(job_dir).parent.parent
            token = (deploy / "access_token").read_text().strip()
            log = folder / "gateway.log"
            with gateway_on_port(job, log) as url:
                client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
                yield {"job": job, "deploy": deploy, "token": token, "url": url, "client": client, "log": log}
        finally:
            if job:
                subprocess.run(["scancel", job], capture_output=True, check=False)


def gateway_ready(url: str) -> bool:
    """Whether the gateway at `url` answers ready (it has found a replica); False while it does not answer."""
    import httpx

    try:
        return httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def prometheus_samples(url: str) -> dict[tuple[str, tuple], float]:
    """`GET URL/metrics` (a gateway's, no token; or a replica's) → {(sample name, sorted labels): value}."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(url + "/metrics", timeout=5)
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def stop_process(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL when it has not exited within `grace_s`; reaped either way (a gateway a test started)."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def local_jobs(folder: Path, spec: Path, count: int) -> Iterator[list[tuple[str, Path]]]:
    """`count` READY local jobs of `spec` ([(job id, job folder)]) under a private job index in `folder`; every
    process of theirs killed at the end (what a test killed already is skipped)."""
    jobs: list[tuple[str, Path]] = []
    with private_job_index(folder):
        try:
            for _ in range(count):
                jobs.append(submit(spec, "--executor", "local"))
            yield jobs
        finally:
            kill_local_jobs((job, job_dir.parent.parent) for job, job_dir in jobs)


def kill_local_jobs(started: Iterable[tuple[str, Path]]) -> None:
    """Every process of these local jobs ([(job id, deployment folder)]) killed, what was killed already skipped: the
    end of a test that started them, whatever its outcome."""
    from hpc.jobs.local import job_processes

    for job, deploy_dir in started:
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(deploy_dir))


#: how a stream cut by an ordered stop may end, besides its final response: an error a client can act on (retry
#: elsewhere); anything else is a failure
CLEAR_STOP_ERRORS = ("stopping", "no available versions", "UNAVAILABLE", "no longer in valid state")
#: how tritonserver's gRPC service ends a stream that reached it while it shut down (after the drain and the
#: SIGTERM): a stream opened after the stop began may end so; one in flight at the stop may not
GONE_SERVER_ERROR = "[StatusCode.CANCELLED]"


def ensemble_stream_once(url: str, headers: dict[str, str], timeout: float) -> str:
    """One streaming request through the ensemble on a stream of its own → "final" or "error: why"; "HANG" when
    nothing ended it within ``timeout``."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    arrays = {
        "text_input": np.array([["hello world"]], dtype=object),
        "max_tokens": np.array([[48]], dtype=np.int32),
        "stream": np.array([[True]], dtype=bool),
    }
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    results: queue.Queue = queue.Queue()
    try:
        client = grpcclient.InferenceServerClient(url)
    except InferenceServerException as e:
        return f"error: {e}"
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)), headers=headers)
        try:
            client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
        except InferenceServerException as e:
            return f"error: {e}"
        while True:
            try:
                result, error = results.get(timeout=timeout)
            except queue.Empty:
                return "HANG"
            if error is not None:
                return f"error: {error}"
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "final"
    finally:
        client.stop_stream()
        client.close()


def ensemble_clients(endpoint: dict, count: int, stop: Any, endings: list[tuple[float, float, str]]) -> list[Any]:
    """`count` started threads, each streaming through the job's ensemble request after request (its token
    sent) until `stop` is set; each request's (started, ended, how) goes to `endings` (monotonic seconds, how:
    `ensemble_stream_once`'s). A request that did not end with its final response is followed by a short pause:
    the server is going away, a real client would retry elsewhere."""
    import threading

    from hpc.serving.auth import grpc_headers

    url, headers = f"{endpoint['address']}:{endpoint['grpc_port']}", grpc_headers(job_token(endpoint["job_id"]))

    def loop() -> None:
        while not stop.is_set():
            started = time.monotonic()
            how = ensemble_stream_once(url, headers, timeout=30)
            endings.append((started, time.monotonic(), how))
            if how != "final":
                time.sleep(0.2)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def join_clients(threads: list[Any], timeout: float) -> None:
    """Join every client thread within ``timeout`` seconds in all; a thread still alive fails the test with its
    stack, so a stream that never ended says where it waits (the client library, the server, the test)."""
    import sys
    import traceback

    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [t for t in threads if t.is_alive()]
    frames = sys._current_frames()
    stacks = ["".join(traceback.format_stack(frames[t.ident])) for t in alive if t.ident in frames]
    assert not alive, "a client stream never ended:\n" + "\n".join(stacks)


def assert_streams_ended_clearly(endings: list[tuple[float, float, str]], stop_at: float) -> None:
    """What an ordered stop under `ensemble_clients` load must leave: no stream hung, every stream that did not
    end with its final response ended with an error a client can act on (CLEAR_STOP_ERRORS), some stream was in
    flight at `stop_at` (monotonic seconds; else the test proves nothing), and each of those ended with its final
    response or with the stop named."""
    assert not [e for e in endings if e[2] == "HANG"], endings
    unclear = [
        how
        for started, _, how in endings
        if how != "final"
        and not any(c in how for c in CLEAR_STOP_ERRORS)
        and not (started > stop_at and GONE_SERVER_ERROR in how)
    ]
    assert not unclear, unclear
    in_flight = [how for started, ended, how in endings if started < stop_at < ended]
    assert in_flight, f"no stream was in flight when the stop began: the test proves nothing ({len(endings)} ended)"
    assert all(how == "final" or "stopping" in how for how in in_flight), in_flight


def hold_gpus(node: str) -> str:
    """A job of the test's that holds `node`'s 4 GPUs for 10 minutes: Slurm's start estimate of a job that needs
    them is its end."""
    argv = [
        "sbatch",
        "--parsable",
        "-J",
        "gpu-holder",
        "-w",
        node,
        "--gres=gpu:4",
        "-t",
        "10",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 600",
    ]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
