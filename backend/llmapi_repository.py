"""Write the llmapi workflow's model repository, laid out as upstream's `triton_backend/all_models/llmapi`:

    tensorrt_llm/config.pbtxt        upstream's inputs and outputs, decoupled set in the file
    tensorrt_llm/1/model.yaml        the LLM API arguments (hpc/render/llmapi.py writes the text)
    tensorrt_llm/1/model.py          CPU backend only: a shim to hpc-serve's own llmapi model

For backend tensorrtllm, model.py and helpers.py are the image's own (launcher/contracts/llmapi.py MODEL_FILES),
copied into `tensorrt_llm/1/` by the launcher when a replica starts, so they always match its TensorRT-LLM.
The repository is written whole and swapped in (backend/repository.py `write_repository_files`). Standard library
only: the `hpc` side calls this at render time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from backend.repository import MARKER_FILE, shim, write_repository_files
from launcher.contracts import model_names
from launcher.contracts.llmapi import LLMAPI, MODEL_YAML

#: upstream's config.pbtxt of the llmapi model, decoupled: true
TEMPLATE = Path(__file__).parent / "templates" / "llmapi" / model_names.TENSORRT_LLM / "config.pbtxt"
#: the CPU backend's python model (TritonPythonModel with upstream's llmapi contract)
CPU_LLMAPI_MODULE = "backend.models.llmapi"

_DECOUPLED = re.compile(r"(model_transaction_policy\s*\{\s*decoupled:\s*)(true|false)", re.IGNORECASE)


def config_pbtxt(decoupled: bool) -> str:
    """The template with `decoupled` written into its model_transaction_policy."""
    text = TEMPLATE.read_text(encoding="utf-8")
    if not _DECOUPLED.search(text):
        raise ValueError(f"{TEMPLATE} has no model_transaction_policy {{ decoupled: ... }} to set")
    return _DECOUPLED.sub(lambda m: m.group(1) + ("true" if decoupled else "false"), text, count=1)


def llmapi_files(model_yaml: str, *, decoupled: bool, cpu: bool) -> dict[str, str]:
    """Relative path → text of the repository (no disk access). `cpu`: add the shim to hpc-serve's model."""
    name = model_names.TENSORRT_LLM
    files = {f"{name}/config.pbtxt": config_pbtxt(decoupled), f"{name}/1/{MODEL_YAML}": model_yaml}
    if cpu:
        files[f"{name}/1/model.py"] = shim(name, CPU_LLMAPI_MODULE)
    marker = {"workflow": LLMAPI, "backend": "cpu" if cpu else "tensorrtllm", "decoupled": decoupled}
    files[MARKER_FILE] = json.dumps(marker, indent=2, sort_keys=True) + "\n"
    return files


def write_llmapi_repository(out_dir: Path, model_yaml: str, *, decoupled: bool = True, cpu: bool = False) -> None:
    """Write the llmapi repository to `out_dir`, replacing a previous hpc-serve repository whole. `model_yaml`:
    model.yaml's text; `decoupled`: the same value as its triton_config.decoupled; `cpu`: the CPU backend."""
    write_repository_files(out_dir, llmapi_files(model_yaml, decoupled=decoupled, cpu=cpu))
