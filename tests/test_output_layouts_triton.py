"""Output layouts read the way upstream's clients read them, against a real tritonserver.

tensorrtllm_backend's end_to_end_grpc_client.py and the HTTP examples do
``result.as_numpy("text_output")[0].decode("utf-8")`` (one flat element per beam); inflight_batcher_llm_client.py
reads ``output_ids[0][0][:sequence_length[0][0]]``.  Every model and mode here is read exactly so, with a text
whose multi-byte characters are split across the 2-token chunks of a stream (strict UTF-8 decoding of every
chunk: a held-back character must arrive whole, never as U+FFFD).
"""
from __future__ import annotations

import queue
import uuid
from pathlib import Path

import numpy as np
import pytest

from _triton import find_tritonserver, tritonserver
from backend.models.detokenize import STREAM_REQUEST_PREFIX
from backend.models.tokenizer import load_tokenizer
from test_repository_triton import make_repo
from tests._env import unavailable

pytestmark = [pytest.mark.triton, pytest.mark.slow]

TEXT = "Grüße ✓ 中文字 🙂 ünïcødé"


@pytest.fixture(autouse=True)
def _needs_tritonserver() -> None:
    if find_tritonserver() is None:
        unavailable("tritonserver binary not found (pip install 'hpc-serve[local]' for nvidia-pytriton)")


def _inputs(client_module, text: str | list[str], stream: bool | None = None, max_tokens: int = 64) -> list:
    texts = [text] if isinstance(text, str) else text
    arrays = {"text_input": np.array([[t.encode()] for t in texts], dtype=object),
              "max_tokens": np.full((len(texts), 1), max_tokens, np.int32)}
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
    client.async_stream_infer(model, _inputs(grpcclient, text, stream=True), request_id=request_id,
                              enable_empty_final_response=True)
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


def test_non_streaming_layouts_match_upstream(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    repo = make_repo(tmp_path, decoupled=False)
    with tritonserver(repo, tmp_path) as server:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        for model in ("ensemble", "tensorrt_llm_bls"):
            for client, module in ((http, httpclient), (grpc, grpcclient)):
                out = client.infer(model, _inputs(module, TEXT)).as_numpy("text_output")
                assert out.shape == (1,) and out[0].decode("utf-8") == TEXT, (model, out)
        # the models one by one, as upstream's end_to_end_test.py calls them
        pre = http.infer("preprocessing", _pre_inputs(httpclient))
        ids, lens = pre.as_numpy("INPUT_ID"), pre.as_numpy("REQUEST_INPUT_LEN")
        assert ids.ndim == 2 and lens.shape == (1, 1)
        post = http.infer("postprocessing", _post_inputs(httpclient, ids[:, None, :], lens))
        assert post.as_numpy("OUTPUT").shape == (1,) and post.as_numpy("OUTPUT")[0].decode() == TEXT
        two = np.concatenate([ids[:, None, :], ids[:, None, :]])  # a batch of two rows: one element per row
        post = http.infer("postprocessing", _post_inputs(httpclient, two, np.array([[lens[0, 0]], [3]])))
        three = load_tokenizer(tmp_path / "tokenizer").decode(ids[0, :3].tolist())
        assert [o.decode() for o in post.as_numpy("OUTPUT")] == [TEXT, three]
        core = http.infer("tensorrt_llm", _core_inputs(httpclient, ids, lens))
        seq = core.as_numpy("sequence_length")
        assert core.as_numpy("output_ids")[0][0][: seq[0][0]].tolist() == ids[0, : lens[0, 0]].tolist()


def test_streaming_chunks_arrive_as_whole_characters(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, decoupled=True)
    with tritonserver(repo, tmp_path) as server:
        url = f"127.0.0.1:{server.grpc_port}"
        cases = {"tensorrt_llm_bls": "", "ensemble": f"{STREAM_REQUEST_PREFIX}{uuid.uuid4()}"}
        for model, request_id in cases.items():
            pieces = _stream(url, model, TEXT, request_id)
            assert len(pieces) > 3 and "".join(pieces) == TEXT, (model, pieces)
            assert not any("\ufffd" in p for p in pieces), (model, pieces)
        # an upstream client without hpc-serve's request id: the ensemble cannot tell streams apart, so split
        # characters arrive as U+FFFD, exactly as upstream's ensemble does (README: where we differ)
        pieces = _stream(url, "ensemble", TEXT)
        assert "\ufffd" in "".join(pieces) and len(pieces) > 3


def _pre_inputs(module) -> list:
    query = module.InferInput("QUERY", [1, 1], "BYTES")
    query.set_data_from_numpy(np.array([[TEXT.encode()]], dtype=object))
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
    arrays = {"input_ids": ids.astype(np.int32), "input_lengths": lengths.astype(np.int32),
              "request_output_len": np.array([[8]], np.int32)}
    tensors = []
    for name, array in arrays.items():
        t = module.InferInput(name, list(array.shape), "INT32")
        t.set_data_from_numpy(array)
        tensors.append(t)
    return tensors
