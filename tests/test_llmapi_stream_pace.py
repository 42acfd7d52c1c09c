"""How hpc-serve's llmapi model (backend/models/llmapi.py) paces a stream's responses to its sender: a token each
while the sender keeps up, several tokens in one response once it falls behind, the same text either way.

In this process: the model over the CPU engine's stand-in of TensorRT-LLM (its engine in a thread) and a stand-in of
`triton_python_backend_utils` (which exists only inside tritonserver's python stub) whose response sender can be
held, so that "behind" is an event (the engine finished the request while the first response was still being
sent), not a timing. The model in the real tritonserver: tests/test_llmapi_cpu.py."""

from __future__ import annotations

import json
import queue
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from backend.cpu_engine.llmapi import protocol as p
from launcher.contracts.llmapi import CPU_MIN_STEP_VAR, STANDIN_ROOT
from tests.e2e import wait_for
from tests.steps import GPU_PACE_MS
from tests.test_engine_metrics import Family

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"
TOKENS = 8
FINAL = 1


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError(Exception):
    CANCELLED = "cancelled"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self.tensors = {t.name(): t.as_numpy() for t in output_tensors or []}
        self.error = error


class Logger:
    log_info = log_warn = log_error = staticmethod(lambda message: None)


def stub_utils() -> types.ModuleType:
    """What the model asks of `triton_python_backend_utils`."""
    module = types.ModuleType("triton_python_backend_utils")
    module.Tensor = Tensor  # type: ignore[attr-defined]
    module.TritonError = TritonError  # type: ignore[attr-defined]
    module.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    module.InferenceResponse = InferenceResponse  # type: ignore[attr-defined]
    module.Logger = Logger  # type: ignore[attr-defined]
    module.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL  # type: ignore[attr-defined]
    module.using_decoupled_model_transaction_policy = lambda config: True  # type: ignore[attr-defined]
    module.MetricFamily = Family  # type: ignore[attr-defined]  # the model's own in-flight gauge
    return module


class Sender:
    """A request's response sender: every response into `responses`; with `hold`, the first send waits until the
    event is set (a sender behind, as tritonserver's is when its process is busy)."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.hold, self.responses = hold, queue.Queue()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.hold is not None:
            self.hold.wait(60)
            self.hold = None
        self.responses.put((response, flags))

    def texts(self) -> list[str]:
        """The streamed texts to the final response (included)."""
        out = []
        while True:
            response, flags = self.responses.get(timeout=60)
            assert response.error is None, response.error
            out.append(response.tensors["text_output"][0].decode())
            if flags & FINAL:
                return out


class Request:
    def __init__(self, sender: Sender, request_id: str) -> None:
        inputs = {
            "text_input": np.array([PROMPT.encode()], dtype=np.object_),
            "sampling_param_max_tokens": np.array([TOKENS], dtype=np.int32),
            "sampling_param_ignore_eos": np.array([True]),
            "streaming": np.array([True]),
        }
        self._inputs = [Tensor(k, v) for k, v in inputs.items()]
        self._sender, self._id = sender, request_id

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def get_response_sender(self) -> Sender:
        return self._sender

    def request_id(self) -> str:
        return self._id

    def is_cancelled(self) -> bool:
        return False


@pytest.fixture(scope="module")
def model(tiny_gpt2, tmp_path_factory) -> Iterator[Any]:
    """The model, initialized as tritonserver would, on the stand-in (the engine in this process, stepping at a
    GPU's pace, so that a sender that is not held keeps up)."""
    pace = pytest.MonkeyPatch()
    pace.setenv(CPU_MIN_STEP_VAR, str(GPU_PACE_MS))
    sys.path.insert(0, str(ROOT / STANDIN_ROOT))
    sys.modules["triton_python_backend_utils"] = stub_utils()
    repo = tmp_path_factory.mktemp("repo")
    (repo / "1").mkdir()
    # no iteration stats: the test alone asks the engine for its counts
    config = {"model": str(tiny_gpt2), "max_batch_size": 4, "enable_iter_perf_stats": False}
    (repo / "1" / "model.yaml").write_text(yaml.safe_dump(config))
    from backend.models.llmapi import TritonPythonModel

    model = TritonPythonModel()
    args = {"model_config": json.dumps({}), "model_repository": str(repo), "model_version": "1"}
    model.initialize(args | {"model_name": "tensorrt_llm"})
    try:
        yield model
    finally:
        model.finalize()
        pace.undo()
        sys.path.remove(str(ROOT / STANDIN_ROOT))
        del sys.modules["triton_python_backend_utils"]
        for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
            del sys.modules[name]


def completed(model: Any) -> int:
    stats = model.llm._ask(p.StatsQuery(), 5)
    assert isinstance(stats, p.Stats)
    return stats.completed_requests


def test_a_sender_that_keeps_up_gets_each_token_alone_one_behind_gets_them_together(model):
    sender = Sender()
    model.execute([Request(sender, "alone")])
    alone = sender.texts()
    assert len(alone) == TOKENS and all(len(a) < len(b) for a, b in zip(alone, alone[1:], strict=False)), alone

    before = completed(model)
    hold = threading.Event()
    sender = Sender(hold)
    model.execute([Request(sender, "behind")])
    wait_for(lambda: completed(model) > before, 60, "the engine to finish the request", interval=0.05)
    hold.set()
    together = sender.texts()
    # the first token's response was being sent while the engine made the other seven: the loop then finds them
    # waiting, sends the first of them at once, the next five in one response, and the last (the final) alone
    assert together == [alone[0], alone[1], alone[-2], alone[-1]], together
