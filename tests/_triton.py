"""Test-only helpers: run the tritonserver shipped in the nvidia-pytriton wheel (CPU build, python backend).

The launcher has its own product version of "find tritonserver"; this one exists so backend tests do
not depend on launcher/. What the wheel needs (found the hard way):

* the binary is `pytriton/tritonserver/bin/tritonserver`; its shared libraries are in the wheel's
  `nvidia_pytriton.libs/` (LD_LIBRARY_PATH);
* the python backend directory in the wheel has no stub; the per-Python-version stub lives in
  `pytriton/tritonserver/python_backend_stubs/<X.Y>/` and must be copied *into* a copy of
  `backends/python/`, passed as `--backend-directory=<copy's parent>`;
* the stub links `libpython3.X.so.1.0` and embeds that interpreter: point LD_LIBRARY_PATH at this
  interpreter's libdir first and set PYTHONHOME to `sys.base_prefix`, else the stub picks up the
  distribution's libpython and its site-packages (no numpy/tokenizers there);
* the stub imports our models through PYTHONPATH (the source tree).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytriton_dir() -> Path | None:
    """The installed `pytriton` package directory, or None."""
    try:
        import pytriton  # noqa: PLC0415
    except ImportError:
        return None
    return Path(pytriton.__file__).parent


def find_tritonserver() -> tuple[Path, Path] | None:
    """(binary, libs dir) of the wheel's tritonserver, or None when not installed."""
    pkg = pytriton_dir()
    if pkg is None:
        return None
    binary = pkg / "tritonserver" / "bin" / "tritonserver"
    libs = pkg.parent / "nvidia_pytriton.libs"
    if not binary.is_file() or not libs.is_dir():
        return None
    return binary, libs


def build_backends_dir(dest: Path) -> Path:
    """Copy the wheel's python backend and this interpreter's stub into dest/python; return dest."""
    pkg = pytriton_dir()
    assert pkg is not None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = pkg / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise FileNotFoundError(f"no python backend stub for Python {version} in {stub.parent.parent}")
    python_dir = dest / "python"
    shutil.copytree(
        pkg / "tritonserver" / "backends" / "python",
        python_dir,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy2(stub, python_dir / "triton_python_backend_stub")
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post_json(
    host: str, port: int, path: str, body: dict | bytes, timeout: float = 60, headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    """POST a JSON body (or raw bytes, to send malformed ones) → (HTTP status, parsed reply or {"raw": text});
    `headers` adds to Content-Type (e.g. a job's access token, hpc.serving.auth.http_headers)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw)
    except json.JSONDecodeError:
        return resp.status, {"raw": raw.decode(errors="replace")}


@dataclass
class Server:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path

    def post(self, path: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
        return post_json("127.0.0.1", self.http_port, path, body, timeout)

    def stream(self, path: str, body: dict, timeout: float = 60) -> list[dict]:
        """POST to a `generate_stream` endpoint and return the server-sent events' JSON payloads."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read().decode()
        finally:
            conn.close()
        events = [json.loads(line[len("data:") :]) for line in data.splitlines() if line.startswith("data:")]
        if resp.status != 200 or not events:
            raise AssertionError(f"{path}: HTTP {resp.status}: {data[:2000]}")
        return events

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def _ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/v2/health/ready")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


@contextlib.contextmanager
def tritonserver(
    model_repository: Path,
    workdir: Path,
    timeout: float = 180,
    extra_args: tuple[str, ...] = (),
    source_root: Path = REPO_ROOT,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Start tritonserver on free ports, wait for ready, yield, and always stop it (its whole process
    group: the python stubs are its children, so no orphans survive a failed test). `source_root` goes first
    on PYTHONPATH, as the launcher puts the deployment's shipped copy there; `env` adds to its environment."""
    found = find_tritonserver()
    assert found is not None, "tritonserver not installed (nvidia-pytriton)"
    binary, libs = found
    backends = build_backends_dir(workdir / "backends")
    ports = [free_port() for _ in range(3)]
    extra, env = env or {}, dict(os.environ)
    env.update(extra)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
    env["PYTHONHOME"] = sys.base_prefix
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(source_root), env.get("PYTHONPATH", "")) if p)
    cmd = [
        str(binary),
        f"--model-repository={model_repository}",
        f"--backend-directory={backends}",
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefixT_",
        f"--http-port={ports[0]}",
        f"--grpc-port={ports[1]}",
        f"--metrics-port={ports[2]}",
        "--log-verbose=0",
        *extra_args,
    ]
    log = workdir / "tritonserver.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True)
    server = Server(proc, *ports, log)
    try:
        deadline = time.monotonic() + timeout
        while not _ready(ports[0]):
            if proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {proc.returncode}:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"tritonserver not ready after {timeout}s:\n{server.log_tail()}")
            time.sleep(0.5)
        yield server
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM then SIGKILL the process group this helper created (by its id, never by name)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stubs left behind in the group
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
