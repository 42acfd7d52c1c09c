"""Stand-in of TensorRT-LLM's llmapi `tensorrt_llm` model (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py),
for scripts/gpu/prove_llmapi_gpus.py. Upstream's model, under trtllm-llmapi-launch, builds an `LLM` whose MPI session
is a `RemoteMpiCommSessionClient` to the leader node (TLLM_SPAWN_PROXY_PROCESS=1). This one connects to the leader
node the same way (address and hex HMAC key from the environment), says what environment tritonserver gave it
(the proxy variables present, the MPI/Slurm ones absent), answers generate requests with text the leader node
computed on its GPU, and in finalize tells the leader node to end (None), as the launch's `--action stop` does.
"""

from __future__ import annotations

import os
import sys
import time
from multiprocessing.connection import Client
from typing import Any

# The stub's embedded Python ignores PYTHONPATH (backend/repository.py _shim says so); upstream's model finds
# tensorrt_llm in the image's site-packages, the stand-in on PYTHONPATH: honour it first, as python would.
for _entry in reversed([e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]):
    if _entry in sys.path:
        sys.path.remove(_entry)
    sys.path.insert(0, _entry)

import helpers  # noqa: E402
import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
from tensorrt_llm.llmapi import standin  # noqa: E402

CONNECT_TIMEOUT_S = 120.0


def _address(addr: str) -> tuple[str, int]:
    host, _, port = addr[len("tcp://") :].rpartition(":")
    return host, int(port)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        seen = helpers.environment_seen()
        addr = os.environ[helpers.PROXY_VARS[1]]
        key = bytes.fromhex(os.environ[helpers.PROXY_VARS[2]])
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:  # the leader node was started first, but takes a while to import torch and open its GPU
            try:
                self.conn = Client(_address(addr), authkey=key)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.conn.send(("hello", seen))
        seen["leader_node"] = self.conn.recv()
        standin.write_report(standin.report_path(standin.MODEL), seen)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                self.conn.send(("generate", helpers.prompt_of(request), helpers.max_tokens_of(request)))
                text = self.conn.recv()
                if isinstance(text, dict):
                    raise pb_utils.TritonModelException(f"leader node: {text['error']}")
                out = pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses

    def finalize(self) -> None:
        try:
            self.conn.send(None)
            self.conn.recv()
        except (OSError, EOFError):
            pass
        self.conn.close()
