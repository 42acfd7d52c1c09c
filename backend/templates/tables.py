"""The five upstream models (tensorrtllm_backend@c2e65b8 `all_models/inflight_batcher_llm`) as data.

Why tables instead of hand-written pbtxt: the same tensor list feeds the tensorrt_llm config for both
backends (TensorRT-LLM C++ and the CPU python engine), the ensemble's step maps, the BLS model's request
building and the tests, so a name can only be wrong in one place. Names, dtypes, dims and flags are
upstream's, with one fix: upstream's ensemble declares output `kv_cache_alloc_total_blocks` twice
(Triton rejects duplicate outputs on strict parsers; the second copy is dropped here).

Conventions: dims exclude the batch dimension (every model has `max_batch_size: ${triton_max_batch_size}`);
a dtype starting with `$` names the fill key that supplies it (e.g. `$logits_datatype`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Tensor:
    """One `input`/`output` entry. `reshape=()` renders `reshape: { shape: [ ] }` (upstream's scalar inputs)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False
    ragged: bool = False
    reshape: tuple[int, ...] | None = None


def _t(name: str, dtype: str, dims: list[int], flags: str = "") -> Tensor:
    """Compact constructor: flags is a space-separated subset of `optional ragged reshape`."""
    words = set(flags.split())
    unknown = words - {"optional", "ragged", "reshape"}
    if unknown:
        raise ValueError(f"unknown tensor flags {sorted(unknown)} for {name}")
    dt = dtype if dtype.startswith("$") else f"TYPE_{dtype}"
    return Tensor(name, dt, tuple(dims), "optional" in words, "ragged" in words, () if "reshape" in words else None)


@dataclass(frozen=True)
class Param:
    """One `parameters {}` entry: Triton key, and the fill key supplying it (or a fixed value)."""

    key: str
    source: str | None = None
    fixed: str | None = None


@dataclass(frozen=True)
class Step:
    """One ensemble step: `input_map` is (model input, ensemble tensor), `output_map` (model output, ensemble tensor)."""

    model_name: str
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ModelTable:
    """Everything needed to render one config.pbtxt.

    kind: "ensemble" renders `platform: "ensemble"`; "python" `backend: "python"`; "llm" renders
    `backend: "${triton_backend}"` (tensorrtllm or python, chosen by the repository writer).
    dynamic_batching: None = absent, "empty" = `dynamic_batching {}`, "queue" = upstream's preferred
    size / queue delay / queue size block. instance_count: a fill key or a fixed int.
    """

    name: str
    kind: Literal["ensemble", "python", "llm"]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    parameters: tuple[Param, ...] = ()
    decoupled_key: str | None = None
    dynamic_batching: Literal["empty", "queue"] | None = None
    instance_count: str | int | None = None
    steps: tuple[Step, ...] = field(default=())


# --------------------------------------------------------------------------------------------- tensorrt_llm
# The 16 statistics/extra outputs that ensemble and BLS pass through unchanged (tensorrt_llm has them all,
# plus output_ids, sequence_length and context_phase_params).
PASSTHROUGH_OUTPUTS: tuple[Tensor, ...] = (
    _t("cum_log_probs", "FP32", [-1]),
    _t("output_log_probs", "FP32", [-1, -1]),
    _t("context_logits", "$logits_datatype", [-1, -1]),
    _t("generation_logits", "$logits_datatype", [-1, -1, -1]),
    _t("batch_index", "INT32", [1]),
    _t("sequence_index", "INT32", [1]),
    _t("kv_cache_alloc_new_blocks", "INT32", [1]),
    _t("kv_cache_reused_blocks", "INT32", [1]),
    _t("kv_cache_alloc_total_blocks", "INT32", [1]),
    _t("arrival_time_ns", "INT64", [1]),
    _t("first_scheduled_time_ns", "INT64", [1]),
    _t("first_token_time_ns", "INT64", [1]),
    _t("last_token_time_ns", "INT64", [1]),
    _t("acceptance_rate", "FP32", [1]),
    _t("total_accepted_draft_tokens", "INT32", [1]),
    _t("total_draft_tokens", "INT32", [1]),
)

LLM_INPUTS: tuple[Tensor, ...] = (
    _t("input_ids", "INT32", [-1], "optional ragged"),
    _t("encoder_input_features", "$encoder_input_features_data_type", [-1, -1], "optional ragged"),
    _t("encoder_output_lengths", "INT32", [1], "optional reshape"),
    _t("input_lengths", "INT32", [1], "reshape"),
    _t("request_output_len", "INT32", [1], "reshape"),
    _t("num_return_sequences", "INT32", [1], "optional reshape"),
    _t("draft_input_ids", "INT32", [-1], "optional ragged"),
    _t("decoder_input_ids", "INT32", [-1], "optional ragged"),
    _t("decoder_input_lengths", "INT32", [1], "optional reshape"),
    _t("draft_logits", "$logits_datatype", [-1, -1], "optional ragged"),
    _t("draft_acceptance_threshold", "FP32", [1], "optional reshape"),
    _t("end_id", "INT32", [1], "optional reshape"),
    _t("pad_id", "INT32", [1], "optional reshape"),
    _t("stop_words_list", "INT32", [2, -1], "optional ragged"),
    _t("bad_words_list", "INT32", [2, -1], "optional ragged"),
    _t("embedding_bias", "FP32", [-1], "optional ragged"),
    _t("beam_width", "INT32", [1], "optional reshape"),
    _t("temperature", "FP32", [1], "optional reshape"),
    _t("runtime_top_k", "INT32", [1], "optional reshape"),
    _t("runtime_top_p", "FP32", [1], "optional reshape"),
    _t("runtime_top_p_min", "FP32", [1], "optional reshape"),
    _t("runtime_top_p_decay", "FP32", [1], "optional reshape"),
    _t("runtime_top_p_reset_ids", "INT32", [1], "optional reshape"),
    _t("len_penalty", "FP32", [1], "optional reshape"),
    _t("early_stopping", "BOOL", [1], "optional reshape"),
    _t("repetition_penalty", "FP32", [1], "optional reshape"),
    _t("min_tokens", "INT32", [1], "optional reshape"),
    _t("beam_search_diversity_rate", "FP32", [1], "optional reshape"),
    _t("presence_penalty", "FP32", [1], "optional reshape"),
    _t("frequency_penalty", "FP32", [1], "optional reshape"),
    _t("seed", "UINT64", [1], "optional reshape"),
    _t("return_log_probs", "BOOL", [1], "optional reshape"),
    _t("return_context_logits", "BOOL", [1], "optional reshape"),
    _t("return_generation_logits", "BOOL", [1], "optional reshape"),
    _t("return_perf_metrics", "BOOL", [1], "optional reshape"),
    _t("exclude_input_in_output", "BOOL", [1], "optional reshape"),
    _t("stop", "BOOL", [1], "optional reshape"),
    _t("streaming", "BOOL", [1], "optional reshape"),
    _t("prompt_embedding_table", "FP16", [-1, -1], "optional ragged"),
    _t("prompt_table_extra_ids", "UINT64", [-1], "optional ragged"),
    _t("prompt_vocab_size", "INT32", [1], "optional reshape"),
    _t("cross_attention_mask", "BOOL", [-1, -1], "optional ragged"),
    _t("mrope_rotary_cos_sin", "FP32", [-1], "optional"),
    _t("mrope_position_deltas", "INT64", [1], "optional"),
    _t("lora_task_id", "UINT64", [1], "optional reshape"),
    _t("lora_weights", "FP16", [-1, -1], "optional ragged"),
    _t("lora_config", "INT32", [-1, 3], "optional ragged"),
    _t("context_phase_params", "UINT8", [-1], "optional ragged"),
    _t("skip_cross_attn_blocks", "BOOL", [1], "optional ragged"),
    _t("retention_token_range_starts", "INT32", [-1], "optional ragged"),
    _t("retention_token_range_ends", "INT32", [-1], "optional ragged"),
    _t("retention_token_range_priorities", "INT32", [-1], "optional ragged"),
    _t("retention_token_range_durations_ms", "INT32", [-1], "optional ragged"),
    _t("retention_decode_priority", "INT32", [1], "optional ragged"),
    _t("retention_decode_duration_ms", "INT32", [1], "optional ragged"),
    _t("guided_decoding_guide_type", "STRING", [1], "optional ragged"),
    _t("guided_decoding_guide", "STRING", [1], "optional ragged"),
    _t("lookahead_window_size", "INT32", [1], "optional ragged"),
    _t("lookahead_ngram_size", "INT32", [1], "optional ragged"),
    _t("lookahead_verification_set_size", "INT32", [1], "optional ragged"),
)

LLM_OUTPUTS: tuple[Tensor, ...] = (
    _t("output_ids", "INT32", [-1, -1]),
    _t("sequence_length", "INT32", [-1]),
    *PASSTHROUGH_OUTPUTS[:6],
    _t("context_phase_params", "UINT8", [-1]),
    *PASSTHROUGH_OUTPUTS[6:],
)

EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"

LLM_PARAMETERS: tuple[Param, ...] = (
    Param("max_beam_width", "max_beam_width"),
    Param("FORCE_CPU_ONLY_INPUT_TENSORS", fixed="no"),
    Param("gpt_model_type", "batching_strategy"),
    Param("gpt_model_path", "engine_dir"),
    Param("encoder_model_path", "encoder_engine_dir"),
    Param("max_tokens_in_paged_kv_cache", "max_tokens_in_paged_kv_cache"),
    Param("max_attention_window_size", "max_attention_window_size"),
    Param("sink_token_length", "sink_token_length"),
    Param("batch_scheduler_policy", "batch_scheduler_policy"),
    Param("kv_cache_free_gpu_mem_fraction", "kv_cache_free_gpu_mem_fraction"),
    Param("cross_kv_cache_fraction", "cross_kv_cache_fraction"),
    Param("kv_cache_host_memory_bytes", "kv_cache_host_memory_bytes"),
    Param("kv_cache_onboard_blocks", "kv_cache_onboard_blocks"),
    Param("exclude_input_in_output", "exclude_input_in_output"),
    Param("cancellation_check_period_ms", "cancellation_check_period_ms"),
    Param("stats_check_period_ms", "stats_check_period_ms"),
    Param("iter_stats_max_iterations", "iter_stats_max_iterations"),
    Param("request_stats_max_iterations", "request_stats_max_iterations"),
    Param("enable_kv_cache_reuse", "enable_kv_cache_reuse"),
    Param("normalize_log_probs", "normalize_log_probs"),
    Param("enable_chunked_context", "enable_chunked_context"),
    Param("gpu_device_ids", "gpu_device_ids"),
    Param("participant_ids", "participant_ids"),
    Param("num_nodes", "num_nodes"),
    Param("lora_cache_optimal_adapter_size", "lora_cache_optimal_adapter_size"),
    Param("lora_cache_max_adapter_size", "lora_cache_max_adapter_size"),
    Param("lora_cache_gpu_memory_fraction", "lora_cache_gpu_memory_fraction"),
    Param("lora_cache_host_memory_bytes", "lora_cache_host_memory_bytes"),
    Param("lora_prefetch_dir", "lora_prefetch_dir"),
    Param("decoding_mode", "decoding_mode"),
    Param("executor_worker_path", fixed=EXECUTOR_WORKER_PATH),
    Param("lookahead_window_size", "lookahead_window_size"),
    Param("lookahead_ngram_size", "lookahead_ngram_size"),
    Param("lookahead_verification_set_size", "lookahead_verification_set_size"),
    Param("medusa_choices", "medusa_choices"),
    Param("eagle_choices", "eagle_choices"),
    Param("gpu_weights_percent", "gpu_weights_percent"),
    Param("enable_context_fmha_fp32_acc", "enable_context_fmha_fp32_acc"),
    Param("multi_block_mode", "multi_block_mode"),
    Param("cuda_graph_mode", "cuda_graph_mode"),
    Param("cuda_graph_cache_size", "cuda_graph_cache_size"),
    Param("speculative_decoding_fast_logits", "speculative_decoding_fast_logits"),
    Param("tokenizer_dir", "tokenizer_dir"),
    Param("guided_decoding_backend", "guided_decoding_backend"),
    Param("xgrammar_tokenizer_info_path", "xgrammar_tokenizer_info_path"),
    # Commented out in c2e65b8, live in the newer NVIDIA/TensorRT-LLM copy.
    Param("enable_trt_overlap", "enable_trt_overlap"),
    # hpc-serve additions, read by the CPU engine (the C++ backend ignores unknown parameters; TP/PP
    # of a TensorRT engine come from the engine itself).
    Param("tp_size", "tp_size"),
    Param("pp_size", "pp_size"),
)

TENSORRT_LLM = ModelTable(
    name="tensorrt_llm",
    kind="llm",
    inputs=LLM_INPUTS,
    outputs=LLM_OUTPUTS,
    parameters=LLM_PARAMETERS,
    decoupled_key="decoupled_mode",
    dynamic_batching="queue",
    instance_count=1,
)

# ------------------------------------------------------------------------------------------- preprocessing
PREPROCESSING = ModelTable(
    name="preprocessing",
    kind="python",
    inputs=(
        _t("QUERY", "STRING", [1]),
        _t("DECODER_QUERY", "STRING", [1], "optional"),
        _t("IMAGE_BYTES", "UINT8", [-1, -1, -1, -1], "optional"),
        _t("IMAGE_URL", "STRING", [1], "optional"),
        _t("VIDEO_BYTES", "UINT8", [-1, -1, -1, -1], "optional"),
        _t("REQUEST_OUTPUT_LEN", "INT32", [1]),
        _t("BAD_WORDS_DICT", "STRING", [-1], "optional"),
        _t("STOP_WORDS_DICT", "STRING", [-1], "optional"),
        _t("EMBEDDING_BIAS_WORDS", "STRING", [-1], "optional"),
        _t("EMBEDDING_BIAS_WEIGHTS", "FP32", [-1], "optional"),
        _t("END_ID", "INT32", [1], "optional"),
        _t("PAD_ID", "INT32", [1], "optional"),
        _t("PROMPT_TABLE_EXTRA_ID", "UINT64", [1], "optional"),
    ),
    outputs=(
        _t("INPUT_ID", "INT32", [-1]),
        _t("REQUEST_INPUT_LEN", "INT32", [1]),
        _t("DECODER_INPUT_ID", "INT32", [-1]),
        _t("REQUEST_DECODER_INPUT_LEN", "INT32", [1]),
        _t("BAD_WORDS_IDS", "INT32", [2, -1]),
        _t("STOP_WORDS_IDS", "INT32", [2, -1]),
        _t("EMBEDDING_BIAS", "FP32", [-1]),
        _t("REQUEST_OUTPUT_LEN", "INT32", [-1]),
        _t("OUT_END_ID", "INT32", [1]),
        _t("OUT_PAD_ID", "INT32", [1]),
        _t("OUT_PROMPT_TABLE_EXTRA_IDS", "UINT64", [-1]),
        _t("PIXEL_VALUES", "FP16", [-1, -1, -1, -1]),
        _t("ASPECT_RATIO_IDS", "INT64", [-1]),
        _t("ASPECT_RATIO_MASK", "INT64", [-1, -1]),
        _t("CROSS_ATTENTION_MASK", "INT64", [-1, -1, -1]),
        _t("IMAGE_SIZES", "INT64", [2]),
        _t("IS_VIDEO_INPUT", "BOOL", [1]),
        _t("ATTENTION_MASK", "INT64", [-1]),
        _t("IMAGE_GRID_THW", "INT64", [3]),
        _t("VISION_INPUT_ID", "INT32", [-1]),
    ),
    parameters=(
        Param("tokenizer_dir", "tokenizer_dir"),
        Param("add_special_tokens", "add_special_tokens"),
        Param("multimodal_model_path", "multimodal_model_path"),
        Param("gpt_model_path", "engine_dir"),
        Param("max_num_images", "max_num_images"),
    ),
    dynamic_batching="queue",
    instance_count="preprocessing_instance_count",
)

# ------------------------------------------------------------------------------------------ postprocessing
POSTPROCESSING = ModelTable(
    name="postprocessing",
    kind="python",
    inputs=(
        _t("TOKENS_BATCH", "INT32", [-1, -1]),
        _t("SEQUENCE_LENGTH", "INT32", [-1]),
    ),
    outputs=(_t("OUTPUT", "STRING", [-1]),),
    parameters=(
        Param("tokenizer_dir", "tokenizer_dir"),
        Param("skip_special_tokens", "skip_special_tokens"),
    ),
    dynamic_batching="empty",
    instance_count="postprocessing_instance_count",
)

# ---------------------------------------------------------------------------------------- ensemble and BLS
# Client-facing sampling inputs shared by ensemble and BLS (same names, dtypes and dims in both).
_SAMPLING_INPUTS: tuple[Tensor, ...] = (
    _t("exclude_input_in_output", "BOOL", [1], "optional"),
    _t("end_id", "INT32", [1], "optional"),
    _t("pad_id", "INT32", [1], "optional"),
    _t("top_k", "INT32", [1], "optional"),
    _t("top_p", "FP32", [1], "optional"),
    _t("temperature", "FP32", [1], "optional"),
    _t("length_penalty", "FP32", [1], "optional"),
    _t("repetition_penalty", "FP32", [1], "optional"),
    _t("min_tokens", "INT32", [1], "optional"),
    _t("presence_penalty", "FP32", [1], "optional"),
    _t("frequency_penalty", "FP32", [1], "optional"),
    _t("seed", "UINT64", [1], "optional"),
)

ENSEMBLE_INPUTS: tuple[Tensor, ...] = (
    _t("text_input", "STRING", [1]),
    _t("decoder_text_input", "STRING", [1], "optional"),
    _t("max_tokens", "INT32", [1]),
    _t("num_return_sequences", "INT32", [1], "optional"),
    _t("bad_words", "STRING", [-1], "optional"),
    _t("stop_words", "STRING", [-1], "optional"),
    *_SAMPLING_INPUTS,
    _t("return_log_probs", "BOOL", [1], "optional"),
    _t("return_context_logits", "BOOL", [1], "optional"),
    _t("return_generation_logits", "BOOL", [1], "optional"),
    _t("return_perf_metrics", "BOOL", [1], "optional"),
    _t("beam_width", "INT32", [1], "optional"),
    _t("stream", "BOOL", [1], "optional"),
    _t("prompt_embedding_table", "FP16", [-1, -1], "optional"),
    _t("prompt_table_extra_id", "UINT64", [1], "optional"),
    _t("prompt_vocab_size", "INT32", [1], "optional"),
    _t("embedding_bias_words", "STRING", [-1], "optional"),
    _t("embedding_bias_weights", "FP32", [-1], "optional"),
    _t("lora_task_id", "UINT64", [1], "optional"),
    _t("lora_weights", "FP16", [-1, -1], "optional ragged"),
    _t("lora_config", "INT32", [-1, 3], "optional ragged"),
    _t("guided_decoding_guide_type", "STRING", [1], "optional ragged"),
    _t("guided_decoding_guide", "STRING", [1], "optional ragged"),
)

TEXT_OUTPUTS: tuple[Tensor, ...] = (_t("text_output", "STRING", [-1]), *PASSTHROUGH_OUTPUTS)

# preprocessing input ← client tensor (ensemble step and BLS use the same map)
PREPROCESSING_INPUT_MAP: tuple[tuple[str, str], ...] = (
    ("QUERY", "text_input"),
    ("DECODER_QUERY", "decoder_text_input"),
    ("REQUEST_OUTPUT_LEN", "max_tokens"),
    ("BAD_WORDS_DICT", "bad_words"),
    ("STOP_WORDS_DICT", "stop_words"),
    ("EMBEDDING_BIAS_WORDS", "embedding_bias_words"),
    ("EMBEDDING_BIAS_WEIGHTS", "embedding_bias_weights"),
    ("END_ID", "end_id"),
    ("PAD_ID", "pad_id"),
    ("PROMPT_TABLE_EXTRA_ID", "prompt_table_extra_id"),
)

# preprocessing output → ensemble intermediate tensor
PREPROCESSING_OUTPUT_MAP: tuple[tuple[str, str], ...] = (
    ("REQUEST_INPUT_LEN", "_REQUEST_INPUT_LEN"),
    ("INPUT_ID", "_INPUT_ID"),
    ("REQUEST_DECODER_INPUT_LEN", "_REQUEST_DECODER_INPUT_LEN"),
    ("DECODER_INPUT_ID", "_DECODER_INPUT_ID"),
    ("REQUEST_OUTPUT_LEN", "_REQUEST_OUTPUT_LEN"),
    ("STOP_WORDS_IDS", "_STOP_WORDS_IDS"),
    ("BAD_WORDS_IDS", "_BAD_WORDS_IDS"),
    ("EMBEDDING_BIAS", "_EMBEDDING_BIAS"),
    ("OUT_END_ID", "_PREPROCESSOR_END_ID"),
    ("OUT_PAD_ID", "_PREPROCESSOR_PAD_ID"),
    ("OUT_PROMPT_TABLE_EXTRA_IDS", "_OUT_PROMPT_TABLE_EXTRA_IDS"),
)

# tensorrt_llm input ← preprocessing output (by preprocessing's output name)
LLM_FROM_PREPROCESSING: tuple[tuple[str, str], ...] = (
    ("input_ids", "INPUT_ID"),
    ("decoder_input_ids", "DECODER_INPUT_ID"),
    ("input_lengths", "REQUEST_INPUT_LEN"),
    ("decoder_input_lengths", "REQUEST_DECODER_INPUT_LEN"),
    ("request_output_len", "REQUEST_OUTPUT_LEN"),
    ("end_id", "OUT_END_ID"),
    ("pad_id", "OUT_PAD_ID"),
    ("embedding_bias", "EMBEDDING_BIAS"),
    ("stop_words_list", "STOP_WORDS_IDS"),
    ("bad_words_list", "BAD_WORDS_IDS"),
    ("prompt_table_extra_ids", "OUT_PROMPT_TABLE_EXTRA_IDS"),
)

# tensorrt_llm input ← client tensor
LLM_FROM_CLIENT: tuple[tuple[str, str], ...] = (
    ("exclude_input_in_output", "exclude_input_in_output"),
    ("runtime_top_k", "top_k"),
    ("runtime_top_p", "top_p"),
    ("temperature", "temperature"),
    ("len_penalty", "length_penalty"),
    ("repetition_penalty", "repetition_penalty"),
    ("min_tokens", "min_tokens"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("seed", "seed"),
    ("return_log_probs", "return_log_probs"),
    ("return_context_logits", "return_context_logits"),
    ("return_generation_logits", "return_generation_logits"),
    ("return_perf_metrics", "return_perf_metrics"),
    ("num_return_sequences", "num_return_sequences"),
    ("beam_width", "beam_width"),
    ("streaming", "stream"),
    ("prompt_embedding_table", "prompt_embedding_table"),
    ("prompt_vocab_size", "prompt_vocab_size"),
    ("lora_task_id", "lora_task_id"),
    ("lora_weights", "lora_weights"),
    ("lora_config", "lora_config"),
    ("guided_decoding_guide_type", "guided_decoding_guide_type"),
    ("guided_decoding_guide", "guided_decoding_guide"),
)

_PRE_OUT = dict(PREPROCESSING_OUTPUT_MAP)

ENSEMBLE = ModelTable(
    name="ensemble",
    kind="ensemble",
    inputs=ENSEMBLE_INPUTS,
    outputs=TEXT_OUTPUTS,
    steps=(
        Step("preprocessing", PREPROCESSING_INPUT_MAP, PREPROCESSING_OUTPUT_MAP),
        Step(
            "tensorrt_llm",
            tuple((dst, _PRE_OUT[src]) for dst, src in LLM_FROM_PREPROCESSING) + LLM_FROM_CLIENT,
            (("output_ids", "_TOKENS_BATCH"), ("sequence_length", "_SEQUENCE_LENGTH"))
            + tuple((t.name, t.name) for t in PASSTHROUGH_OUTPUTS),
        ),
        Step(
            "postprocessing",
            (("TOKENS_BATCH", "_TOKENS_BATCH"), ("SEQUENCE_LENGTH", "_SEQUENCE_LENGTH")),
            (("OUTPUT", "text_output"),),
        ),
    ),
)

BLS_INPUTS: tuple[Tensor, ...] = (
    _t("text_input", "STRING", [1]),
    _t("decoder_text_input", "STRING", [1], "optional"),
    _t("image_input", "FP16", [-1, 3, -1, -1], "optional"),
    _t("image_bytes_input", "UINT8", [-1, -1, -1, -1], "optional"),
    _t("image_url_input", "STRING", [1], "optional"),
    _t("video_bytes_input", "UINT8", [-1, -1, -1, -1], "optional"),
    _t("max_tokens", "INT32", [1]),
    _t("bad_words", "STRING", [-1], "optional"),
    _t("stop_words", "STRING", [-1], "optional"),
    *_SAMPLING_INPUTS,
    _t("return_log_probs", "BOOL", [1], "optional reshape"),
    _t("return_context_logits", "BOOL", [1], "optional reshape"),
    _t("return_generation_logits", "BOOL", [1], "optional reshape"),
    _t("num_return_sequences", "INT32", [1], "optional reshape"),
    _t("beam_width", "INT32", [1], "optional"),
    _t("stream", "BOOL", [1], "optional"),
    _t("prompt_embedding_table", "FP16", [-1, -1], "optional"),
    _t("prompt_vocab_size", "INT32", [1], "optional"),
    _t("prompt_table_extra_id", "UINT64", [1], "optional"),
    _t("embedding_bias_words", "STRING", [-1], "optional"),
    _t("embedding_bias_weights", "FP32", [-1], "optional"),
    _t("num_draft_tokens", "INT32", [1], "optional"),
    _t("use_draft_logits", "BOOL", [1], "optional reshape"),
    _t("lora_task_id", "UINT64", [1], "optional reshape"),
    _t("lora_weights", "FP16", [-1, -1], "optional ragged"),
    _t("lora_config", "INT32", [-1, 3], "optional ragged"),
    _t("return_perf_metrics", "BOOL", [1], "optional reshape"),
    _t("guided_decoding_guide_type", "STRING", [1], "optional"),
    _t("guided_decoding_guide", "STRING", [1], "optional"),
)

TENSORRT_LLM_BLS = ModelTable(
    name="tensorrt_llm_bls",
    kind="python",
    inputs=BLS_INPUTS,
    outputs=TEXT_OUTPUTS,
    parameters=(
        Param("accumulate_tokens", "accumulate_tokens"),
        Param("tensorrt_llm_model_name", "tensorrt_llm_model_name"),
        Param("tensorrt_llm_draft_model_name", "tensorrt_llm_draft_model_name"),
        Param("multimodal_encoders_name", "multimodal_encoders_name"),
    ),
    decoupled_key="decoupled_mode",
    instance_count="bls_instance_count",
)

MODELS: tuple[ModelTable, ...] = (ENSEMBLE, PREPROCESSING, TENSORRT_LLM, POSTPROCESSING, TENSORRT_LLM_BLS)
