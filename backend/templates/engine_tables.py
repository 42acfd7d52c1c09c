"""The three models a replica's engine side is made of, upstream's (tensorrtllm_backend@c2e65b8
`all_models/inflight_batcher_llm`), as data: `tensorrt_llm`, `preprocessing`, `postprocessing`; and the
statistics outputs ensemble and BLS pass through from `tensorrt_llm` (backend/templates/tables.py has those two).
"""

from __future__ import annotations

from backend.templates.table_types import ModelTable, Param, Tensor
from backend.templates.table_types import tensor as _t
from launcher.contracts import model_names

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
    # The CPU engine's least step time (ms). Why: a GPU's decode step takes ~10-50 ms and the tiny test model's
    # well under 1 ms, so on a loaded machine the engine runs 100+ steps while a stop crosses the gateway and
    # tritonserver (docs/decisions.md "Abandoned streams"); at a GPU's pace the same delay is a few steps, as on a
    # cluster.
    Param("min_step_ms", "min_step_ms"),
)

TENSORRT_LLM = ModelTable(
    name=model_names.TENSORRT_LLM,
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
    name=model_names.PREPROCESSING,
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
    name=model_names.POSTPROCESSING,
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
