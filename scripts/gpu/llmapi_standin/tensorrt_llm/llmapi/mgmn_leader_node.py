"""Stand-in of `python -m tensorrt_llm.llmapi.mgmn_leader_node` (rank 0's engine process beside tritonserver).

Upstream (NVIDIA/TensorRT-LLM@1033ea16, and 1.2.1's mpi_session): a `RemoteMpiCommSessionServer` bound to
$TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR, messages signed with the hex key $TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY; the LLM
inside tritonserver submits its work there, and the leader runs it as MPI rank 0 (a GPU worker itself); a `None`
message ends it. This stand-in keeps what GPU visibility depends on: it opens its device as the PyTorch worker does
(standin.open_gpu), holds memory there, and serves the same address with the same key (a
multiprocessing.connection Listener, HMAC-authenticated, in place of ZMQ) until the model sends None.
The variable names are TensorRT-LLM's (tensorrt_llm/executor/utils.py), typed here on purpose, not imported from
hpc-serve: the proof checks that hpc-serve's launch sets the names TensorRT-LLM reads.
"""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection, Listener
from typing import Any

from tensorrt_llm.llmapi import standin

IPC_ADDR_VAR = "TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR"
IPC_HMAC_KEY_VAR = "TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY"


def tcp_address(addr: str) -> tuple[str, int]:
    """``tcp://127.0.0.1:PORT`` → ("127.0.0.1", PORT)."""
    if not addr.startswith("tcp://"):
        raise ValueError(f"{IPC_ADDR_VAR}={addr!r}: the stand-in serves tcp:// addresses only")
    host, _, port = addr[len("tcp://") :].rpartition(":")
    return host, int(port)


def answer(info: dict[str, Any], block: Any, message: Any) -> Any:
    """One request of the model: ("hello", its report) → this node's report; ("generate", prompt, n) → text
    computed on this node's GPU."""
    kind = message[0]
    if kind == "hello":
        info["model_pid"] = message[1].get("pid")
        return info
    if kind == "generate":
        _, prompt, max_tokens = message
        where = f"cuda:{info.get('device_index')}"
        if block is not None:  # one reduction on the held memory: the answer was computed on this GPU
            where += f" sum={int(block[:1024].sum().item())}"
        words = [f"rank{info['global_rank']}@{where}"] * max(1, int(max_tokens))
        return " ".join(words)[: 64 * max(1, int(max_tokens))]
    raise ValueError(f"unknown message {kind!r}")


def serve(listener: Listener, info: dict[str, Any], block: Any) -> None:
    """Answer the model's connections until it sends None (its finalize)."""
    while True:
        try:
            conn: Connection = listener.accept()
        except Exception as exc:  # a client with the wrong key: refused, counted, the server serves on
            info.setdefault("refused", []).append(repr(exc))
            continue
        with conn:
            while True:
                try:
                    message = conn.recv()
                except EOFError:
                    break  # the model's process went away; it may connect again
                if message is None:
                    conn.send("bye")
                    return
                try:
                    conn.send(answer(info, block, message))
                except Exception as exc:  # the model gets the error text instead of a hang
                    conn.send({"error": repr(exc)})


def main() -> int:
    info, block = standin.open_gpu(standin.LEADER)
    path = standin.report_path(standin.LEADER, info["global_rank"])
    addr, key = os.environ.get(IPC_ADDR_VAR), os.environ.get(IPC_HMAC_KEY_VAR)
    info["ipc_address"] = addr
    if not addr or not key:
        info["error"] = f"{IPC_ADDR_VAR} or {IPC_HMAC_KEY_VAR} not set"
        standin.write_report(path, info)
        return 2
    with Listener(tcp_address(addr), authkey=bytes.fromhex(key)) as listener:
        standin.write_report(path, info)
        print(f"[standin] leader node rank {info['global_rank']}: {info.get('device_index')} on {addr}", flush=True)
        serve(listener, info, block)
    info["stopped_by_model"] = True
    standin.write_report(path, info)
    standin.leader_done_path().touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
