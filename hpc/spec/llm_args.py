"""The names of TensorRT-LLM's LLM API arguments (the top-level fields of `TorchLlmArgs`), per release: the
spec's `llm_api:` section is checked against them, so a misspelt name gets a did-you-mean instead of failing on
a GPU node when `LLM(**args)` refuses it.

Sources (the docs of each release, not the tag's code: docs/decisions.md "TensorRT-LLM versions and known defects"):
- 1.2.1: TensorRT-LLM's gh-pages docs of the tag, `1.2.1/_modules/tensorrt_llm/llmapi/llm_args.html`
  (NVIDIA/TensorRT-LLM@58fb435e), BaseLlmArgs and TorchLlmArgs. Fields declared after TorchLlmArgs' validators
  were not read, so a 1.2.1 name missing here may still exist: such a name passes through with a note.
- main: the docs of main, `llm-api/reference/TorchLlmArgs.html` (NVIDIA/TensorRT-LLM@aafda271), full signature.
"""

from __future__ import annotations

import difflib

#: the release names the table knows, oldest first
V1_2_1, MAIN = "1.2.1", "main"

_ARGS_1_2_1 = """
model tokenizer tokenizer_mode custom_tokenizer skip_tokenizer_init trust_remote_code tensor_parallel_size dtype
revision tokenizer_revision pipeline_parallel_size context_parallel_size gpus_per_node moe_cluster_parallel_size
moe_tensor_parallel_size moe_expert_parallel_size enable_attention_dp enable_lm_head_tp_in_adp pp_partition cp_config
load_format fail_fast_on_attention_window_too_large enable_lora lora_config kv_cache_config enable_chunked_prefill
guided_decoding_backend batched_logits_processor iter_stats_max_iterations request_stats_max_iterations
peft_cache_config scheduler_config cache_transceiver_config sparse_attention_config speculative_config max_batch_size
max_input_len max_seq_len max_beam_width max_num_tokens gather_generation_logits num_postprocess_workers
postprocess_tokenizer_dir reasoning_parser decoding_config mpi_session _mpi_session otlp_traces_endpoint backend
return_perf_metrics orchestrator_type env_overrides
garbage_collection_gen0_threshold cuda_graph_config attention_dp_config disable_overlap_scheduler moe_config
nvfp4_gemm_config attn_backend sampler_type sampler_force_async_worker enable_iter_perf_stats enable_iter_req_stats
print_iter_log perf_metrics_max_requests batch_wait_timeout_ms batch_wait_timeout_iters batch_wait_max_tokens_ratio
torch_compile_config enable_autotuner enable_layerwise_nvtx_marker enable_min_latency stream_interval
force_dynamic_quantization allreduce_strategy checkpoint_loader checkpoint_format kv_connector_config mm_encoder_only
ray_worker_extension_cls ray_placement_config enable_sleep disable_flashinfer_sampling max_stats_len
"""

_ARGS_MAIN = """
model tokenizer tokenizer_mode custom_tokenizer post_processor_hook skip_tokenizer_init trust_remote_code
tensor_parallel_size dtype revision tokenizer_revision model_kwargs pipeline_parallel_size context_parallel_size
gpus_per_node moe_cluster_parallel_size moe_tensor_parallel_size moe_expert_parallel_size enable_attention_dp
enable_lm_head_tp_in_adp pp_partition cp_config load_format enable_lora lora_config kv_cache_config
enable_chunked_prefill guided_decoding_backend batched_logits_processor iter_stats_max_iterations
request_stats_max_iterations peft_cache_config scheduler_config cache_transceiver_config sparse_attention_config
kv_cache_compression_config speculative_config max_batch_size max_input_len max_seq_len max_beam_width max_num_tokens
gather_generation_logits num_postprocess_workers postprocess_tokenizer_dir num_serve_frontends reasoning_parser
decoding_config _mpi_session otlp_traces_endpoint backend return_perf_metrics perf_metrics_output_dir
perf_metrics_max_requests prometheus_metrics_config enable_energy_metrics orchestrator_type env_overrides
telemetry_config generation_config garbage_collection_gen0_threshold cuda_graph_config encoder_cuda_graph_config
enable_encoder_decoder_mixed_cuda_graph multimodal_config attention_dp_config disable_overlap_scheduler
enable_return_routed_experts moe_config nvfp4_gemm_config dwdp_config encoder_max_batch_size encoder_max_num_tokens
attn_backend enable_mla_skip_correction mla_skip_correction_threshold sampler_force_async_worker
enable_in_graph_sampling enable_speculative_beam_history_d2h enable_early_first_token_response
enable_low_latency_host_dispatch enable_iter_perf_stats enable_tokenization_cache enable_iter_req_stats print_iter_log
batch_wait_timeout_ms batch_wait_timeout_iters batch_wait_max_tokens_ratio torch_compile_config
prefill_cuda_graph_backend prefill_capture_num_tokens enable_autotuner use_fine_grained_sync
enable_layerwise_nvtx_marker enable_min_latency stream_interval force_dynamic_quantization allreduce_strategy
checkpoint_loader checkpoint_format checkpoint_io_policy mx_config gms_config kv_connector_config mm_encoder_only
disable_mm_encoder encode_only ray_worker_extension_cls ray_placement_config ray_worker_nsight_options sleep_config
reorder_policy_config enable_resource_governor use_cute_dsl_blockscaling_mm use_cute_dsl_blockscaling_bmm
use_cute_dsl_bf16_bmm use_cute_dsl_bf16_gemm max_stats_len layer_wise_benchmarks_config
"""


def _table() -> dict[str, tuple[str, ...]]:
    table: dict[str, tuple[str, ...]] = {}
    for version, names in ((V1_2_1, _ARGS_1_2_1), (MAIN, _ARGS_MAIN)):
        for name in names.split():
            table[name] = (*table.get(name, ()), version)
    return table


#: LLM API argument name → the releases (of V1_2_1, MAIN) whose TorchLlmArgs has it
LLM_API_ARGS: dict[str, tuple[str, ...]] = _table()


def releases(name: str) -> str:
    """Which releases have `name`, for a message: "TensorRT-LLM 1.2.1 and main"."""
    return "TensorRT-LLM " + " and ".join(LLM_API_ARGS.get(name, ()))


def suggestion(name: str) -> str:
    """'; did you mean X (TensorRT-LLM 1.2.1 and main)?' for the closest known name, or ''."""
    close = difflib.get_close_matches(name, sorted(LLM_API_ARGS), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r} ({releases(close[0])})?" if close else ""
