"""tritonserver 2.51 never releases an ensemble request whose gRPC stream was cancelled while a step's request
waited: a two-model toy ensemble, none of hpc-serve's models. Why it is kept: the gateway stops abandoned
streams by request id instead of cancelling them (hpc/serving/abandon.py), and this is the evidence that the
leak is tritonserver's, not our models' (and what to send upstream).

The toy: `gen` (python, decoupled) sends 200 responses 10 ms apart, ignoring cancellation as an engine busy on a
batch would; `post` (python) passes each through, taking `--post-ms` per request; `ens` chains them. Three
streams are cancelled after their 5th response, then tritonserver gets SIGTERM. Seen (2026-11-23, the
nvidia-pytriton wheel's tritonserver 2.51, CPU):

    post 0 ms:  exit 0 in 2.6 s, nothing in flight
    post 30 ms: exit 1 in 8.7 s, "Model 'ens' (version 1) has 3 in-flight inferences" ("Exit timeout expired")

Run: `python scripts/repro_ensemble_cancel_leak.py [--post-ms 30]` (needs the test dependencies: nvidia-pytriton,
tritonclient).
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._triton import tritonserver  # noqa: E402 - the wheel's tritonserver, as the tests start it

GEN = """
import threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._run, args=(request,), daemon=True).start()
        return None

    def _run(self, request):
        sender = request.get_response_sender()
        for i in range(200):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            time.sleep(0.01)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
POST = """
import os, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(float(os.environ["TOY_POST_S"]))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""
CONFIGS = {
    "gen": """name: "gen" backend: "python" max_batch_size: 0 model_transaction_policy { decoupled: true }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]""",
    "post": """name: "post" backend: "python" max_batch_size: 0
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ] output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]""",
    "ens": """name: "ens" platform: "ensemble" max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
        ensemble_scheduling { step [
          { model_name: "gen" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "_mid" } },
          { model_name: "post" model_version: -1 input_map { key: "X" value: "_mid" } output_map { key: "Y" value: "Y" } } ] }""",
}


def write_repository(root: Path) -> Path:
    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (root / "gen" / "1" / "model.py").write_text(GEN)
    (root / "post" / "1" / "model.py").write_text(POST)
    return root


def cancel_streams(grpc_port: int, streams: int) -> None:
    """`streams` streams to `ens`, each cancelled after its 5th response."""
    for k in range(streams):
        got: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(
            f"127.0.0.1:{grpc_port}", channel_args=[("grpc.enable_http_proxy", 0)]
        )
        client.start_stream(callback=lambda result, error, got=got: got.put(error))
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        client.async_stream_infer("ens", [tensor], request_id=f"r{k}")
        for _ in range(5):
            error = got.get(timeout=30)
            assert error is None, error
        client.stop_stream(cancel_requests=True)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--post-ms", type=float, default=30.0, help="what `post` takes per request (0: no leak)")
    parser.add_argument("--streams", type=int, default=3)
    args = parser.parse_args()
    os.environ["TOY_POST_S"] = str(args.post_ms / 1000)
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo")
        with tritonserver(repo, Path(tmp), extra_args=("--exit-timeout-secs=8",)) as server:
            cancel_streams(server.grpc_port, args.streams)
            time.sleep(4)  # every `gen` has sent its 200 responses and its final flag by now
            os.killpg(server.process.pid, signal.SIGTERM)
            started = time.monotonic()
            code = server.process.wait(60)
            log = server.log.read_text(errors="replace")
    leaked = re.findall(r"has \d+ in-flight inferences", log)
    print(
        f"post {args.post_ms:g} ms: exit {code} in {time.monotonic() - started:.1f} s, in flight: {leaked[:1] or 'none'}"
    )


if __name__ == "__main__":
    main()
