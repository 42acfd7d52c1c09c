"""The generated repository in a real tritonserver (nvidia-pytriton's CPU build, python backend).

tensorrt_llm is replaced by a tiny echo model written here (output_ids = input_ids), so the test pins
down the repository + preprocessing + postprocessing + BLS, not the CPU engine.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from _triton import find_tritonserver, tritonserver
from backend.repository import write_model_repository
from test_pre_post import build_tokenizer
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


def make_repo(tmp_path: Path, decoupled: bool) -> Path:
    tok = build_tokenizer(tmp_path / "tokenizer")
    out = tmp_path / "repo"
    write_model_repository(out, "cpu", {
        "triton_max_batch_size": 4, "decoupled_mode": decoupled, "logits_datatype": "TYPE_FP32",
        "encoder_input_features_data_type": "TYPE_FP16", "preprocessing_instance_count": 1,
        "postprocessing_instance_count": 1, "bls_instance_count": 1, "tokenizer_dir": str(tok),
        "engine_dir": str(tmp_path / "no-engine"), "max_queue_size": 0, "max_queue_delay_microseconds": 0,
        "accumulate_tokens": False,
    })
    (out / "tensorrt_llm" / "1" / "model.py").write_text(ECHO_MODEL)
    return out


def test_ensemble_and_bls_round_trip(tmp_path):
    repo = make_repo(tmp_path, decoupled=False)
    with tritonserver(repo, tmp_path) as server:
        for model in ("ensemble", "tensorrt_llm_bls"):
            status, body = server.post(f"/v2/models/{model}/generate", {"text_input": TEXT, "max_tokens": 8})
            assert status == 200, (model, body, server.log_tail())
            assert body["text_output"] == TEXT, (model, body)
            assert body.get("batch_index") == 0 or body.get("batch_index") == [0], (model, body)
        # stop words reach the engine in TRT-LLM format without breaking the pipeline
        status, body = server.post("/v2/models/ensemble/generate",
                                   {"text_input": TEXT, "max_tokens": 8, "stop_words": ["world", "Triton"]})
        assert status == 200 and body["text_output"] == TEXT, body
        # inner/unsupported errors surface as the request's error
        status, body = server.post("/v2/models/tensorrt_llm_bls/generate",
                                   {"text_input": TEXT, "max_tokens": 8, "num_draft_tokens": 2})
        assert status >= 400 and "draft" in body.get("error", ""), body
        status, body = server.post("/v2/models/tensorrt_llm_bls/generate",
                                   {"text_input": TEXT, "max_tokens": 8, "stream": True})
        assert status >= 400 and "decoupled" in body.get("error", ""), body


def test_decoupled_streaming_bls(tmp_path):
    repo = make_repo(tmp_path, decoupled=True)
    with tritonserver(repo, tmp_path) as server:
        for model in ("ensemble", "tensorrt_llm_bls"):
            status, body = server.post(f"/v2/models/{model}/generate", {"text_input": TEXT, "max_tokens": 8})
            assert status == 200 and body["text_output"] == TEXT, (model, body, server.log_tail())
        chunks = server.stream("/v2/models/tensorrt_llm_bls/generate_stream",
                               {"text_input": TEXT, "max_tokens": 8, "stream": True})
        texts = [c["text_output"] for c in chunks]
        assert len(texts) > 2 and "".join(texts) == TEXT, chunks
