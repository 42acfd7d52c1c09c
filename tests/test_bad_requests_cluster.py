"""Bad requests against one tp 2 job across node1/node2, with clients nobody here wrote (tritonclient shaped like
upstream's clients, raw HTTP): each gets a clear error or a correct answer, and after each one a normal request
still succeeds on the same job, which stays READY.  One job serves the whole module (it takes ~15 s to start).
"""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time

import numpy as np
import pytest

from hpc.serving.auth import grpc_headers, http_headers
from tests._triton import post_json
from tests.e2e import cli, job_token, module_job, status

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]

VOCAB, CONTEXT = 512, 256  # the tiny checkpoint (backend/cpu_engine/init_model.py SIZES["tiny"])


@pytest.fixture(scope="module")
def served(slurm_cluster, tritonserver, tiny_gpt2, tmp_path_factory):
    """(job id, endpoint record) of a READY tp 2 job across two nodes with a max batch of 4."""
    spec = dict(tp=2, nodes=2, ntasks_per_node=1, triton={"triton_max_batch_size": 4})
    with module_job(tmp_path_factory.mktemp("bad-requests"), "bad-requests", tiny_gpt2, **spec) as served:
        yield served


def _post(endpoint: dict, path: str, body: bytes | dict, timeout: float = 60) -> tuple[int, dict]:
    headers = http_headers(job_token(endpoint["job_id"]))  # auth: token, as every client sends it
    return post_json(endpoint["address"], endpoint["http_port"], path, body, timeout, headers)


def _generate(endpoint: dict, body: bytes | dict, model: str = "ensemble") -> tuple[int, dict]:
    return _post(endpoint, f"/v2/models/{model}/generate", body)


@pytest.fixture
def still_serving(served):
    """After the test's bad request: a normal request is answered and the job is still READY."""
    yield
    job, endpoint = served
    code, body = _generate(endpoint, {"text_input": "Once upon a time", "max_tokens": 8})
    assert code == 200 and body["text_output"], body
    assert status(job)["state"] == "READY"


def _core(
    endpoint: dict, arrays: dict[str, np.ndarray], dtypes: dict[str, str] | None = None, model: str = "tensorrt_llm"
) -> list:
    """inflight_batcher_llm_client.py --streaming: token ids straight to the (decoupled) tensorrt_llm model over
    gRPC (or any decoupled model); returns the responses, raises the first error."""
    import queue

    import tritonclient.grpc as grpcclient

    inputs = []
    for name, array in arrays.items():
        dtype = (dtypes or {}).get(name) or {"i": "INT32", "f": "FP32", "b": "BOOL", "u": "UINT64", "O": "BYTES"}[
            array.dtype.kind
        ]
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"{endpoint['address']}:{endpoint['grpc_port']}")
    headers = grpc_headers(job_token(endpoint["job_id"]))
    client.start_stream(callback=lambda result, error: results.put((result, error)), headers=headers)
    responses = []
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                raise error
            responses.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()
        client.close()


def _ids(*ids: int, out: int = 4) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.array([ids], np.int32),
        "input_lengths": np.array([[len(ids)]], np.int32),
        "request_output_len": np.array([[out]], np.int32),
    }


def _core_error(endpoint: dict, arrays: dict[str, np.ndarray], **kw) -> str:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as err:
        _core(endpoint, arrays, **kw)
    return str(err.value)


@pytest.mark.parametrize(
    "ids,where",
    [
        ((5, 2**31 - 1, 7), "token id 2147483647 at position 1"),
        ((5, VOCAB), f"token id {VOCAB} at position 1"),
        ((-3, 5), "token id -3 at position 0"),
    ],
)
def test_token_ids_outside_the_vocabulary(served, still_serving, ids, where):
    message = _core_error(served[1], _ids(*ids))
    assert where in message and f"[0, {VOCAB})" in message


def test_input_lengths_that_disagree_with_input_ids(served, still_serving):
    arrays = {**_ids(5, 6, 7), "input_lengths": np.array([[9]], np.int32)}
    assert "must be in [1, 3]" in _core_error(served[1], arrays)


@pytest.mark.parametrize("max_tokens,expected", [(0, "at least 1"), (-5, "at least 1")])
def test_max_tokens_out_of_range(served, still_serving, max_tokens, expected):
    code, body = _generate(served[1], {"text_input": "Hello", "max_tokens": max_tokens})
    assert code == 400 and expected in body["error"], body


def test_max_tokens_past_the_context_are_cut_to_the_room_left(served, still_serving):
    """As TensorRT-LLM does (a warning, not an error): the answer stops where the context ends."""
    code, body = _generate(served[1], {"text_input": "Hello", "max_tokens": 100_000})
    assert code == 200 and body["text_output"], body


def test_max_tokens_not_a_number(served, still_serving):
    code, body = _generate(served[1], {"text_input": "Hello", "max_tokens": "abc"})
    # tritonserver's own JSON parser answers (with 500, not 400: docs/compatibility.md, what a client may rely on)
    assert code >= 400 and "Unable to parse" in body["error"], body


def test_empty_prompt(served, still_serving):
    code, body = _generate(served[1], {"text_input": "", "max_tokens": 4})
    assert code == 400 and "empty" in body["error"], body


def test_prompt_of_100k_characters(served, still_serving):
    code, body = _generate(served[1], {"text_input": "lorem ipsum " * 8334, "max_tokens": 4})
    assert code == 400 and f"context (max_seq_len) is {CONTEXT} tokens" in body["error"], body


def test_invalid_utf8_and_non_json_bodies(served, still_serving):
    code, body = _generate(served[1], b'{"text_input": "\xff\xfe", "max_tokens": 4}')
    assert code == 400 and "UTF-8" in body["error"], body
    code, body = _generate(served[1], b"this is not json")
    assert code >= 400 and "failed to parse the request JSON" in body["error"], body  # tritonserver's answer
    arrays = {"text_input": np.array([[b"ok \xff"]], dtype=object), "max_tokens": np.array([[4]], np.int32)}
    message = _core_error(served[1], arrays, model="ensemble")
    assert "input QUERY is not valid UTF-8 (byte 3" in message


def test_wrong_dtypes_and_shapes(served, still_serving):
    assert "FP32" in _core_error(served[1], {**_ids(5, 6), "input_ids": np.array([[5.0, 6.0]], np.float32)})
    three_d = {**_ids(5, 6), "input_ids": np.array([[[5, 6]]], np.int32)}
    assert "input_ids" in _core_error(served[1], three_d)


@pytest.mark.parametrize(
    "extra,expected",
    [({"beam_width": 2}, "beam"), ({"lora_task_id": 3}, "LoRA"), ({"num_return_sequences": 2}, "num_return_sequences")],
)
def test_unsupported_features_are_named(served, still_serving, extra, expected):
    code, body = _generate(served[1], {"text_input": "Hello", "max_tokens": 4, **extra})
    assert code == 400 and expected in body["error"], body


def test_client_disconnecting_mid_stream(served, still_serving):
    endpoint = served[1]
    body = json.dumps({"text_input": "Once upon a time", "max_tokens": 200, "stream": True}).encode()
    auth = "".join(f"{k}: {v}\r\n" for k, v in http_headers(job_token(endpoint["job_id"])).items()).encode()
    with socket.create_connection((endpoint["address"], endpoint["http_port"]), timeout=30) as sock:
        sock.sendall(
            b"POST /v2/models/ensemble/generate_stream HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: "
            b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        got = b""
        while b"data:" not in got and (part := sock.recv(4096)):  # the head may come alone, before the first event
            got += part
        assert b"data:" in got  # the stream started; now the client goes away

    def active_requests() -> float:
        metrics = json.loads(cli("metrics", served[0], "--json").stdout)
        return next(
            m["value"]
            for m in metrics
            if m["name"] == "nv_trt_llm_request_metrics" and m["labels"].get("request_type") == "active"
        )

    deadline = time.monotonic() + 60  # the engine notices the cancelled stream and frees its slot
    while active_requests() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert active_requests() == 0


def test_200_concurrent_requests_against_a_max_batch_of_4(served, still_serving):
    prompts = [f"Request {i} says" for i in range(200)]
    alone = {p: _generate(served[1], {"text_input": p, "max_tokens": 6})[1]["text_output"] for p in prompts[:3]}
    with concurrent.futures.ThreadPoolExecutor(max_workers=200) as pool:
        results = list(pool.map(lambda p: _generate(served[1], {"text_input": p, "max_tokens": 6}), prompts))
    assert [code for code, _ in results] == [200] * 200, [b for c, b in results if c != 200][:3]
    assert all(results[i][1]["text_output"] == alone[p] for i, p in enumerate(prompts[:3]))
