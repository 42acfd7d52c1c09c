"""The CPU ``tensorrt_llm`` model inside the real tritonserver (nvidia-pytriton's 2.51 + python backend stub).

Servers (each loads models of one repository written by ``backend.repository``, explicit model control):

* ``server`` (module): ``tensorrt_llm`` (decoupled), ``tensorrt_llm_blocking`` (``decoupled_mode: false``) and
  ``tensorrt_llm_exclude`` (``exclude_input_in_output: true``), tp 1; ``tensorrt_llm_tp2`` (``tp_size: 2``) is
  in the repository but only loaded by the test that expects it to fail;
* a tp 2 leader and follower under mpirun (the follower stays in ``initialize()``);
* a server that announces an MPI world of 3 with 2 ranks per replica, loading nothing until asked.

Clients are tritonclient's gRPC (streams, cancellation) and HTTP (one request, one response); the KV cache is
read from the metrics port. Bad token ids and other bad inputs: tests/test_cpu_engine_bad_requests.py.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend.cpu_engine.engine import Engine
from backend.cpu_engine.init_model import create_checkpoint
from backend.cpu_engine.scheduler import GenerationRequest
from backend.cpu_engine.triton_io import encode_words_list
from hpc.serving.metrics import parse
from launcher.contracts.prometheus import samples
from launcher.contracts.renew_plan import active_requests
from tests._env import unavailable
from tests.steps import GPU_PACE_MS

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
PROMPT = [1, 50, 51, 52, 53, 54, 55, 56, 57]
MAX_BATCH = 4
PLACEMENT_PREFIXES = ("HPC_SERVE_", "OMPI_", "PMI", "SLURM_")  # what would tell the model it has peers
VARIANTS: dict[str, dict[str, object]] = {  # model name -> repository parameters that differ from the base ones
    "tensorrt_llm_blocking": {"decoupled_mode": False},
    "tensorrt_llm_exclude": {"exclude_input_in_output": True},
    "tensorrt_llm_tp2": {"tp_size": 2},
    "tensorrt_llm_paced": {"min_step_ms": GPU_PACE_MS},  # tests that count steps after a stop
    "tensorrt_llm_reuse": {"enable_kv_cache_reuse": True},
}


def _server():
    from launcher.node.server import ServerNotFound, merge_env, resolve

    try:
        return resolve(None), merge_env
    except ServerNotFound as e:
        unavailable(str(e))


def _params(ckpt: str, **overrides) -> dict:
    from backend.repository import UPSTREAM_DEFAULTS

    return {
        **UPSTREAM_DEFAULTS,
        "triton_max_batch_size": MAX_BATCH,
        "decoupled_mode": True,
        "logits_datatype": "TYPE_FP32",
        "encoder_input_features_data_type": "TYPE_FP16",
        "preprocessing_instance_count": 1,
        "postprocessing_instance_count": 1,
        "bls_instance_count": 1,
        "tokenizer_dir": ckpt,
        "engine_dir": ckpt,
        "tp_size": 1,
        "max_tokens_in_paged_kv_cache": 512,
        **overrides,
    }


def _repo(tmp: Path, ckpt: str, tp: int = 1, variants: dict[str, dict[str, object]] | None = None) -> Path:
    """A repository as render writes it, plus each variant's ``tensorrt_llm`` under the variant's name."""
    from backend.repository import write_model_repository

    out = tmp / "repo"
    write_model_repository(out, "cpu", _params(ckpt, tp_size=tp))
    for name, overrides in (variants or {}).items():
        write_model_repository(tmp / name, "cpu", _params(ckpt, **overrides))
        shutil.move(tmp / name / "tensorrt_llm", out / name)
        config = out / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "tensorrt_llm"', f'name: "{name}"', 1))
    return out


@dataclass
class Triton:
    proc: subprocess.Popen
    http: int
    grpc: int
    metrics: int
    log: Path


def _start(
    tmp: Path, repo: Path, tp: int = 1, load: tuple[str, ...] = ("tensorrt_llm",), env: dict[str, str] | None = None
) -> Triton:
    from launcher.node.ports import free_ports

    server, merge_env = _server()
    http, grpc, metrics = free_ports(3)
    base = {k: v for k, v in os.environ.items() if not k.startswith(PLACEMENT_PREFIXES)}  # a world of one
    full_env = merge_env(base, {**server.env, "PYTHONPATH": str(ROOT)})
    full_env.update(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OPENBLAS_NUM_THREADS": "1",
            **(env or {}),
        }
    )
    argv = [
        server.argv0,
        f"--model-repository={repo}",
        "--model-control-mode=explicit",
        *(f"--load-model={m}" for m in load),
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--disable-auto-complete-config",
        "--exit-timeout-secs=5",
        "--log-verbose=0",
    ]
    if server.backend_dir:
        argv.append(f"--backend-directory={server.backend_dir}")
    if tp > 1:
        if not shutil.which("mpirun"):
            unavailable("mpirun not installed (apt-get install openmpi-bin)")
        argv = ["mpirun", "-n", str(tp), "--oversubscribe", "--tag-output"] + argv
    log = tmp / "server.log"
    proc = subprocess.Popen(argv, env=full_env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"tritonserver exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1).status == 200:
                return Triton(proc, http, grpc, metrics, log)
        except OSError:
            pass
        time.sleep(0.1)
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


# ------------------------------------------------------------------------------------------------ clients
def _inputs(module, ids: list[int], out_len: int, **extra) -> list:
    """tritonclient InferInputs for one request of batch 1; ``extra`` values get a batch dimension of 1."""
    arrays = {
        "input_ids": np.array([ids], np.int32),
        "input_lengths": np.array([[len(ids)]], np.int32),
        "request_output_len": np.array([[out_len]], np.int32),
    }
    arrays.update({k: np.asarray(v)[None] if np.ndim(v) else np.array([[v]]) for k, v in extra.items()})
    return _to_inputs(module, arrays)


def _to_inputs(module, arrays: dict[str, np.ndarray]) -> list:
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, a in arrays.items():
        a = a.astype(np.int32) if a.dtype == np.int64 else a
        t = module.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
        t.set_data_from_numpy(a)
        out.append(t)
    return out


class Stream:
    """One gRPC bidirectional stream; responses are sorted by request id."""

    def __init__(self, port: int) -> None:
        import tritonclient.grpc as grpcclient

        self.grpc = grpcclient
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        self.queues: dict[str, queue.Queue] = {}
        self.errors: queue.Queue = queue.Queue()
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result, error) -> None:
        if error is not None:
            self.errors.put(error)
            return
        rid = result.get_response().id
        self.queues.setdefault(rid, queue.Queue()).put(result)

    def send(self, request_id: str, ids: list[int], out_len: int, model: str = "tensorrt_llm", **extra) -> None:
        self.queues.setdefault(request_id, queue.Queue())
        self.client.async_stream_infer(
            model, _inputs(self.grpc, ids, out_len, **extra), request_id=request_id, enable_empty_final_response=True
        )

    def next(self, request_id: str, timeout: float = 60):
        """The next response to ``request_id``; an error on the stream is raised."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.errors.empty():
                raise self.errors.get()
            try:
                return self.queues[request_id].get(timeout=0.05)
            except queue.Empty:
                pass
        raise TimeoutError(f"no response to {request_id!r} in {timeout}s")

    def until_final(self, request_id: str, timeout: float = 60) -> list:
        """Every response to ``request_id`` up to and including the one flagged final."""
        out: list = []
        while not out or not _final(out[-1]):
            out.append(self.next(request_id, timeout))
        return out

    def close(self, cancel_requests: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel_requests)
        self.client.close()


def _final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def _ids(result) -> list[int]:
    ids = result.as_numpy("output_ids")
    return [] if ids is None else [int(t) for t in ids.reshape(-1)]


def _metrics(port: int, family: str, model: str = "tensorrt_llm") -> dict[str, float]:
    """``{type label: value}`` of one nv_trt_llm metric family for one model, from the metrics port."""
    out = {}
    for sample in samples(_page(port)):
        labels = dict(sample.labels)
        if sample.name == family and labels.pop("model") == model and labels.pop("version") == "1":
            (kind,) = labels.values()
            out[kind] = sample.value
    return out


def _page(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def _kv_used_drops_to_zero(port: int, timeout: float = 60, model: str = "tensorrt_llm") -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _metrics(port, "nv_trt_llm_kv_cache_block_metrics", model)["used"] == 0:
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    return create_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", family="llama", seed=6)


@pytest.fixture(scope="module")
def reference(ckpt):
    """Greedy output ids of PROMPT from the engine in this process (what the server must answer)."""
    engine = Engine(ckpt)

    def generate(n: int, **kw) -> list[int]:
        return engine.generate(GenerationRequest(input_ids=np.array(PROMPT), max_new_tokens=n, **kw)).output_ids

    return generate


@pytest.fixture(scope="module")
def repo(tmp_path_factory, ckpt) -> Path:
    return _repo(tmp_path_factory.mktemp("repo"), ckpt, variants=VARIANTS)


@pytest.fixture(scope="module")
def server(tmp_path_factory, repo) -> Iterator[Triton]:
    triton = _start(
        tmp_path_factory.mktemp("server"),
        repo,
        load=("tensorrt_llm", "tensorrt_llm_blocking", "tensorrt_llm_exclude", PACED, "tensorrt_llm_reuse"),
    )
    try:
        yield triton
    finally:
        code = _stop(triton.proc)
    assert code in (0, -signal.SIGTERM), triton.log.read_text()[-4000:]  # SIGTERM unloads every model cleanly


@pytest.fixture
def stream(server) -> Iterator[Stream]:
    s = Stream(server.grpc)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def http(server):
    """(tritonclient.http, a client); closed after the test (an open connection delays the server's exit)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=120)
    try:
        yield httpclient, client
    finally:
        client.close()


# ------------------------------------------------------------------------------------------------ decoupled
def test_streaming_sends_one_token_per_response_then_final(stream, reference) -> None:
    stream.send("s1", PROMPT, 6, streaming=True)
    responses = stream.until_final("s1")
    assert [_final(r) for r in responses] == [False] * (len(responses) - 1) + [True]
    assert [t for r in responses for t in _ids(r)] == reference(6)


def test_streaming_response_tensors(stream) -> None:
    stream.send("s1", PROMPT, 2, streaming=True, return_log_probs=True)
    first = stream.next("s1")
    stream.until_final("s1")
    ids = first.as_numpy("output_ids")
    assert ids.shape == (1, 1, 1) and ids.dtype == np.int32
    assert first.as_numpy("sequence_length").tolist() == [[1]]
    assert first.as_numpy("batch_index").tolist() == [[0]]
    assert first.as_numpy("output_log_probs").shape == (1, 1, 1)
    assert first.as_numpy("cum_log_probs").dtype == np.float32


def test_non_streaming_includes_the_prompt(stream, reference) -> None:
    stream.send("n1", PROMPT, 5)
    (response,) = stream.until_final("n1")
    assert _ids(response) == PROMPT + reference(5)
    assert response.as_numpy("sequence_length").tolist() == [[len(PROMPT) + 5]]


def test_exclude_input_in_output_input(stream, reference) -> None:
    stream.send("n1", PROMPT, 5, exclude_input_in_output=True)
    (response,) = stream.until_final("n1")
    assert _ids(response) == reference(5)


def test_exclude_input_in_output_model_parameter(stream, reference) -> None:
    stream.send("n1", PROMPT, 3, model="tensorrt_llm_exclude")
    (response,) = stream.until_final("n1")
    assert _ids(response) == reference(3)


def test_perf_metrics_outputs(stream) -> None:
    stream.send("n1", PROMPT, 5, return_perf_metrics=True)
    (r,) = stream.until_final("n1")
    arrival, scheduled, first, last = (
        int(r.as_numpy(f"{n}_time_ns")[0, 0]) for n in ("arrival", "first_scheduled", "first_token", "last_token")
    )
    assert 0 < arrival <= scheduled <= first <= last
    assert r.as_numpy("kv_cache_alloc_total_blocks")[0, 0] >= 1


def test_kv_cache_reuse_reports_the_blocks_a_repeated_prompt_found(stream, ckpt) -> None:
    """`enable_kv_cache_reuse` (triton.enable_kv_cache_reuse): a prompt of two whole blocks and a bit, sent
    twice, is computed the first time and found the second (its last token is always computed), with the same
    tokens as an engine that computes everything; the model without the parameter reuses nothing."""
    prompt = [1] + [(7 * i) % 200 + 10 for i in range(2 * 64 + 11)]
    expected = Engine(ckpt).generate(GenerationRequest(input_ids=np.array(prompt), max_new_tokens=4)).output_ids
    reused = []
    for model in ("tensorrt_llm_reuse", "tensorrt_llm_reuse", "tensorrt_llm"):
        stream.send("r1", prompt, 4, model=model, return_perf_metrics=True, exclude_input_in_output=True)
        (r,) = stream.until_final("r1")
        assert _ids(r) == expected, model
        reused.append(int(r.as_numpy("kv_cache_reused_blocks")[0, 0]))
        total, new = (int(r.as_numpy(f"kv_cache_alloc_{n}_blocks")[0, 0]) for n in ("total", "new"))
        assert new == total - reused[-1]
    assert reused == [0, 2, 0]


def test_stop_words(stream, reference) -> None:
    ref = reference(10)
    stream.send("n1", PROMPT, 10, stop_words_list=encode_words_list([[ref[2]]]), exclude_input_in_output=True)
    (response,) = stream.until_final("n1")
    assert _ids(response) == ref[: ref.index(ref[2]) + 1]


def test_end_id(stream, reference) -> None:
    ref = reference(10)
    stream.send("n1", PROMPT, 10, end_id=np.int32(ref[1]), exclude_input_in_output=True)
    (response,) = stream.until_final("n1")
    assert _ids(response) == ref[: ref.index(ref[1])]


def test_unsupported_input_is_a_named_error(stream) -> None:
    from tritonclient.utils import InferenceServerException

    stream.send("b1", PROMPT, 4, beam_width=np.int32(2))
    with pytest.raises(InferenceServerException, match="beam_width"):
        stream.next("b1")


def _generated_steps(server: Triton) -> float:
    return _metrics(server.metrics, "nv_trt_llm_general_metrics", PACED)["iteration_counter"]


N_LONG = 240  # the checkpoint has 256 positions; at one token per step, cancelling must end it well before
#: the model these tests count steps of: at a GPU's pace, where the bound (N_LONG / 2) leaves the cancel or stop
#: more than 2 s (at the tiny model's own pace the engine outruns the responses on a loaded machine:
#: docs/decisions.md "Abandoned streams")
PACED = "tensorrt_llm_paced"


def test_client_cancel_ends_the_request_and_frees_its_kv_blocks(server) -> None:
    steps = _generated_steps(server)
    s = Stream(server.grpc)
    s.send("c1", PROMPT, N_LONG, model=PACED, streaming=True)
    s.next("c1")
    s.next("c1")
    s.close(cancel_requests=True)
    assert _kv_used_drops_to_zero(server.metrics, model=PACED)
    assert _generated_steps(server) - steps < N_LONG / 2


def test_stop_input_ends_the_request_and_frees_its_kv_blocks(server, stream) -> None:
    steps = _generated_steps(server)
    stream.send("c2", PROMPT, N_LONG, model=PACED, streaming=True)
    stream.next("c2")
    stream.next("c2")
    stream.send("c2", PROMPT, 1, model=PACED, stop=True)
    stream.until_final("c2")  # the long request's final response, then the stop request's (same id)
    stream.until_final("c2", timeout=60)
    assert _kv_used_drops_to_zero(server.metrics, model=PACED)
    assert _generated_steps(server) - steps < N_LONG / 2


def test_a_stop_without_a_request_id_is_refused(stream) -> None:
    """As TensorRT-LLM's backend refuses it ("Trying to stop a request but request ID is not provided"): a stop
    with no id must not stop the requests that were sent without one."""
    stream.send("", PROMPT, 1, stop=True)
    with pytest.raises(Exception, match="a stop request must carry the request id"):
        stream.next("")


# ------------------------------------------------------------------------------------------------ metrics
def test_request_metrics(server, stream) -> None:
    stream.send("m1", PROMPT, 3)
    stream.until_final("m1")
    request = _metrics(server.metrics, "nv_trt_llm_request_metrics")
    assert set(request) == {"active", "max", "scheduled", "context", "waiting", "completed"}
    assert request["max"] == MAX_BATCH and request["completed"] >= 1


def test_kv_cache_block_metrics(server) -> None:
    kv = _metrics(server.metrics, "nv_trt_llm_kv_cache_block_metrics")
    assert kv["tokens_per"] == 64 and kv["max"] == kv["used"] + kv["free"] and kv["max"] >= 1


def test_inflight_batcher_and_general_metrics(server) -> None:
    assert set(_metrics(server.metrics, "nv_trt_llm_inflight_batcher_metrics")) == {
        "total_context_tokens",
        "generation_requests",
        "micro_batch_id",
        "paused_requests",
    }
    assert set(_metrics(server.metrics, "nv_trt_llm_general_metrics")) == {"iteration_counter", "timestamp"}


def test_the_page_reads_as_prometheus_client_reads_it(server, stream) -> None:
    """The one parser (launcher/contracts/prometheus.py, stdlib: the drain reads the page on a node without
    prometheus_client) on a real tritonserver's page, against prometheus_client's own parser."""
    stream.send("m3", PROMPT, 3)
    stream.until_final("m3")
    text = _page(server.metrics)
    theirs = [(s.name, s.labels, float(s.value)) for f in text_string_to_metric_families(text) for s in f.samples]
    ours = [(s.name, s.labels, s.value) for s in parse(text, prefixes=(), hide_zero_failures=False)]
    assert ours == theirs and len(ours) > 20
    in_flight = [
        v
        for n, labels, v in theirs
        if n == "nv_trt_llm_request_metrics" and labels["request_type"] in ("active", "waiting")
    ]
    queued = [v for n, _, v in theirs if n == "nv_inference_pending_request_count"]
    assert in_flight and queued and active_requests(text) == int(sum(in_flight) + sum(queued))


# ------------------------------------------------------------------------------------------------ not decoupled
def test_not_decoupled_batch_returns_one_padded_response(http, reference) -> None:
    module, client = http
    arrays = {
        "input_ids": np.array([PROMPT, PROMPT[:4] + [0] * 5], np.int32),
        "input_lengths": np.array([[9], [4]], np.int32),
        "request_output_len": np.array([[3], [5]], np.int32),
        "pad_id": np.array([[0], [0]], np.int32),
        "exclude_input_in_output": np.array([[True], [True]]),
    }
    result = client.infer("tensorrt_llm_blocking", _to_inputs(module, arrays))
    ids = result.as_numpy("output_ids")
    assert ids.shape == (2, 1, 5)
    assert ids[0, 0, :3].tolist() == reference(3) and ids[0, 0, 3:].tolist() == [0, 0]
    assert result.as_numpy("sequence_length").tolist() == [[3], [5]]


def test_not_decoupled_refuses_streaming_by_name(http) -> None:
    from tritonclient.utils import InferenceServerException

    module, client = http
    with pytest.raises(InferenceServerException, match="streaming"):
        client.infer("tensorrt_llm_blocking", _inputs(module, PROMPT, 3, streaming=True))


# ------------------------------------------------------------------------------------------------ load errors
def _load_error(server: Triton, model: str) -> str:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=120)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model(model)
    finally:
        client.close()
    return str(e.value)


def test_world_size_must_equal_tp_size(server) -> None:
    assert re.search(r"1 ranks per replica \(MPI world 1\) != tp_size 2", _load_error(server, "tensorrt_llm_tp2"))


def test_replicas_need_a_whole_number_of_tp_groups(tmp_path, repo) -> None:
    from launcher.contracts.rank import RANKS_PER_REPLICA_ENV, WORLD_SIZE_ENV

    triton = _start(tmp_path, repo, load=(), env={WORLD_SIZE_ENV: "3", RANKS_PER_REPLICA_ENV: "2"})  # as launched
    try:
        message = _load_error(triton, "tensorrt_llm_tp2")
    finally:
        _stop(triton.proc)
    assert re.search(r"2 ranks per replica \(MPI world 3\)", message)


# ------------------------------------------------------------------------------------------------ tp 2
def test_tp2_leader_streams_and_its_follower_stops_with_it(tmp_path: Path, ckpt, reference) -> None:
    pytest.importorskip("mpi4py")
    triton = _start(tmp_path, _repo(tmp_path, ckpt, tp=2), tp=2)
    try:
        s = Stream(triton.grpc)
        s.send("s1", PROMPT, 12, streaming=True)
        tokens = [t for r in s.until_final("s1") for t in _ids(r)]
        s.close()
        # stop only the leader's tritonserver (as when rank 0 shuts down): the follower must follow
        pgrep = ["pgrep", "-P", str(triton.proc.pid)]
        ranks = subprocess.run(pgrep, check=False, capture_output=True, text=True).stdout.split()
        os.kill(min(int(r) for r in ranks), signal.SIGTERM)
        triton.proc.wait(90)
    finally:
        _stop(triton.proc)
    out = triton.log.read_text()
    assert tokens == reference(12)
    assert "follower, waiting for the leader" in out and "leader said stop" in out, out[-4000:]
    assert out.count("Started HTTPService") == 1  # the follower never opened ports
