"""The ``tensorrt_llm`` CPU python model driven through a stand-in ``triton_python_backend_utils``.

The real stub exists only inside tritonserver (see the ``triton``-marked test for that); this fake has the same
call surface so initialize/execute/finalize, decoupled streaming, cancellation, errors and metrics are checked
in-process.  Tensor names come from ``backend.templates.tables`` (the config writer's tables), so a name drift
between the config and this model fails here.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from backend.cpu_engine.init_model import create_checkpoint
from backend.cpu_engine.triton_io import encode_words_list

FINAL = 1


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _Response:
    def __init__(self, output_tensors=(), error=None) -> None:
        self.tensors = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


class _Error:
    def __init__(self, message: str) -> None:
        self._m = message

    def message(self) -> str:
        return self._m


class _Metric:
    def __init__(self, labels: dict) -> None:
        self.labels, self.value = labels, None

    def set(self, v: float) -> None:
        self.value = v


class _MetricFamily:
    GAUGE, COUNTER = "gauge", "counter"
    registry: dict[str, "_MetricFamily"] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.metrics = name, []
        _MetricFamily.registry[name] = self

    def Metric(self, labels: dict) -> _Metric:  # noqa: N802 - pb_utils spelling
        m = _Metric(labels)
        self.metrics.append(m)
        return m


class _Sender:
    def __init__(self) -> None:
        self.sent: list[tuple[_Response | None, int]] = []
        self.final = threading.Event()
        self.cancelled = False

    def send(self, response=None, flags: int = 0) -> None:
        self.sent.append((response, flags))
        if flags & FINAL:
            self.final.set()

    def is_cancelled(self) -> bool:
        return self.cancelled


class _Request:
    def __init__(self, inputs: dict[str, np.ndarray], request_id: str = "") -> None:
        self.inputs, self._id, self.sender = inputs, request_id, _Sender()

    def request_id(self) -> str:
        return self._id

    def get_response_sender(self) -> _Sender:
        return self.sender

    def is_cancelled(self) -> bool:
        return self.sender.cancelled


class _Logger:
    @staticmethod
    def log_info(msg: str) -> None:
        pass

    log_warn = log_error = log_verbose = log_info


def _fake_pb_utils() -> types.ModuleType:
    m = types.ModuleType("triton_python_backend_utils")
    m.Tensor = _Tensor
    m.InferenceResponse = _Response
    m.TritonError = _Error
    m.MetricFamily = _MetricFamily
    m.Logger = _Logger
    m.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    m.get_input_tensor_by_name = lambda req, name: _Tensor(name, req.inputs[name]) if name in req.inputs else None
    m.using_decoupled_model_transaction_policy = lambda cfg: bool(
        cfg.get("model_transaction_policy", {}).get("decoupled", False)
    )
    return m


def _tensor_names() -> tuple[list[str], list[str]]:
    from backend.templates.tables import LLM_INPUTS, LLM_OUTPUTS

    return [t.name for t in LLM_INPUTS], [t.name for t in LLM_OUTPUTS]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return Path(create_checkpoint(tmp_path_factory.mktemp("ck") / "llama", family="llama", seed=2))


@pytest.fixture
def make_model(ckpt, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    for k in [k for k in os.environ if k.startswith(("HPC_SERVE_", "OMPI_", "PMI", "SLURM_"))]:
        monkeypatch.delenv(k, raising=False)  # a world of one, whatever runs the tests
    models = []

    def make(decoupled: bool = True, **params):
        from backend.models.tensorrt_llm_cpu import TritonPythonModel

        inputs, outputs = _tensor_names()
        p = {"gpt_model_path": str(ckpt), "tp_size": "1", "max_tokens_in_paged_kv_cache": "${max_tokens_in_paged_kv_cache}",
             "exclude_input_in_output": "${exclude_input_in_output}", **{k: str(v) for k, v in params.items()}}
        cfg = {
            "name": "tensorrt_llm",
            "max_batch_size": 4,
            "model_transaction_policy": {"decoupled": decoupled},
            "input": [{"name": n} for n in inputs],
            "output": [{"name": n} for n in outputs],
            "parameters": {k: {"string_value": v} for k, v in p.items()},
        }
        m = TritonPythonModel()
        m.initialize({"model_config": json.dumps(cfg), "model_name": "tensorrt_llm", "model_version": "1"})
        models.append(m)
        return m

    yield make
    for m in models:
        m.finalize()


def _inputs(ids: list[int], out_len: int, **extra) -> dict[str, np.ndarray]:
    d = {
        "input_ids": np.array([ids], np.int32),
        "input_lengths": np.array([len(ids)], np.int32),
        "request_output_len": np.array([out_len], np.int32),
    }
    for k, v in extra.items():
        d[k] = np.asarray(v)
    return d


PROMPT = [1, 40, 41, 42, 43, 44, 45]


def _reference(ckpt: Path, n: int, **kw) -> list[int]:
    from backend.cpu_engine.engine import Engine
    from backend.cpu_engine.scheduler import GenerationRequest

    return Engine(str(ckpt)).generate(GenerationRequest(input_ids=PROMPT, max_new_tokens=n, **kw)).output_ids


def test_decoupled_streaming_sends_tokens_then_final(make_model, ckpt) -> None:
    model = make_model(decoupled=True)
    req = _Request(_inputs(PROMPT, 6, streaming=np.array([True]), return_log_probs=np.array([True])), "r1")
    assert model.execute([req]) is None
    assert req.sender.final.wait(30)
    responses = [r for r, _ in req.sender.sent if r is not None]
    assert [f for _, f in req.sender.sent][-1] == FINAL and all(f == 0 for _, f in req.sender.sent[:-1])
    tokens = [int(t) for r in responses for t in r.tensors["output_ids"].reshape(-1)]
    assert tokens == _reference(ckpt, 6)
    first = responses[0].tensors
    assert first["output_ids"].shape == (1, 1, 1) and first["output_ids"].dtype == np.int32
    assert first["sequence_length"].tolist() == [[1]] and first["batch_index"].tolist() == [[0]]
    assert first["output_log_probs"].shape == (1, 1, 1) and first["cum_log_probs"].dtype == np.float32


def test_decoupled_non_streaming_includes_prompt_unless_excluded(make_model, ckpt) -> None:
    model = make_model(decoupled=True)
    expected = _reference(ckpt, 5)
    a = _Request(_inputs(PROMPT, 5))
    b = _Request(_inputs(PROMPT, 5, exclude_input_in_output=np.array([True]),
                         return_perf_metrics=np.array([True])))
    model.execute([a, b])
    assert a.sender.final.wait(30) and b.sender.final.wait(30)
    (ra, fa), = a.sender.sent
    (rb, fb), = b.sender.sent
    assert fa == fb == FINAL
    assert ra.tensors["output_ids"].reshape(-1).tolist() == PROMPT + expected
    assert ra.tensors["sequence_length"].tolist() == [[len(PROMPT) + 5]]
    assert rb.tensors["output_ids"].reshape(-1).tolist() == expected
    t = rb.tensors
    assert 0 < t["arrival_time_ns"][0, 0] <= t["first_scheduled_time_ns"][0, 0] <= t["first_token_time_ns"][0, 0]
    assert t["first_token_time_ns"][0, 0] <= t["last_token_time_ns"][0, 0]
    assert t["kv_cache_alloc_total_blocks"][0, 0] >= 1


def test_model_parameter_exclude_input_in_output(make_model, ckpt) -> None:
    model = make_model(decoupled=True, exclude_input_in_output="true")
    a = _Request(_inputs(PROMPT, 3))
    model.execute([a])
    assert a.sender.final.wait(30)
    assert a.sender.sent[0][0].tensors["output_ids"].reshape(-1).tolist() == _reference(ckpt, 3)


def test_stop_words_and_end_id_tensors(make_model, ckpt) -> None:
    model = make_model(decoupled=True)
    ref = _reference(ckpt, 10)
    stop = encode_words_list([[ref[2]]])[None]  # [batch, 2, L]
    a = _Request(_inputs(PROMPT, 10, stop_words_list=stop, exclude_input_in_output=np.array([True])))
    b = _Request(_inputs(PROMPT, 10, end_id=np.array([ref[1]], np.int32), exclude_input_in_output=np.array([True])))
    model.execute([a, b])
    assert a.sender.final.wait(30) and b.sender.final.wait(30)
    got_a = a.sender.sent[0][0].tensors["output_ids"].reshape(-1).tolist()
    got_b = b.sender.sent[0][0].tensors["output_ids"].reshape(-1).tolist()
    assert got_a == ref[: ref.index(ref[2]) + 1]
    assert got_b == ref[: ref.index(ref[1])]


def test_unsupported_input_is_a_named_error(make_model) -> None:
    model = make_model(decoupled=True)
    req = _Request(_inputs(PROMPT, 4, beam_width=np.array([2], np.int32)))
    model.execute([req])
    (resp, flags), = req.sender.sent
    assert flags == FINAL and "beam_width" in resp.error.message()


def test_cancellation_via_sender_and_stop_input(make_model) -> None:
    model = make_model(decoupled=True)
    a = _Request(_inputs(PROMPT, 200, streaming=np.array([True])), "a")
    b = _Request(_inputs(PROMPT, 200, streaming=np.array([True])), "b")
    model.execute([a, b])
    stats = model.engine.stats()
    deadline = threading.Event()
    while len(a.sender.sent) < 2 or len(b.sender.sent) < 2:
        deadline.wait(0.01)
    a.sender.cancelled = True
    stop = _Request(_inputs(PROMPT, 1, stop=np.array([True])), "b")
    model.execute([stop])
    assert a.sender.final.wait(30) and b.sender.final.wait(30) and stop.sender.final.wait(5)
    n_a = sum(int(r.tensors["output_ids"].size) for r, _ in a.sender.sent if r is not None)
    assert n_a < 200
    for _ in range(200):
        if model.engine.stats().used_blocks == 0:
            break
        deadline.wait(0.02)
    assert model.engine.stats().used_blocks == 0 and stats.max_requests == 4


def test_non_decoupled_batch_returns_one_padded_response(make_model, ckpt) -> None:
    model = make_model(decoupled=False)
    ids = np.array([PROMPT, PROMPT[:4] + [0, 0, 0]], np.int32)
    req = _Request({
        "input_ids": ids,
        "input_lengths": np.array([[7], [4]], np.int32),
        "request_output_len": np.array([[3], [5]], np.int32),
        "pad_id": np.array([[0], [0]], np.int32),
        "exclude_input_in_output": np.array([[True], [True]]),
    })
    bad = _Request(_inputs(PROMPT, 3, streaming=np.array([True])))
    r, rbad = model.execute([req, bad])
    assert r.error is None and r.tensors["output_ids"].shape == (2, 1, 5)
    assert r.tensors["output_ids"][0, 0].tolist()[:3] == _reference(ckpt, 3)
    assert r.tensors["sequence_length"].tolist() == [[3], [5]]
    assert "streaming" in rbad.error.message()


def test_metrics_have_trtllm_names_and_labels(make_model) -> None:
    model = make_model(decoupled=False)
    model.execute([_Request(_inputs(PROMPT, 3))])
    fams = _MetricFamily.registry
    req = {m.labels["request_type"]: m.value for m in fams["nv_trt_llm_request_metrics"].metrics}
    kv = {m.labels["kv_cache_block_type"]: m.value for m in fams["nv_trt_llm_kv_cache_block_metrics"].metrics}
    assert req["max"] == 4 and req["completed"] >= 1
    assert kv["tokens_per"] == 64 and kv["max"] == kv["used"] + kv["free"] and kv["max"] >= 1
    assert "nv_trt_llm_inflight_batcher_metrics" in fams


def test_world_size_must_equal_tp_size(make_model, monkeypatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")  # a bare mpirun, no launcher: the starter's world size
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"3 ranks per replica \(MPI world 3\) != tp_size 2"):
        make_model(tp_size=2)


def test_replicas_need_a_whole_number_of_tp_groups(make_model, monkeypatch) -> None:
    monkeypatch.setenv("HPC_SERVE_WORLD_SIZE", "3")  # the launcher's decision (launcher/rank.py placement_env)
    monkeypatch.setenv("HPC_SERVE_RANKS_PER_REPLICA", "2")
    with pytest.raises(ValueError, match=r"2 ranks per replica \(MPI world 3\)"):
        make_model(tp_size=2)
