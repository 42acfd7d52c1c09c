"""The one table of tensorrt_llm parameters: every upstream `fill_template.py` key, its type or allowed values,
which are required, and the check that turns a value into its config.pbtxt text.

Why a module of its own: both sides need it — `hpc-serve validate` (hpc/spec/parameters.py) refuses a wrong
value with the spec's FILE:LINE, and the repository writer (backend/repository.py) renders the same canonical
text — so a value that validates is a value that renders. Standard library only.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

#: the python model that serves `tensorrt_llm` with backend cpu (the CPU engine)
CPU_ENGINE_MODULE = "backend.models.tensorrt_llm_cpu"


@dataclass(frozen=True)
class RepositoryBackend:
    """What the engine workflow's model repository takes from a backend (the spec's `model.backend`): the
    `tensorrt_llm` model's Triton backend, the parameters it needs beyond REQUIRED_PARAMETERS, and the python
    module that serves it (None: TensorRT-LLM's C++ backend) with the config.pbtxt values that module needs.
    The backend side of the login side's backend strategy (hpc/spec/workflows.py); a new backend adds one."""

    name: str
    triton_backend: str
    required: frozenset[str] = frozenset()
    module: str | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)


#: each backend's repository facts, by the spec's `model.backend`
REPOSITORY_BACKENDS: dict[str, RepositoryBackend] = {
    b.name: b
    for b in (
        # the C++ backend rejects an unset `gpt_model_type`: batching_strategy is required
        RepositoryBackend("tensorrtllm", "tensorrtllm", required=frozenset({"batching_strategy"})),
        # a python model must be handed CPU tensors (upstream's "no" is for the GPU python backend)
        RepositoryBackend("cpu", "python", module=CPU_ENGINE_MODULE, overrides={"FORCE_CPU_ONLY_INPUT_TENSORS": "yes"}),
        # never rendered: the engine workflow refuses backend sim (hpc/spec/workflows.py Sim.check_engine_model);
        # the entry keeps the table whole, as the CPU engine's python model would be its model there
        RepositoryBackend("sim", "python", module=CPU_ENGINE_MODULE, overrides={"FORCE_CPU_ONLY_INPUT_TENSORS": "yes"}),
    )
}
Backend = Literal["tensorrtllm", "cpu", "sim"]
BACKENDS: tuple[str, ...] = tuple(REPOSITORY_BACKENDS)

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
    # CPU engine: the least time one step takes, in ms (0: as fast as the CPU goes); see engine_tables.py
    "min_step_ms": "uint",
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

#: Every accepted key: the upstream `fill_template.py` keys of the five templates, plus hpc-serve's own.
KNOWN_PARAMETERS: frozenset[str] = frozenset(_KINDS)

#: hpc-serve's additions, read by the CPU engine: `tp_size` and `pp_size` (parallel sizes; also written for
#: TensorRT-LLM, where the C++ backend ignores them) and `min_step_ms` (its least step time).
HPC_SERVE_PARAMETERS: frozenset[str] = frozenset({"tp_size", "pp_size", "min_step_ms"})

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


def required_parameters(backend: Backend) -> frozenset[str]:
    """Required keys for `backend`; TensorRT-LLM also needs `batching_strategy` (the C++ backend rejects
    an unset `gpt_model_type`), the CPU engine has a single scheduler."""
    _check_backend(backend)
    return REQUIRED_PARAMETERS | REPOSITORY_BACKENDS[backend].required


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
    expected = REPOSITORY_BACKENDS[backend].triton_backend
    if values.setdefault("triton_backend", expected) != expected:
        raise ValueError(
            f"parameter 'triton_backend'={values['triton_backend']!r} contradicts "
            f"backend={backend!r} (which means triton_backend {expected!r})"
        )
    missing = sorted(required_parameters(backend) - values.keys())
    if missing:
        raise ValueError(f"missing required model repository parameter(s): {', '.join(missing)}")
    return values
