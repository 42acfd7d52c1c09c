"""The spec's `build:` section: the engine is built by a Slurm job of its own before serving (hpc/jobs/).

For `backend: tensorrtllm` the job runs upstream's tools: `convert_checkpoint.py` (or `quantize.py --qformat`
when `quantization` is set) with the spec's tp/pp, then `trtllm-build` with the plugin flags and limits. For
`backend: cpu` it creates the checkpoint `model.init` asks for and shards it per tensor-parallel rank. Either
way the engine goes to a folder of its own under `output_dir`, named by what built it (hpc/jobs/build_plan.py).

How the section must fit the rest of the spec (backend, tp/pp, GPUs per node) needs the whole spec, so
`check_build` is called from `Spec`'s own validator (hpc/spec/schema.py); the limits it builds are what
`validate` compares the triton section against (hpc/spec/files.py `engine_limit_conflicts`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from hpc.spec.checks import (
    _SLURM_WORD,
    SlurmTime,
    _check,
    _no_newline,
    _Section,
)

if TYPE_CHECKING:
    from hpc.spec.schema import Spec

#: trtllm-build's plugin and feature switches (`trtllm-build --help`, TensorRT-LLM 0.12–0.17: PluginConfig fields
#: exposed as flags, and kv_cache_type); a value is `auto`, a dtype, `enable` or `disable`, `paged` /
#: `continuous` (kv_cache_type), or a number (tokens_per_block)
PLUGIN_FLAGS = (
    "kv_cache_type",
    "gpt_attention_plugin",
    "gemm_plugin",
    "gemm_swiglu_plugin",
    "fp8_rowwise_gemm_plugin",
    "low_latency_gemm_plugin",
    "nccl_plugin",
    "lookup_plugin",
    "lora_plugin",
    "moe_plugin",
    "mamba_conv1d_plugin",
    "bert_attention_plugin",
    "context_fmha",
    "use_paged_context_fmha",
    "use_fp8_context_fmha",
    "paged_kv_cache",
    "remove_input_padding",
    "reduce_fusion",
    "user_buffer",
    "use_fused_mlp",
    "multiple_profiles",
    "paged_state",
    "streamingllm",
    "tokens_per_block",
    "norm_quant_fusion",
)
#: what the tensorrtllm backend's in-flight batching needs (gpt attention plugin, paged KV cache, packed inputs):
#: given unless the spec says otherwise. `--kv_cache_type paged` (TensorRT-LLM 0.12+; commands/build.py calls
#: `--paged_kv_cache` deprecated, its equivalent); an older TensorRT-LLM takes `plugins: {paged_kv_cache: enable}`
#: instead, which then replaces it
DEFAULT_PLUGINS: dict[str, str] = {
    "gpt_attention_plugin": "auto",
    "gemm_plugin": "auto",
    "kv_cache_type": "paged",
    "remove_input_padding": "enable",
    "context_fmha": "enable",
}
#: quantize.py --qformat values (examples/quantization/quantize.py)
QFORMATS = ("fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "nvfp4")
#: where the TensorRT-LLM release containers (nvcr.io/nvidia/tensorrt-llm/release) keep the examples
DEFAULT_QUANTIZE_SCRIPT = "/app/tensorrt_llm/examples/quantization/quantize.py"


def _extra_args(values: list[str]) -> list[str]:
    """Extra tool arguments: passed one by one, shell-quoted, so any text goes; only one line each."""
    for value in values:
        _no_newline(value)
    return values


class BuildSpec(_Section):
    """Build the served engine as a job of its own before serving (`hpc-serve build SPEC`; `submit` chains the
    serving job after it with --dependency=afterok). tp/pp come from `model.tp_size` / `model.pp_size`."""

    checkpoint_dir: Path | None = Field(
        None, description="the Hugging Face checkpoint to build from; backend cpu: default model.checkpoint_dir"
    )
    output_dir: Path = Field(
        Path("engines"), description="engines go to a folder of their own under it, named by what built them"
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="convert_checkpoint.py / quantize.py --dtype"
    )
    quantization: Literal[QFORMATS] | None = Field(  # type: ignore[valid-type]
        None, description="quantize.py --qformat (instead of convert_checkpoint.py), e.g. int4_awq or fp8"
    )
    kv_cache_dtype: Literal["fp8", "int8"] | None = Field(None, description="quantize.py --kv_cache_dtype")
    calib_size: int | None = Field(None, ge=1, description="quantize.py --calib_size")
    gpus_per_node: int | None = Field(
        None, ge=1, description="trtllm-build --gpus_per_node (rank → GPU r % N); default slurm.gpus_per_node"
    )
    plugins: dict[str, str | int | bool] = Field(
        default_factory=dict, description="trtllm-build flags: gpt_attention_plugin, gemm_plugin, paged_kv_cache …"
    )
    max_batch_size: int | None = Field(
        None, ge=1, description="trtllm-build --max_batch_size; default triton.triton_max_batch_size"
    )
    max_input_len: int = Field(1024, ge=1, description="trtllm-build --max_input_len: the longest prompt, in tokens")
    max_seq_len: int | None = Field(
        None, ge=1, description="trtllm-build --max_seq_len; default the model's (trtllm-build decides)"
    )
    max_num_tokens: int | None = Field(
        None,
        ge=1,
        description="trtllm-build --max_num_tokens: tokens of one step, all requests; default trtllm-build's",
    )
    workers: int | None = Field(None, ge=1, description="--workers of the tools; default the GPUs of the build node")
    convert_script: str | None = Field(
        None, description="convert_checkpoint.py of the model's family, e.g. /app/tensorrt_llm/examples/llama/..."
    )
    quantize_script: str = Field(DEFAULT_QUANTIZE_SCRIPT, description="quantize.py, used with quantization")
    convert_args: list[str] = Field(default_factory=list, description="extra arguments of convert_checkpoint.py")
    quantize_args: list[str] = Field(default_factory=list, description="extra arguments of quantize.py")
    build_args: list[str] = Field(default_factory=list, description="extra arguments of trtllm-build")
    time: SlurmTime | None = Field(None, description="the build job's time limit; default slurm.time")
    partition: str | None = Field(None, description="default slurm.partition")

    _names = field_validator("partition")(_check(_SLURM_WORD, "Slurm name"))
    _args = field_validator("convert_args", "quantize_args", "build_args")(_extra_args)
    _scripts = field_validator("convert_script", "quantize_script")(lambda v: _no_newline(v) if v else v)

    @field_validator("plugins")
    @classmethod
    def _plugins(cls, values: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
        import difflib

        for key, value in values.items():
            if key not in PLUGIN_FLAGS:
                close = difflib.get_close_matches(key, PLUGIN_FLAGS, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(PLUGIN_FLAGS)}"
                raise ValueError(f"@{key}: unknown trtllm-build flag {key!r}{hint}")
            _no_newline(str(value))
        return values

    def plugin_flags(self) -> dict[str, str]:
        """The trtllm-build switches: DEFAULT_PLUGINS with the spec's own on top (true/false → enable/disable)."""
        merged: dict[str, str] = dict(DEFAULT_PLUGINS)
        if "paged_kv_cache" in self.plugins:  # the older spelling of the same switch: never both
            merged.pop("kv_cache_type")
        for key, value in self.plugins.items():
            merged[key] = ("enable" if value else "disable") if isinstance(value, bool) else str(value)
        return merged


def source_checkpoint(spec: Spec) -> Path:
    """The checkpoint the build reads: `build.checkpoint_dir`, for backend cpu by default `model.checkpoint_dir`
    (the folder `model.init` creates)."""
    b = spec.build
    assert b is not None
    source = b.checkpoint_dir or spec.model.checkpoint_dir
    assert source is not None  # check_build refused a spec without one
    return source


def build_gpus_per_node(spec: Spec) -> int:
    assert spec.build is not None
    return spec.build.gpus_per_node or spec.slurm.gpus_per_node or spec.tasks_per_node


def build_limits(spec: Spec) -> dict[str, int | None]:
    """The limits the engine will be built with, in the layout `engine_limits` (hpc/spec/files.py) reads from an
    engine's config.json: `validate` checks the serving side against them before the engine exists."""
    b = spec.build
    assert b is not None
    return {
        "tp_size": spec.model.tp_size,
        "pp_size": spec.model.pp_size,
        "gpus_per_node": build_gpus_per_node(spec) if spec.backend_strategy.uses_gpus else None,
        "max_batch_size": b.max_batch_size or spec.triton.triton_max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_num_tokens": b.max_num_tokens,
    }


def check_build(spec: Spec) -> None:
    """How `build:` fits the rest of the spec; ValueError("@build.field: what, and the fix")."""
    b, m = spec.build, spec.model
    assert b is not None
    m.backend_strategy.check_build(spec, b)
    if b.max_seq_len is not None and b.max_input_len > b.max_seq_len:
        raise ValueError(
            f"@build.max_input_len: {b.max_input_len} is more than build.max_seq_len {b.max_seq_len} (prompt plus "
            "output); raise max_seq_len or lower max_input_len"
        )
