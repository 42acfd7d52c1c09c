"""Talk to a served job through the host its leader published — never an assumed localhost.

from hpc.client import Client
client = Client.from_job("1234")
print(client.generate("The capital of France is", max_tokens=16))
for piece in client.stream("Once upon a time", max_tokens=32):
    print(piece, end="", flush=True)
"""

from __future__ import annotations

import codecs
import json
import queue
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

from backend.models.detokenize import STREAM_REQUEST_PREFIX
from hpc.jobs import JobRef, find_job
from launcher.records import EndpointRecord, read_endpoints
from launcher.urls import READY_PATH, generate_url, open_direct

#: One replica's published endpoint record (launcher/records.py, DEVELOPERS.md): address, ports and URLs.
Endpoint = EndpointRecord


class NotReady(RuntimeError):
    """The job has no published endpoint (yet)."""


def job_endpoints(job: str | JobRef) -> list[Endpoint]:
    """Every published replica endpoint of a job (an id, a job folder, or the JobRef already looked up), by
    replica number."""
    ref = job if isinstance(job, JobRef) else find_job(job)
    return read_endpoints(ref.paths)


class Client:
    """Generate text through the ensemble (or BLS) of one replica."""

    def __init__(self, endpoint: Endpoint, model: str = "ensemble", timeout_s: float = 300.0):
        self.endpoint = endpoint
        self.model = model
        self.timeout_s = timeout_s

    @classmethod
    def from_job(cls, job: str | JobRef, replica: int = 0, model: str = "ensemble") -> Client:
        endpoints = job_endpoints(job)
        chosen = [e for e in endpoints if e.replica == replica]
        if not chosen:
            name = job.job_id if isinstance(job, JobRef) else job
            raise NotReady(f"job {name} has no ready endpoint for replica {replica}; see `hpc-serve status {name}`")
        return cls(chosen[0], model=model)

    def ready(self) -> bool:
        try:
            with open_direct(self.endpoint.http_url + READY_PATH, timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def generate(self, prompt: str, max_tokens: int = 64, **params: Any) -> str:
        """One completion via Triton's HTTP generate extension (`POST /v2/models/<model>/generate`), sent to the
        node directly (not through `$http_proxy`: launcher/urls.py)."""
        body = {"text_input": prompt, "max_tokens": max_tokens, **params}
        request = urllib.request.Request(
            generate_url(self.endpoint.http_url, self.model),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with open_direct(request, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())["text_output"]
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{self.model}: HTTP {exc.code}: {exc.read().decode(errors='replace')}") from None

    def stream(self, prompt: str, max_tokens: int = 64, **params: Any) -> Iterator[str]:
        """Tokens as they are generated, over gRPC streaming (the model must be decoupled)."""
        import numpy as np
        import tritonclient.grpc as grpcclient

        inputs = {
            "text_input": np.array([[prompt]], dtype=object),
            "max_tokens": np.array([[max_tokens]], dtype=np.int32),
            "stream": np.array([[True]], dtype=bool),
        }
        for key, value in params.items():
            dtype = {bool: bool, int: np.int32, float: np.float32}.get(type(value), object)
            inputs[key] = np.array([[value]], dtype=dtype)
        tensors = []
        for name, array in inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), _triton_dtype(array))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        results: queue.Queue = queue.Queue()
        # a server that splits a multi-byte character across responses (upstream's ensemble does) must not
        # print U+FFFD pieces: incomplete bytes wait for the next response
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        client = grpcclient.InferenceServerClient(self.endpoint.grpc_url)
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        try:
            # a unique id in hpc-serve's form lets the ensemble's postprocessing hold split characters back
            request_id = f"{STREAM_REQUEST_PREFIX}{uuid.uuid4()}"
            client.async_stream_infer(self.model, tensors, request_id=request_id, enable_empty_final_response=True)
            while True:
                result, error = results.get(timeout=self.timeout_s)
                if error is not None:
                    raise RuntimeError(f"{self.model}: {error}")
                final = result.get_response().parameters.get("triton_final_response")
                text = result.as_numpy("text_output")
                if text is not None and text.size:
                    piece = utf8.decode(b"".join(t if isinstance(t, bytes) else str(t).encode() for t in text.ravel()))
                    if piece:
                        yield piece
                if final is not None and final.bool_param:
                    tail = utf8.decode(b"", final=True)
                    if tail:
                        yield tail
                    return
        finally:
            client.stop_stream()
            client.close()


def _triton_dtype(array) -> str:
    import numpy as np

    if array.dtype == object:
        return "BYTES"
    return {
        np.dtype(bool): "BOOL",
        np.dtype(np.int32): "INT32",
        np.dtype(np.float32): "FP32",
        np.dtype(np.uint64): "UINT64",
    }[array.dtype]
