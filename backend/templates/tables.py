"""The five upstream models (tensorrtllm_backend@c2e65b8 `all_models/inflight_batcher_llm`) as data: the
client-facing two here (ensemble, tensorrt_llm_bls, and how their tensors map onto the others'), the engine side's
three in engine_tables.py, all five in `MODELS`; their shapes in table_types.py.

Why tables instead of hand-written pbtxt: the same tensor list feeds the tensorrt_llm config for both
backends (TensorRT-LLM C++ and the CPU python engine), the ensemble's step maps, the BLS model's request
building and the tests, so a name can only be wrong in one place. Names, dtypes, dims and flags are
upstream's, with one fix: upstream's ensemble declares output `kv_cache_alloc_total_blocks` twice
(Triton rejects duplicate outputs on strict parsers; the second copy is dropped here).
"""

from __future__ import annotations

from backend.templates.engine_tables import PASSTHROUGH_OUTPUTS, POSTPROCESSING, PREPROCESSING, TENSORRT_LLM
from backend.templates.table_types import ModelTable, Param, Step, Tensor
from backend.templates.table_types import tensor as _t
from launcher.contracts import model_names

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
    name=model_names.ENSEMBLE,
    kind="ensemble",
    inputs=ENSEMBLE_INPUTS,
    outputs=TEXT_OUTPUTS,
    steps=(
        Step(model_names.PREPROCESSING, PREPROCESSING_INPUT_MAP, PREPROCESSING_OUTPUT_MAP),
        Step(
            model_names.TENSORRT_LLM,
            tuple((dst, _PRE_OUT[src]) for dst, src in LLM_FROM_PREPROCESSING) + LLM_FROM_CLIENT,
            (("output_ids", "_TOKENS_BATCH"), ("sequence_length", "_SEQUENCE_LENGTH"))
            + tuple((t.name, t.name) for t in PASSTHROUGH_OUTPUTS),
        ),
        Step(
            model_names.POSTPROCESSING,
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
    name=model_names.TENSORRT_LLM_BLS,
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
