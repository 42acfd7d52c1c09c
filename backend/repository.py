"""Write the Triton model repository (ensemble, preprocessing, tensorrt_llm, postprocessing, tensorrt_llm_bls).

This is upstream `tools/fill_template.py` done right (see ../shared/reference/tensorrtllm_backend.md §2):

* keys are the upstream fill keys (`KNOWN_PARAMETERS`); an unknown key is a ValueError with a did-you-mean,
  not a silent no-op;
* values are typed: bools render `true`/`false`, numbers are checked, strings are escaped for pbtxt so a
  quote, backslash or newline cannot break the file, and nothing needs `\\,` escaping;
* structural fields (max_batch_size, decoupled, dtypes, instance counts, queue settings) are required
  (`required_parameters()`), optional `parameters {}` entries that were not given are omitted — the output
  never contains `${`;
* the repository is built in a temporary sibling directory and renamed into place.

The tensor tables live in `backend/templates/tables.py`; this module only renders them.
Only the standard library is imported (the `hpc` side calls this at render time).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from backend.templates.tables import MODELS, ModelTable, Tensor

Backend = Literal["tensorrtllm", "cpu"]
BACKENDS: tuple[str, ...] = ("tensorrtllm", "cpu")

# Which python module each python model's `1/model.py` shim re-exports `TritonPythonModel` from.
PYTHON_MODEL_MODULES: dict[str, str] = {
    "preprocessing": "backend.models.preprocessing",
    "postprocessing": "backend.models.postprocessing",
    "tensorrt_llm_bls": "backend.models.bls",
}
CPU_ENGINE_MODULE = "backend.models.tensorrt_llm_cpu"
MARKER_FILE = ".hpc-serve-repository.json"

_DTYPES = frozenset(
    {
        "TYPE_BOOL",
        "TYPE_UINT8",
        "TYPE_UINT16",
        "TYPE_UINT32",
        "TYPE_UINT64",
        "TYPE_INT8",
        "TYPE_INT16",
        "TYPE_INT32",
        "TYPE_INT64",
        "TYPE_FP16",
        "TYPE_FP32",
        "TYPE_FP64",
        "TYPE_STRING",
        "TYPE_BF16",
    }
)
_TRUE = frozenset({"true", "1", "t", "y", "yes", "on"})
_FALSE = frozenset({"false", "0", "f", "n", "no", "off"})

# ------------------------------------------------------------------------------------------------ key types
# kind: bool | int | uint (>= 0) | pos (>= 1) | frac (float in [0, 1]) | float | str | path | ids | intlist |
# dtype | one of a tuple of choices. Every upstream fill key of the five templates is here (plus tp_size,
# pp_size for the CPU engine; `triton_backend` is derived from the `backend` argument).
_KINDS: dict[str, object] = {
    # structural
    "triton_max_batch_size": "pos",
    "decoupled_mode": "bool",
    "max_queue_delay_microseconds": "uint",
    "max_queue_size": "uint",
    "logits_datatype": "dtype",
    "encoder_input_features_data_type": "dtype",
    "preprocessing_instance_count": "pos",
    "postprocessing_instance_count": "pos",
    "bls_instance_count": "pos",
    "triton_backend": ("tensorrtllm", "python"),
    # tensorrt_llm parameters
    "max_beam_width": "pos",
    "batching_strategy": ("V1", "inflight_batching", "inflight_fused_batching"),
    "engine_dir": "path",
    "encoder_engine_dir": "path",
    "max_tokens_in_paged_kv_cache": "pos",
    "max_attention_window_size": "intlist",
    "sink_token_length": "uint",
    "batch_scheduler_policy": ("max_utilization", "guaranteed_no_evict", "static_batch"),
    "kv_cache_free_gpu_mem_fraction": "frac",
    "cross_kv_cache_fraction": "frac",
    "kv_cache_host_memory_bytes": "uint",
    "kv_cache_onboard_blocks": "bool",
    "exclude_input_in_output": "bool",
    "cancellation_check_period_ms": "uint",
    "stats_check_period_ms": "uint",
    "iter_stats_max_iterations": "uint",
    "request_stats_max_iterations": "uint",
    "enable_kv_cache_reuse": "bool",
    "normalize_log_probs": "bool",
    "enable_chunked_context": "bool",
    "gpu_device_ids": "ids",
    "participant_ids": "ids",
    "num_nodes": "pos",
    "lora_cache_optimal_adapter_size": "pos",
    "lora_cache_max_adapter_size": "pos",
    "lora_cache_gpu_memory_fraction": "frac",
    "lora_cache_host_memory_bytes": "uint",
    "lora_prefetch_dir": "path",
    "decoding_mode": (
        "top_k",
        "top_p",
        "top_k_top_p",
        "beam_search",
        "medusa",
        "redrafter",
        "lookahead",
        "eagle",
        "explicit_draft_tokens",
    ),
    "lookahead_window_size": "pos",
    "lookahead_ngram_size": "pos",
    "lookahead_verification_set_size": "pos",
    "medusa_choices": "str",
    "eagle_choices": "str",
    "gpu_weights_percent": "frac",
    "enable_context_fmha_fp32_acc": "bool",
    "multi_block_mode": "bool",
    "cuda_graph_mode": "bool",
    "cuda_graph_cache_size": "uint",
    "speculative_decoding_fast_logits": "bool",
    "tokenizer_dir": "path",
    "guided_decoding_backend": "str",
    "xgrammar_tokenizer_info_path": "path",
    "enable_trt_overlap": "bool",
    # CPU engine (hpc-serve additions): tensor / pipeline parallel size of the CPU engine's MPI world.
    "tp_size": "pos",
    "pp_size": "pos",
    # preprocessing / postprocessing
    "add_special_tokens": "bool",
    "multimodal_model_path": "path",
    "max_num_images": "pos",
    "skip_special_tokens": "bool",
    # BLS
    "accumulate_tokens": "bool",
    "tensorrt_llm_model_name": "str",
    "tensorrt_llm_draft_model_name": "str",
    "multimodal_encoders_name": "str",
}

#: Every accepted key: the upstream `fill_template.py` keys of the five templates, plus `tp_size` and
#: `pp_size` (hpc-serve: parallel sizes for the CPU engine; also written for TensorRT-LLM where the C++
#: backend ignores them).
KNOWN_PARAMETERS: frozenset[str] = frozenset(_KINDS)

#: Keys that must be given for every backend: the structural fields (without them the config does not
#: parse or means nothing) plus the tokenizer and model paths every deployment needs.
REQUIRED_PARAMETERS: frozenset[str] = frozenset(
    {
        "triton_max_batch_size",
        "decoupled_mode",
        "max_queue_delay_microseconds",
        "max_queue_size",
        "logits_datatype",
        "encoder_input_features_data_type",
        "preprocessing_instance_count",
        "postprocessing_instance_count",
        "bls_instance_count",
        "tokenizer_dir",
        "engine_dir",
    }
)

#: What upstream `fill_template.py` silently injects; pass `{**UPSTREAM_DEFAULTS, **params}` to opt in.
UPSTREAM_DEFAULTS: Mapping[str, object] = {"max_queue_size": 0, "max_queue_delay_microseconds": 0}

_TRITON_BACKEND = {"tensorrtllm": "tensorrtllm", "cpu": "python"}


def required_parameters(backend: Backend) -> frozenset[str]:
    """Required keys for `backend`; TensorRT-LLM also needs `batching_strategy` (the C++ backend rejects
    an unset `gpt_model_type`), the CPU engine has a single scheduler."""
    _check_backend(backend)
    return REQUIRED_PARAMETERS | ({"batching_strategy"} if backend == "tensorrtllm" else frozenset())


# ----------------------------------------------------------------------------------------------- validation
def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def _did_you_mean(key: str) -> str:
    close = difflib.get_close_matches(key, sorted(KNOWN_PARAMETERS), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _as_bool(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return "true" if value.strip().lower() in _TRUE else "false"
    raise ValueError(f"parameter {key!r} must be a bool, got {value!r}")


def _as_int(key: str, value: object, minimum: int | None) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"parameter {key!r} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"parameter {key!r} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"parameter {key!r} must be >= {minimum}, got {number}")
    return str(number)


def _as_float(key: str, value: object, unit: bool) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"parameter {key!r} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"parameter {key!r} must be a number, got {value!r}") from None
    if not math.isfinite(number) or (unit and not 0.0 <= number <= 1.0):
        raise ValueError(f"parameter {key!r} must be {'in [0, 1]' if unit else 'finite'}, got {value!r}")
    return repr(number)


def _as_ids(key: str, value: object) -> str:
    """`0,1` / `0,1;2,3` (upstream: `,` within an instance, `;` between instances). Lists are joined."""
    if isinstance(value, str):
        text = value.replace(" ", "")
        groups = text.split(";")
        if not all(g and all(p.isdigit() for p in g.split(",")) for g in groups):
            raise ValueError(f"parameter {key!r} must look like '0,1' or '0,1;2,3', got {value!r}")
        return text
    if isinstance(value, int) and not isinstance(value, bool):
        return _as_ids(key, str(value))
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (list, tuple)) for v in value):
            return _as_ids(key, ";".join(",".join(str(i) for i in g) for g in value))
        return _as_ids(key, ",".join(str(i) for i in value))
    raise ValueError(f"parameter {key!r} must be a string or list of ints, got {value!r}")


def _as_str(key: str, value: object, kind: object) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ValueError(f"parameter {key!r} must be a string, got {type(value).__name__} {value!r}")
    if "\x00" in value:
        raise ValueError(f"parameter {key!r} contains a NUL byte")
    if kind == "path" and not value:
        raise ValueError(f"parameter {key!r} must be a non-empty path")
    return value


def choices(key: str) -> tuple[str, ...]:
    """The allowed values of an enumerated parameter (the spec's `Literal`s are built from these)."""
    kind = _KINDS[key]
    if not isinstance(kind, tuple):
        raise KeyError(f"parameter {key!r} is not an enumeration")
    return kind


def normalize_parameter(key: str, value: object) -> str:
    """Validate `value` for `key` and return its canonical text (what ends up in the pbtxt); the one type
    check of a parameter, used by `validate` (hpc/spec/parameters.py) as well as by the repository writer."""
    kind = _KINDS[key]
    if isinstance(kind, tuple):
        if value not in kind:
            raise ValueError(f"parameter {key!r} must be one of {list(kind)}, got {value!r}")
        return str(value)
    if kind == "bool":
        return _as_bool(key, value)
    if kind in ("int", "uint", "pos"):
        return _as_int(key, value, {"int": None, "uint": 0, "pos": 1}[kind])
    if kind in ("frac", "float"):
        return _as_float(key, value, kind == "frac")
    if kind == "ids":
        return _as_ids(key, value)
    if kind == "intlist":
        items = value if isinstance(value, (list, tuple)) else [value]
        return ",".join(_as_int(key, v, 1) for v in items)
    if kind == "dtype":
        text = str(value).upper()
        text = text if text.startswith("TYPE_") else f"TYPE_{text}"
        if text not in _DTYPES:
            raise ValueError(f"parameter {key!r} must be a Triton dtype like TYPE_FP32, got {value!r}")
        return text
    return _as_str(key, value, kind)


def validate_parameters(backend: Backend, params: Mapping[str, object]) -> dict[str, str]:
    """Check keys and values; return key → canonical text for every given (non-None) key.

    `None` values count as not given (handy for optional spec fields). `triton_backend` may be given but
    must agree with `backend`.
    """
    _check_backend(backend)
    unknown = [k for k in params if k not in KNOWN_PARAMETERS]
    if unknown:
        key = sorted(unknown)[0]
        raise ValueError(
            f"unknown model repository parameter {key!r}{_did_you_mean(key)}"
            + (f"; also unknown: {sorted(unknown)[1:]}" if len(unknown) > 1 else "")
        )
    values = {k: normalize_parameter(k, v) for k, v in params.items() if v is not None}
    for key, text in values.items():
        if "${" in text:  # consumers treat `${...}` as "unset"; never write one
            raise ValueError(f"parameter {key!r} contains '${{', which reads as an unfilled template placeholder")
    expected = _TRITON_BACKEND[backend]
    if values.setdefault("triton_backend", expected) != expected:
        raise ValueError(
            f"parameter 'triton_backend'={values['triton_backend']!r} contradicts "
            f"backend={backend!r} (which means triton_backend {expected!r})"
        )
    missing = sorted(required_parameters(backend) - values.keys())
    if missing:
        raise ValueError(f"missing required model repository parameter(s): {', '.join(missing)}")
    return values


# ------------------------------------------------------------------------------------------------ rendering
def pbtxt_string(text: str) -> str:
    """Quote `text` as a protobuf text-format string literal (C escapes; non-ASCII as octal UTF-8 bytes)."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch in "\"'\\":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif byte < 0x20 or byte >= 0x7F:
            out.append(f"\\{byte:03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# A resolver maps a fill key to its rendered text, or None when the key was not given.
Resolver = Callable[[str], "str | None"]


def _dims(dims: tuple[int, ...]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]" if dims else "[ ]"


def _tensor_block(t: Tensor, dtype: Callable[[str], str]) -> str:
    lines = [f'    name: "{t.name}"', f"    data_type: {dtype(t.dtype)}", f"    dims: {_dims(t.dims)}"]
    if t.reshape is not None:
        lines.append(f"    reshape: {{ shape: {_dims(t.reshape)} }}")
    if t.optional:
        lines.append("    optional: true")
    if t.ragged:
        lines.append("    allow_ragged_batch: true")
    return "  {\n" + "\n".join(lines) + "\n  }"


def render_config(
    model: ModelTable, scalar: Resolver, string: Resolver, fixed_overrides: Mapping[str, str] | None = None
) -> str:
    """Render one config.pbtxt. `scalar(key)` gives an unquoted token (number, bool, enum), `string(key)`
    a quoted pbtxt string; both return None for keys that were not given (the entry is then omitted).
    `fixed_overrides` replaces upstream's hard-coded parameter values (Triton key → value).
    Required keys are validated before rendering, so a None for a structural key is a bug → KeyError."""

    def need(resolve: Resolver, key: str) -> str:
        text = resolve(key)
        if text is None:
            raise KeyError(f"{model.name}: structural key {key!r} has no value")
        return text

    def dtype(spec: str) -> str:
        return need(scalar, spec[1:]) if spec.startswith("$") else spec

    out = [f'name: "{model.name}"']
    if model.kind == "ensemble":
        out.append('platform: "ensemble"')
    elif model.kind == "python":
        out.append('backend: "python"')
    else:
        out.append(f"backend: {need(string, 'triton_backend')}")
    out.append(f"max_batch_size: {need(scalar, 'triton_max_batch_size')}")
    if model.decoupled_key:
        out.append(f"\nmodel_transaction_policy {{\n  decoupled: {need(scalar, model.decoupled_key)}\n}}")
    if model.dynamic_batching == "empty":
        out.append("\ndynamic_batching {\n}")
    elif model.dynamic_batching == "queue":
        mbs = need(scalar, "triton_max_batch_size")
        out.append(
            "\ndynamic_batching {\n"
            f"  preferred_batch_size: [ {mbs} ]\n"
            f"  max_queue_delay_microseconds: {need(scalar, 'max_queue_delay_microseconds')}\n"
            f"  default_queue_policy: {{ max_queue_size: {need(scalar, 'max_queue_size')} }}\n"
            "}"
        )
    out.append("\ninput [\n" + ",\n".join(_tensor_block(t, dtype) for t in model.inputs) + "\n]")
    out.append("output [\n" + ",\n".join(_tensor_block(t, dtype) for t in model.outputs) + "\n]")
    if model.steps:
        steps = []
        for step in model.steps:
            lines = [f'      model_name: "{step.model_name}"', "      model_version: -1"]
            lines += [f'      input_map {{ key: "{k}" value: "{v}" }}' for k, v in step.input_map]
            lines += [f'      output_map {{ key: "{k}" value: "{v}" }}' for k, v in step.output_map]
            steps.append("    {\n" + "\n".join(lines) + "\n    }")
        out.append("\nensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}")
    if model.instance_count is not None:
        count = (
            str(model.instance_count) if isinstance(model.instance_count, int) else need(scalar, model.instance_count)
        )
        out.append(f"\ninstance_group [\n  {{\n    count: {count}\n    kind: KIND_CPU\n  }}\n]")
    for param in model.parameters:
        fixed = (fixed_overrides or {}).get(param.key, param.fixed)
        value = pbtxt_string(fixed) if fixed is not None else string(param.source or "")
        if value is None:
            continue
        out.append(f'\nparameters: {{\n  key: "{param.key}"\n  value: {{\n    string_value: {value}\n  }}\n}}')
    return "\n".join(out) + "\n"


def _filled(values: Mapping[str, str]) -> tuple[Resolver, Resolver]:
    return (values.get, lambda k: pbtxt_string(values[k]) if k in values else None)


def _placeholders() -> tuple[Resolver, Resolver]:
    return (lambda k: "${" + k + "}", lambda k: '"${' + k + '}"')


def render_templates() -> dict[str, str]:
    """model name → config.pbtxt with upstream `${key}` placeholders (the files in backend/templates/)."""
    return {m.name: render_config(m, *_placeholders()) for m in MODELS}


def render_repository(backend: Backend, params: Mapping[str, object]) -> dict[str, str]:
    """Validate `params` and return relative path → file text for the whole repository (no disk access)."""
    values = validate_parameters(backend, params)
    scalar, string = _filled(values)
    files: dict[str, str] = {}
    for model in MODELS:
        module = PYTHON_MODEL_MODULES.get(model.name)
        overrides: dict[str, str] = {}
        if model.name == "tensorrt_llm" and backend == "cpu":
            module = CPU_ENGINE_MODULE
            # A python model must be handed CPU tensors (upstream's "no" is for the GPU python backend).
            overrides["FORCE_CPU_ONLY_INPUT_TENSORS"] = "yes"
        files[f"{model.name}/config.pbtxt"] = render_config(model, scalar, string, overrides)
        # Every model needs a version directory; TensorRT-LLM's stays empty (engine via gpt_model_path).
        files[f"{model.name}/1/"] = ""
        if module is not None:
            files[f"{model.name}/1/model.py"] = _shim(model.name, module)
    files[MARKER_FILE] = json.dumps({"backend": backend, "parameters": values}, indent=2, sort_keys=True) + "\n"
    return files


def _shim(model_name: str, module: str) -> str:
    return (
        f'"""{model_name}: written by hpc-serve (backend/repository.py). The code lives in {module};\n'
        'tritonserver must run with the hpc-serve source tree on PYTHONPATH (the launcher sets it)."""\n'
        f"from {module} import TritonPythonModel  # noqa: F401\n"
    )


# ------------------------------------------------------------------------------------------------- writing
def check_replaceable(out_dir: Path) -> None:
    """Refuse to replace `out_dir` unless it is missing, empty, or a repository this module wrote (it carries
    `.hpc-serve-repository.json`): never someone's unrelated folder.  Also used by render before its swap."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    if any(out_dir.iterdir()) and not (out_dir / MARKER_FILE).is_file():
        raise FileExistsError(
            f"{out_dir} is not empty and is not an hpc-serve model repository "
            f"(no {MARKER_FILE}); refusing to replace it"
        )


def write_model_repository(out_dir: Path, backend: Backend, params: Mapping[str, object]) -> None:
    """Write the five-model repository to `out_dir`, replacing a previous one atomically.

    Everything is validated before the disk is touched. The tree is built in a temporary sibling
    directory, then swapped in with two renames (old → trash, new → out_dir), so tritonserver never sees
    a half-written repository. An existing `out_dir` is only replaced if it is empty or was written by
    this function (it carries `.hpc-serve-repository.json`) — never someone's unrelated folder.
    """
    files = render_repository(backend, params)
    out_dir = Path(out_dir).absolute()
    check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    trash: Path | None = None
    try:
        for rel, text in files.items():
            path = tmp / rel
            if rel.endswith("/"):
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        tmp.chmod(0o755)
        if out_dir.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            trash.rmdir()
            os.rename(out_dir, trash)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if trash is not None and trash.exists() and not out_dir.exists():
            os.rename(trash, out_dir)
        raise
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def write_templates(directory: Path | None = None) -> None:
    """Regenerate backend/templates/<model>/config.pbtxt (upstream-style `${key}` templates)."""
    directory = Path(directory) if directory else Path(__file__).parent / "templates"
    for name, text in render_templates().items():
        (directory / name).mkdir(parents=True, exist_ok=True)
        (directory / name / "config.pbtxt").write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """`python -m backend.repository --write-templates` or `OUT --backend cpu --params params.json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path)
    parser.add_argument("--backend", choices=BACKENDS, default="cpu")
    parser.add_argument("--params", type=Path, help="JSON object of fill keys")
    parser.add_argument("--write-templates", action="store_true")
    args = parser.parse_args(argv)
    if args.write_templates:
        write_templates()
        return
    if args.out_dir is None or args.params is None:
        parser.error("out_dir and --params are required unless --write-templates")
    write_model_repository(args.out_dir, args.backend, json.loads(args.params.read_text()))


if __name__ == "__main__":
    main()
