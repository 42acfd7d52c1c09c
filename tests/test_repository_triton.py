"""The generated repository in a real tritonserver (nvidia-pytriton's CPU build, python backend).

tensorrt_llm is replaced by a tiny echo model written here (output_ids = input_ids), so the test pins
down the repository + preprocessing + postprocessing + BLS, not the CPU engine.

Output layouts are read the way upstream's clients read them: tensorrtllm_backend's end_to_end_grpc_client.py
and the HTTP examples do ``result.as_numpy("text_output")[0].decode("utf-8")`` (one flat element per beam);
inflight_batcher_llm_client.py reads ``output_ids[0][0][:sequence_length[0][0]]``.  The streamed text has
multi-byte characters split across the echo model's 2-token chunks, and every chunk is decoded strictly.
"""

from __future__ import annotations

import queue
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
from _triton import REPO_ROOT, find_tritonserver, tritonserver
from test_pre_post import build_tokenizer

from backend.repository import write_model_repository
from launcher.contracts.model_names import STREAM_REQUEST_PREFIX
from tests._env import unavailable

pytestmark = [pytest.mark.triton, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _needs_tritonserver() -> None:
    """Skip with the reason locally; on CI a missing binary is a broken setup (conftest convention)."""
    if find_tritonserver() is None:
        reason = "tritonserver binary not found (pip install 'hpc-serve[local]' for nvidia-pytriton)"
        unavailable(reason)


ECHO_MODEL = '''
"""Echo stand-in for tensorrt_llm: output_ids = input_ids[:input_lengths]; streams in chunks of 2
tokens when decoupled and streaming=true."""
import json
import numpy as np
import triton_python_backend_utils as pb


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def _responses(self, request):
        ids = pb.get_input_tensor_by_name(request, "input_ids").as_numpy()
        n = int(pb.get_input_tensor_by_name(request, "input_lengths").as_numpy().reshape(-1)[0])
        stream = pb.get_input_tensor_by_name(request, "streaming")
        stream = bool(stream.as_numpy().reshape(-1)[0]) if stream is not None else False
        step = 2 if stream else n
        for start in range(0, n, step):
            part = ids[:, start:min(n, start + step)].astype(np.int32)[:, None, :]
            yield pb.InferenceResponse(output_tensors=[
                pb.Tensor("output_ids", part),
                pb.Tensor("sequence_length", np.array([[part.shape[2]]], dtype=np.int32)),
                pb.Tensor("batch_index", np.zeros((1, 1), dtype=np.int32)),
            ])

    def execute(self, requests):
        if not self.decoupled:
            return [next(self._responses(r)) for r in requests]
        for r in requests:
            sender = r.get_response_sender()
            for resp in self._responses(r):
                sender.send(resp)
            sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

TEXT = "Hello world, hello Triton! ünïcødé"
SPLIT_TEXT = "Grüße ✓ 中文字 🙂 ünïcødé"  # characters of 2-4 bytes: byte-level tokens split them across chunks


def make_repo(tmp_path: Path, decoupled: bool) -> Path:
    tok = build_tokenizer(tmp_path / "tokenizer")
    out = tmp_path / "repo"
    write_model_repository(
        out,
        "cpu",
        {
            "triton_max_batch_size": 4,
            "decoupled_mode": decoupled,
            "logits_datatype": "TYPE_FP32",
            "encoder_input_features_data_type": "TYPE_FP16",
            "preprocessing_instance_count": 1,
            "postprocessing_instance_count": 1,
            "bls_instance_count": 1,
            "tokenizer_dir": str(tok),
            "engine_dir": str(tmp_path / "no-engine"),
            "max_queue_size": 0,
            "max_queue_delay_microseconds": 0,
            "accumulate_tokens": False,
        },
    )
    (out / "tensorrt_llm" / "1" / "model.py").write_text(ECHO_MODEL)
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """One tritonserver for the module: the repository with decoupled_mode false."""
    tmp = tmp_path_factory.mktemp("plain")
    with tritonserver(make_repo(tmp, decoupled=False), tmp) as server:
        yield server


@pytest.fixture(scope="module")
def decoupled(tmp_path_factory):
    """One tritonserver for the module: the repository with decoupled_mode true (streaming)."""
    tmp = tmp_path_factory.mktemp("decoupled")
    with tritonserver(make_repo(tmp, decoupled=True), tmp) as server:
        yield server


def test_stubs_import_the_tree_on_pythonpath_not_the_installed_one(tmp_path):
    """The stub's embedded Python ignores PYTHONPATH; the shims honour it, so the stubs run the deployment's
    shipped copy (`D/python`) and a tree that is not pip-installed at all (this checkout is, so without the
    shims' help the stubs would import it instead, and the marker would never be written)."""
    shipped = tmp_path / "shipped"
    shutil.copytree(REPO_ROOT / "backend", shipped / "backend", ignore=shutil.ignore_patterns("__pycache__"))
    marker = tmp_path / "imported-from-shipped"
    with open(shipped / "backend" / "__init__.py", "a") as fh:
        fh.write(f"\nopen({str(marker)!r}, 'a').write(__file__ + '\\n')\n")
    with tritonserver(make_repo(tmp_path, decoupled=False), tmp_path, source_root=shipped) as server:
        status, body = server.post("/v2/models/ensemble/generate", {"text_input": TEXT, "max_tokens": 8})
        assert status == 200, (body, server.log_tail())
    assert marker.is_file(), "the python stubs imported an installed hpc-serve, not the tree on PYTHONPATH"
    assert set(marker.read_text().split()) == {str(shipped / "backend" / "__init__.py")}


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_round_trip(plain, model):
    status, body = plain.post(f"/v2/models/{model}/generate", {"text_input": TEXT, "max_tokens": 8})
    assert status == 200, (model, body, plain.log_tail())
    assert body["text_output"] == TEXT, (model, body)
    assert body.get("batch_index") == 0 or body.get("batch_index") == [0], (model, body)


def test_stop_words_reach_the_engine_without_breaking_the_pipeline(plain):
    status, body = plain.post(
        "/v2/models/ensemble/generate", {"text_input": TEXT, "max_tokens": 8, "stop_words": ["world", "Triton"]}
    )
    assert status == 200 and body["text_output"] == TEXT, body


@pytest.mark.parametrize("extra,expected", [({"num_draft_tokens": 2}, "draft"), ({"stream": True}, "decoupled")])
def test_bls_errors_are_the_requests_error(plain, extra, expected):
    status, body = plain.post("/v2/models/tensorrt_llm_bls/generate", {"text_input": TEXT, "max_tokens": 8, **extra})
    assert status >= 400 and expected in body.get("error", ""), body


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_decoupled_models_answer_generate(decoupled, model):
    status, body = decoupled.post(f"/v2/models/{model}/generate", {"text_input": TEXT, "max_tokens": 8})
    assert status == 200 and body["text_output"] == TEXT, (model, body, decoupled.log_tail())


def test_bls_generate_stream_chunks_concatenate(decoupled):
    chunks = decoupled.stream(
        "/v2/models/tensorrt_llm_bls/generate_stream", {"text_input": TEXT, "max_tokens": 8, "stream": True}
    )
    texts = [c["text_output"] for c in chunks]
    assert len(texts) > 2 and "".join(texts) == TEXT, chunks


def _inputs(client_module, text: str | list[str], stream: bool | None = None, max_tokens: int = 64) -> list:
    texts = [text] if isinstance(text, str) else text
    arrays = {
        "text_input": np.array([[t.encode()] for t in texts], dtype=object),
        "max_tokens": np.full((len(texts), 1), max_tokens, np.int32),
    }
    if stream is not None:
        arrays["stream"] = np.full((len(texts), 1), stream, bool)
    tensors = []
    for name, array in arrays.items():
        dtype = {"O": "BYTES", "i": "INT32", "b": "BOOL"}[array.dtype.kind]
        t = client_module.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        tensors.append(t)
    return tensors


def _stream(grpc_url: str, model: str, text: str, request_id: str = "") -> list[str]:
    """Upstream's streaming client: one callback per response, each chunk decoded on its own."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(
        model, _inputs(grpcclient, text, stream=True), request_id=request_id, enable_empty_final_response=True
    )
    pieces = []
    while True:
        result, error = results.get(timeout=60)
        assert error is None, error
        out = result.as_numpy("text_output")
        if out is not None:
            assert out.ndim == 1, f"{model}: text_output {out.shape} is not upstream's flat layout"
            pieces.append(out[0].decode("utf-8"))  # strict: raw partial bytes would raise here
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return pieces


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_text_output_is_flat_and_decodes_like_upstream_reads_it(plain, model, protocol):
    module = _client_module(protocol)
    port = plain.http_port if protocol == "http" else plain.grpc_port
    out = (
        module.InferenceServerClient(f"127.0.0.1:{port}")
        .infer(model, _inputs(module, SPLIT_TEXT))
        .as_numpy("text_output")
    )
    assert out.shape == (1,) and out[0].decode("utf-8") == SPLIT_TEXT, (model, out)


def test_each_model_alone_as_end_to_end_test_calls_them(plain, tmp_path_factory):
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(f"127.0.0.1:{plain.http_port}")
    pre = http.infer("preprocessing", _pre_inputs(httpclient))
    ids, lens = pre.as_numpy("INPUT_ID"), pre.as_numpy("REQUEST_INPUT_LEN")
    assert ids.ndim == 2 and lens.shape == (1, 1)
    post = http.infer("postprocessing", _post_inputs(httpclient, ids[:, None, :], lens))
    assert post.as_numpy("OUTPUT").shape == (1,) and post.as_numpy("OUTPUT")[0].decode() == SPLIT_TEXT
    core = http.infer("tensorrt_llm", _core_inputs(httpclient, ids, lens))
    seq = core.as_numpy("sequence_length")
    assert core.as_numpy("output_ids")[0][0][: seq[0][0]].tolist() == ids[0, : lens[0, 0]].tolist()


def test_postprocessing_batch_is_one_flat_element_per_row(plain):
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(f"127.0.0.1:{plain.http_port}")
    pre = http.infer("preprocessing", _pre_inputs(httpclient))
    ids, lens = pre.as_numpy("INPUT_ID"), pre.as_numpy("REQUEST_INPUT_LEN")
    two = np.concatenate([ids[:, None, :], ids[:, None, :]])
    post = http.infer("postprocessing", _post_inputs(httpclient, two, np.array([[lens[0, 0]], [3]])))
    texts = [o.decode() for o in post.as_numpy("OUTPUT")]
    assert texts[0] == SPLIT_TEXT and SPLIT_TEXT.startswith(texts[1].rstrip("\ufffd")) and len(texts) == 2


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_streamed_chunks_arrive_as_whole_characters(decoupled, model):
    request_id = f"{STREAM_REQUEST_PREFIX}{uuid.uuid4()}" if model == "ensemble" else ""
    pieces = _stream(f"127.0.0.1:{decoupled.grpc_port}", model, SPLIT_TEXT, request_id)
    assert len(pieces) > 3 and "".join(pieces) == SPLIT_TEXT, (model, pieces)
    assert not any("\ufffd" in p for p in pieces), (model, pieces)


def test_ensemble_stream_without_our_request_id_behaves_like_upstream(decoupled):
    """The ensemble cannot tell streams apart without hpc-serve's request id: split characters arrive as U+FFFD,
    exactly as upstream's ensemble does (docs/compatibility.md: where hpc-serve differs)."""
    pieces = _stream(f"127.0.0.1:{decoupled.grpc_port}", "ensemble", SPLIT_TEXT)
    assert "\ufffd" in "".join(pieces) and len(pieces) > 3


def _client_module(protocol: str):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return httpclient if protocol == "http" else grpcclient


def _pre_inputs(module) -> list:
    query = module.InferInput("QUERY", [1, 1], "BYTES")
    query.set_data_from_numpy(np.array([[SPLIT_TEXT.encode()]], dtype=object))
    out_len = module.InferInput("REQUEST_OUTPUT_LEN", [1, 1], "INT32")
    out_len.set_data_from_numpy(np.array([[8]], np.int32))
    return [query, out_len]


def _post_inputs(module, tokens: np.ndarray, lengths: np.ndarray) -> list:
    t = module.InferInput("TOKENS_BATCH", list(tokens.shape), "INT32")
    t.set_data_from_numpy(tokens.astype(np.int32))
    n = module.InferInput("SEQUENCE_LENGTH", list(lengths.shape), "INT32")
    n.set_data_from_numpy(lengths.astype(np.int32))
    return [t, n]


def _core_inputs(module, ids: np.ndarray, lengths: np.ndarray) -> list:
    arrays = {
        "input_ids": ids.astype(np.int32),
        "input_lengths": lengths.astype(np.int32),
        "request_output_len": np.array([[8]], np.int32),
    }
    tensors = []
    for name, array in arrays.items():
        t = module.InferInput(name, list(array.shape), "INT32")
        t.set_data_from_numpy(array)
        tensors.append(t)
    return tensors
