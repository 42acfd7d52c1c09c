"""Which engine the stand-in's leader and worker nodes run (backend/standin/tensorrt_llm/llmapi/mgmn_*_node.py):
one entry per backend that stands in for TensorRT-LLM, keyed by its name (launcher/contracts/workflows.py
RANK_BACKENDS), chosen by `HPC_SERVE_STANDIN_ENGINE` (launch.json's env; unset: the CPU engine). A module of its
own, above both engines, since the simulated engine builds on the CPU engine's node and request types.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from backend.cpu_engine.llmapi.kind import CPU, EngineKind
from backend.sim_engine.node import SIM
from launcher.contracts.llmapi import ENGINE_VAR

ENGINE_KINDS: dict[str, EngineKind] = {kind.name: kind for kind in (CPU, SIM)}


def engine_kind(environ: Mapping[str, str] | None = None) -> EngineKind:
    """The engine `HPC_SERVE_STANDIN_ENGINE` names; SystemExit naming the choices for another name."""
    name = (os.environ if environ is None else environ).get(ENGINE_VAR) or CPU.name
    kind = ENGINE_KINDS.get(name)
    if kind is None:
        raise SystemExit(f"{ENGINE_VAR}={name!r}: the stand-in runs one of {', '.join(ENGINE_KINDS)}")
    return kind
