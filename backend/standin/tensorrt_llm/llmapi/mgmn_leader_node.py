"""`python -m tensorrt_llm.llmapi.mgmn_leader_node`: the MPI rank 0 of a replica outside tritonserver, the session
server the LLM inside tritonserver reaches at TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR; here the stand-in's leader node
(backend/cpu_engine/llmapi/leader_node.py) running the engine backend/engines.py picks (CPU or simulated).

Its lifetime follows the release the stand-in behaves as (launcher/contracts/trtllm_versions.py STOP_ACTION_SINCE):
- from that release on, `--action start` (the default) serves until `--action stop` (run by the launch once
  tritonserver has exited) or a signal; the LLM's shutdown leaves it running;
- before it, the module takes no arguments (whatever is given, it starts a server, as upstream's would) and ends
  when the LLM inside tritonserver shuts down or its connection breaks.
"""

from __future__ import annotations

import argparse
import sys

from backend.cpu_engine.llmapi import leader_node
from backend.cpu_engine.llmapi import protocol as p
from backend.engines import engine_kind
from launcher.contracts.trtllm_versions import client_shutdown_stops_leader, has_stop_action

from ..version import __version__


def stop() -> int:
    """`--action stop`: tell the leader node at the IPC address to end; exit 0 once it was told."""
    try:
        channel = p.connect(p.endpoint(), timeout_s=0)
    except (p.ProtocolError, OSError) as e:
        print(f"mgmn_leader_node --action stop: no leader node to stop: {e}", file=sys.stderr)
        return 1
    try:
        channel.send(p.Shutdown())
    finally:
        channel.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    if has_stop_action(__version__):
        parser = argparse.ArgumentParser(prog="python -m tensorrt_llm.llmapi.mgmn_leader_node")
        parser.add_argument("--action", choices=["start", "stop"], default="start")
        args = parser.parse_args(argv)
        if args.action == "stop":
            return stop()
    return leader_node.main([], stop_on_disconnect=client_shutdown_stops_leader(__version__), kind=engine_kind())


if __name__ == "__main__":
    sys.exit(main())
