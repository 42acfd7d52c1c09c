"""tritonserver 2.51's python backend (r24.10) frees the shared memory a stub is about to read when the stub has
not shown itself healthy for about a second: a one-model toy (`echo`, a BYTES input), none of hpc-serve's models.
Why it is kept: it is docs/decisions.md "The start crash" (a `preprocessing` stub's SIGABRT in
`deserialize_bytes_tensor`, and tritonserver's own `boost::interprocess::lock_exception` while loading), shown to be the
python backend's, not our models' or our /dev/shm sweeps' (and what to send upstream).

The mechanism (python_backend r24.10): while tritonserver waits for a stub (`StubLauncher::ReceiveMessageFromStub`,
stub_launcher.cc, for the model's initialize and for every execute) it sets the stub's health flag false and waits
1 s; the stub's health thread sets it true every 300 ms (pb_stub.cc `UpdateHealth`). A stub that does not run for
about a second (CPU starvation, a host stall; here: held in gdb once it has taken the request) is declared "not
healthy" but not killed: the server fails the request and frees its shared-memory objects (python_be.cc
`ProcessRequests` returns, its `InferRequest`s die) while the stub goes on and loads them. What it then reads is
whatever the allocator left there: a SIGSEGV, or a garbage tensor whose pybind11 error escapes
(`Stub::LoadRequestsFromSharedMemory` runs outside `ProcessRequests`' try, pb_stub.cc) as `terminate called after
throwing an instance of 'pybind11::error_already_set'`, SIGABRT. The same at initialize: the stub faults in
`SharedMemoryManager::Load` holding the region's robust mutex (PbString::LoadFromSharedMemory, stub offset 0x9ce33,
"trap stack segment") and tritonserver's next lock of it gets EOWNERDEAD: boost's lock_exception, SIGABRT.

Seen (2026-12-02, the nvidia-pytriton 0.7.0 wheel's tritonserver 2.51, CPU, 3 runs of 3): the held request is
answered "Stub process 'echo_0' is not healthy."; the stub, let go, lives on broken, and the next request aborts
tritonserver with `terminate called after throwing an instance of 'boost::interprocess::lock_exception'` (its
stub faulted holding the region's mutex). Through hpc-serve's ensemble, held the same way, the preprocessing stub
died the issue's way 3 of 3 (SIGABRT, error_already_set while deserialising its input); held at Stub::Initialize,
tritonserver aborted with lock_exception after the stub's fault at 0x9ce33, as 2 of 132 unprovoked hpc-serve starts
under two busy loops on 2 cores did (both within 4 s: one stall of the whole machine).

Run: `python scripts/repro_stub_health_race.py [--hold-s 2.5]` (needs gdb and the test dependencies:
nvidia-pytriton).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._triton import tritonserver  # noqa: E402 - the wheel's tritonserver, as the tests start it

ECHO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
"""
CONFIG = """name: "echo" backend: "python" max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ] output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]"""
#: where gdb holds the stub: once it has taken the request's message, before it loads the request's tensors
BREAKPOINT = "triton::backend::python::InferRequest::LoadFromSharedMemory"
SHOWN = re.compile(r"terminate called|what\(\)|not healthy|lock_exception|Non-graceful")


def write_repository(root: Path) -> Path:
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "config.pbtxt").write_text(textwrap.dedent(CONFIG))
    (root / "echo" / "1" / "model.py").write_text(ECHO)
    return root


def stub_of(server_pid: int) -> int | None:
    """The pid of the echo model's stub, a child of tritonserver."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == server_pid and b"triton_python_backend_stub" in cmd and b" echo_0 " in cmd.replace(b"\0", b" "):
            return int(pid)
    return None


def hold(pid: int, breakpoint: str, hold_s: float) -> subprocess.Popen:
    """gdb on the stub: stop at `breakpoint`, keep the stub stopped `hold_s` seconds, let it go."""
    argv = ["gdb", "-p", str(pid), "-batch", "-ex", "set pagination off", "-ex", f"break {breakpoint}"]
    argv += ["-ex", "continue", "-ex", "bt 2", "-ex", f"shell sleep {hold_s}", "-ex", "detach"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def gdb_said(gdb: subprocess.Popen) -> str:
    out = gdb.communicate(timeout=120)[0]
    return "\n".join(line for line in out.splitlines() if line.startswith("#"))


def at_execute(repo: Path, workdir: Path, hold_s: float) -> None:
    with tritonserver(repo, workdir) as server:
        stub = stub_of(server.process.pid)
        assert stub is not None, "no echo stub"
        gdb = hold(stub, BREAKPOINT, hold_s)
        time.sleep(5)  # attached, the breakpoint set, the stub running again
        body = {"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1], "data": ["Hello"]}]}
        status, answer = server.post("/v2/models/echo/infer", body)
        print(f"request: HTTP {status} {answer}\nstub held at:\n{gdb_said(gdb)}")
        deadline = time.monotonic() + 10
        while Path(f"/proc/{stub}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        print(f"the stub {'still runs' if Path(f'/proc/{stub}').exists() else 'has died (dmesg says how)'}")
        try:
            status, answer = server.post("/v2/models/echo/infer", body)
            print(f"the next request: HTTP {status} {answer}")
        except OSError as exc:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.process.wait(10)
            print(f"the next request: {exc!r}; tritonserver's exit status: {server.process.poll()}")
        print("tritonserver's log:")
        print("\n".join(line for line in server.log.read_text(errors="replace").splitlines() if SHOWN.search(line)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold-s", type=float, default=2.5, help="how long (the server gives up after ~1 s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo")
        at_execute(repo, Path(tmp), args.hold_s)


if __name__ == "__main__":
    main()
