"""Write the llmapi workflow's model repository: TensorRT-LLM's one python model `tensorrt_llm`, laid out as upstream
lays out `triton_backend/all_models/llmapi` (docs/decisions.md "The llmapi model as upstream ships it"):

    tensorrt_llm/config.pbtxt     backend/templates/llmapi/tensorrt_llm/config.pbtxt, decoupled as model.yaml says;
                                  hpc-serve's model declares its own inputs too (llmapi_io.OWN_INPUTS)
    tensorrt_llm/1/model.yaml     the LLM API arguments + `triton_config` (render builds the dict)
    tensorrt_llm/1/model.py       hpc-serve's model (the default, either backend): a shim importing
                                  backend.models.llmapi; the image's own model.py and helpers.py instead are copied
                                  here at job start (the launcher)

The repository carries the same marker as the engine workflow's, so render may replace one with the other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from backend.repository import MARKER_FILE, shim, write_repository_files
from launcher.contracts.llmapi import LLMAPI, MODEL_YAML, OWN_MODEL
from launcher.contracts.model_names import TENSORRT_LLM

#: the config.pbtxt every llmapi repository gets (upstream's, plus `decoupled: true`)
TEMPLATE = Path(__file__).parent / "templates" / LLMAPI / TENSORRT_LLM / "config.pbtxt"
#: what hpc-serve's `1/model.py` shim re-exports `TritonPythonModel` from
LLMAPI_MODULE = "backend.models.llmapi"
#: `model_files`: OWN_MODEL writes hpc-serve's model; None leaves `1/` to the launcher's copy of the image's files
#: model.yaml's section for the Triton model itself (upstream's name); everything else is an LLM API argument
TRITON_CONFIG = "triton_config"
#: the template's transaction policy line (rendered false when model.yaml says so)
DECOUPLED_LINE = "  decoupled: true\n"


#: the template's first output line: hpc-serve's model's own output goes after it
FIRST_OUTPUT_LINE = '  { name: "text_output" data_type: TYPE_STRING dims: [-1] },\n'
#: the template's last input line: hpc-serve's model's own inputs go before it
LAST_INPUT_LINE = '  { name: "stop" data_type: TYPE_BOOL dims: [ 1 ] optional: true }\n'


def config_text(decoupled: bool = True, own_inputs: bool = False) -> str:
    """The `tensorrt_llm/config.pbtxt` text; `decoupled` is model.yaml's `triton_config.decoupled`, written into
    the file because tritonserver runs with --disable-auto-complete-config (which ignores model.yaml);
    `own_inputs`: declare hpc-serve's model's inputs beyond upstream's (the image's model would ignore them)."""
    from backend.models.llmapi_io import LOGPROBS_OUTPUT, OWN_INPUTS
    from launcher.contracts.llmapi import KV_EVENTS_OUTPUT, KV_EVENTS_SINCE

    text = TEMPLATE.read_text(encoding="utf-8")
    if own_inputs:
        kinds = [*((name, kind) for name, (kind, _) in OWN_INPUTS.items()), (KV_EVENTS_SINCE, "TYPE_INT64")]
        lines = "".join(
            f'  {{ name: "{name}" data_type: {kind} dims: [ 1 ] optional: true }},\n' for name, kind in kinds
        )
        text = text.replace(LAST_INPUT_LINE, "  ## hpc-serve's model only ##\n" + lines + LAST_INPUT_LINE, 1)
        output = (
            f'  {{ name: "{KV_EVENTS_OUTPUT}" data_type: TYPE_STRING dims: [ -1 ] }},\n'
            f'  {{ name: "{LOGPROBS_OUTPUT}" data_type: TYPE_FP32 dims: [ -1 ] }},\n'
        )
        text = text.replace(FIRST_OUTPUT_LINE, FIRST_OUTPUT_LINE + output, 1)
    return text if decoupled else text.replace(DECOUPLED_LINE, DECOUPLED_LINE.replace("true", "false"), 1)


def with_triton_config(model_yaml: Mapping[str, Any]) -> dict[str, Any]:
    """`model_yaml` with a complete `triton_config`: decoupled (true unless it says false: streaming needs it;
    unary gRPC/HTTP `infer` and HTTP `generate` need false, as in upstream's default model.yaml) and
    max_batch_size 0 (no Triton batching: the engine batches; anything else is refused with the fix)."""
    out = dict(model_yaml)
    triton = dict(out.get(TRITON_CONFIG) or {})
    decoupled = triton.get("decoupled", True)
    if not isinstance(decoupled, bool):
        raise ValueError(f"{MODEL_YAML}: {TRITON_CONFIG}.decoupled must be true or false, got {decoupled!r}")
    if int(triton.get("max_batch_size", 0)) != 0:
        raise ValueError(
            f"{MODEL_YAML}: {TRITON_CONFIG}.max_batch_size must be 0 (the engine batches; config.pbtxt has no "
            "max_batch_size); set the LLM API argument max_batch_size instead"
        )
    triton.update(decoupled=decoupled, max_batch_size=0)
    out[TRITON_CONFIG] = triton
    return out


def render_llmapi_repository(
    model_yaml: Mapping[str, Any], model_files: Literal["hpc-serve"] | None = OWN_MODEL, header: str = ""
) -> dict[str, str]:
    """Relative path → text of the whole repository (no disk access); `header`: comment lines model.yaml opens with."""
    import yaml  # a dependency of hpc-serve; imported here so that the engine workflow's path never needs it

    if model_files not in (OWN_MODEL, None):
        raise ValueError(f"model_files must be {OWN_MODEL!r} (hpc-serve's model) or None, got {model_files!r}")
    version = f"{TENSORRT_LLM}/1/"
    complete = with_triton_config(model_yaml)
    files = {
        f"{TENSORRT_LLM}/config.pbtxt": config_text(complete[TRITON_CONFIG]["decoupled"], model_files == OWN_MODEL),
        version: "",
        version + MODEL_YAML: header + yaml.safe_dump(complete, sort_keys=False),
    }
    if model_files == OWN_MODEL:
        files[version + "model.py"] = shim(TENSORRT_LLM, LLMAPI_MODULE)
    files[MARKER_FILE] = json.dumps({"workflow": LLMAPI, "model_files": model_files}, indent=2, sort_keys=True) + "\n"
    return files


def write_llmapi_repository(
    out_dir: Path, model_yaml: Mapping[str, Any], model_files: Literal["hpc-serve"] | None = OWN_MODEL, header: str = ""
) -> None:
    """Write the llmapi repository to `out_dir`, replacing a previous hpc-serve repository atomically
    (backend.repository.write_repository_files: never someone's unrelated folder)."""
    write_repository_files(Path(out_dir), render_llmapi_repository(model_yaml, model_files, header))
