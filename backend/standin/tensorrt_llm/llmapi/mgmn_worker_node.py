"""`python -m tensorrt_llm.llmapi.mgmn_worker_node`: an MPI rank > 0 of a replica, serving the leader node's
engine steps until it is released; here the stand-in's worker node (backend/cpu_engine/llmapi/worker_node.py)
for the engine backend/engines.py picks (the CPU engine's or the simulated one's part)."""

from __future__ import annotations

import sys

from backend.cpu_engine.llmapi import worker_node
from backend.engines import engine_kind

if __name__ == "__main__":
    sys.exit(worker_node.main([], kind=engine_kind()))
