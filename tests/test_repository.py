"""backend/repository.py: generated configs parse as Triton ModelConfig and match the upstream reference
(docs/decisions.md "The engine workflow's model repository"), values are typed and escaped, bad params are rejected."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from backend import repository as repo
from backend.templates import tables

MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")
# (inputs, outputs) counted in the reference; ensemble outputs are 18 upstream minus the duplicate.
COUNTS = {
    "ensemble": (34, 17),
    "preprocessing": (13, 20),
    "tensorrt_llm": (60, 19),
    "postprocessing": (2, 1),
    "tensorrt_llm_bls": (40, 17),
}
# fill_template keys per upstream template, copied from the reference ("template parameters (n)").
UPSTREAM_KEYS = {
    "ensemble": {"logits_datatype", "triton_max_batch_size"},
    "preprocessing": {
        "add_special_tokens",
        "engine_dir",
        "max_num_images",
        "max_queue_delay_microseconds",
        "max_queue_size",
        "multimodal_model_path",
        "preprocessing_instance_count",
        "tokenizer_dir",
        "triton_max_batch_size",
    },
    "tensorrt_llm": set(
        """batch_scheduler_policy batching_strategy cancellation_check_period_ms
        cross_kv_cache_fraction cuda_graph_cache_size cuda_graph_mode decoding_mode decoupled_mode eagle_choices
        enable_chunked_context enable_context_fmha_fp32_acc enable_kv_cache_reuse enable_trt_overlap
        encoder_engine_dir encoder_input_features_data_type engine_dir exclude_input_in_output gpu_device_ids
        gpu_weights_percent guided_decoding_backend iter_stats_max_iterations kv_cache_free_gpu_mem_fraction
        kv_cache_host_memory_bytes kv_cache_onboard_blocks logits_datatype lookahead_ngram_size
        lookahead_verification_set_size lookahead_window_size lora_cache_gpu_memory_fraction
        lora_cache_host_memory_bytes lora_cache_max_adapter_size lora_cache_optimal_adapter_size lora_prefetch_dir
        max_attention_window_size max_beam_width max_queue_delay_microseconds max_queue_size
        max_tokens_in_paged_kv_cache medusa_choices multi_block_mode normalize_log_probs num_nodes participant_ids
        request_stats_max_iterations sink_token_length speculative_decoding_fast_logits stats_check_period_ms
        tokenizer_dir triton_backend triton_max_batch_size xgrammar_tokenizer_info_path""".split()
    ),
    "postprocessing": {
        "postprocessing_instance_count",
        "skip_special_tokens",
        "tokenizer_dir",
        "triton_max_batch_size",
    },
    "tensorrt_llm_bls": {
        "accumulate_tokens",
        "bls_instance_count",
        "decoupled_mode",
        "logits_datatype",
        "multimodal_encoders_name",
        "tensorrt_llm_draft_model_name",
        "tensorrt_llm_model_name",
        "triton_max_batch_size",
    },
}

BASE = {
    "triton_max_batch_size": 8,
    "decoupled_mode": False,
    "logits_datatype": "TYPE_FP32",
    "encoder_input_features_data_type": "TYPE_FP16",
    "preprocessing_instance_count": 1,
    "postprocessing_instance_count": 2,
    "bls_instance_count": 3,
    "tokenizer_dir": "/models/tok",
    "engine_dir": "/models/engine",
    "batching_strategy": "inflight_fused_batching",
    **repo.UPSTREAM_DEFAULTS,
}
FULL = {
    **BASE,
    "max_beam_width": 2,
    "exclude_input_in_output": True,
    "kv_cache_free_gpu_mem_fraction": 0.5,
    "max_tokens_in_paged_kv_cache": 2560,
    "enable_kv_cache_reuse": "False",
    "gpu_device_ids": [[0, 1], [2, 3]],
    "tp_size": 2,
    "pp_size": 1,
    "accumulate_tokens": True,
    "skip_special_tokens": False,
    "add_special_tokens": True,
    "tensorrt_llm_model_name": "tensorrt_llm",
    "max_queue_size": 16,
    "max_queue_delay_microseconds": 100,
    "logits_datatype": "fp16",
}


def parse(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(encoding="utf-8"), mc.ModelConfig())


def write(tmp_path: Path, backend: str, params: dict) -> Path:
    out = tmp_path / "repo"
    repo.write_model_repository(out, backend, params)
    return out


def dtype_name(value: int) -> str:
    return mc.DataType.Name(value)


CASES = [(b, d, name) for b, d, name in itertools.product(("cpu", "tensorrtllm"), (False, True), ("base", "full"))]


@pytest.mark.parametrize("backend,decoupled,which", CASES)
def test_every_config_parses_and_matches_tables(tmp_path, backend, decoupled, which):
    params = {**(BASE if which == "base" else FULL), "decoupled_mode": decoupled}
    out = write(tmp_path, backend, params)
    logits = "TYPE_FP16" if which == "full" else "TYPE_FP32"
    for name in MODELS:
        cfg = parse(out / name / "config.pbtxt")
        assert cfg.name == name
        assert cfg.max_batch_size == 8
        assert (len(cfg.input), len(cfg.output)) == COUNTS[name]
        assert len({t.name for t in cfg.input}) == len(cfg.input)
        assert len({t.name for t in cfg.output}) == len(cfg.output), f"duplicate output in {name}"
        table = next(m for m in tables.MODELS if m.name == name)
        for parsed, spec in zip(list(cfg.input) + list(cfg.output), table.inputs + table.outputs, strict=True):
            assert parsed.name == spec.name
            want = {"$logits_datatype": logits, "$encoder_input_features_data_type": "TYPE_FP16"}.get(
                spec.dtype, spec.dtype
            )
            assert dtype_name(parsed.data_type) == want, (name, spec.name)
            assert tuple(parsed.dims) == spec.dims
        for parsed, spec in zip(cfg.input, table.inputs, strict=True):
            assert parsed.optional == spec.optional and parsed.allow_ragged_batch == spec.ragged
            assert parsed.HasField("reshape") == (spec.reshape is not None)
            if spec.reshape is not None:
                assert list(parsed.reshape.shape) == []
        if name in ("tensorrt_llm", "tensorrt_llm_bls"):
            assert cfg.model_transaction_policy.decoupled is decoupled
        if name != "ensemble":
            assert [g.kind for g in cfg.instance_group] == [mc.ModelInstanceGroup.KIND_CPU]
    assert "${" not in "".join(p.read_text() for p in out.rglob("*") if p.is_file())


def test_reference_spot_checks(tmp_path):
    """A few facts typed straight from the reference, independent of tables.py."""
    out = write(tmp_path, "cpu", BASE)
    llm = parse(out / "tensorrt_llm" / "config.pbtxt")
    inputs = {t.name: t for t in llm.input}
    stop = inputs["stop_words_list"]
    assert (dtype_name(stop.data_type), list(stop.dims), stop.optional, stop.allow_ragged_batch) == (
        "TYPE_INT32",
        [2, -1],
        True,
        True,
    )
    assert not inputs["input_lengths"].optional and inputs["input_lengths"].HasField("reshape")
    assert dtype_name(inputs["seed"].data_type) == "TYPE_UINT64"
    assert list(inputs["lora_config"].dims) == [-1, 3]
    assert llm.dynamic_batching.preferred_batch_size == [8]
    assert llm.dynamic_batching.default_queue_policy.max_queue_size == 0
    assert llm.instance_group[0].count == 1
    pre = parse(out / "preprocessing" / "config.pbtxt")
    assert list({t.name: t for t in pre.output}["BAD_WORDS_IDS"].dims) == [2, -1]
    assert pre.instance_group[0].count == 1
    assert parse(out / "postprocessing" / "config.pbtxt").instance_group[0].count == 2
    assert parse(out / "tensorrt_llm_bls" / "config.pbtxt").instance_group[0].count == 3
    ens = parse(out / "ensemble" / "config.pbtxt")
    assert ens.platform == "ensemble"
    assert [o.name for o in ens.output].count("kv_cache_alloc_total_blocks") == 1
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    assert len(ens.ensemble_scheduling.step[1].input_map) == 35
    assert ens.ensemble_scheduling.step[1].input_map["runtime_top_k"] == "top_k"
    assert ens.ensemble_scheduling.step[1].output_map["output_ids"] == "_TOKENS_BATCH"
    assert ens.ensemble_scheduling.step[2].output_map["OUTPUT"] == "text_output"


def test_ensemble_wiring_is_consistent(tmp_path):
    """Every map key exists on its model; every value is an ensemble input or an earlier step's output."""
    out = write(tmp_path, "cpu", BASE)
    ens = parse(out / "ensemble" / "config.pbtxt")
    available = {t.name for t in ens.input}
    for step in ens.ensemble_scheduling.step:
        cfg = parse(out / step.model_name / "config.pbtxt")
        model_inputs = {t.name: t for t in cfg.input}
        assert set(step.input_map) <= set(model_inputs), step.model_name
        assert set(step.input_map.values()) <= available, step.model_name
        required = {n for n, t in model_inputs.items() if not t.optional}
        assert required <= set(step.input_map), (step.model_name, required - set(step.input_map))
        assert set(step.output_map) <= {t.name for t in cfg.output}
        available |= set(step.output_map.values())
    assert {t.name for t in ens.output} <= available


@pytest.mark.parametrize("backend", ["cpu", "tensorrtllm"])
def test_backend_switch_and_shims(tmp_path, backend):
    out = write(tmp_path, backend, BASE)
    llm = parse(out / "tensorrt_llm" / "config.pbtxt")
    force = llm.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value
    if backend == "cpu":
        assert llm.backend == "python" and force == "yes"
        assert (
            "from backend.models.tensorrt_llm_cpu import TritonPythonModel"
            in (out / "tensorrt_llm/1/model.py").read_text()
        )
    else:
        assert llm.backend == "tensorrtllm" and force == "no"
        assert (out / "tensorrt_llm/1").is_dir() and not any((out / "tensorrt_llm/1").iterdir())
        assert llm.parameters["gpt_model_type"].string_value == "inflight_fused_batching"
    assert llm.parameters["gpt_model_path"].string_value == "/models/engine"
    for name, module in repo.PYTHON_MODEL_MODULES.items():
        shim = (out / name / "1" / "model.py").read_text()
        assert f"from {module} import TritonPythonModel" in shim
        compile(shim, name, "exec")
    assert not (out / "ensemble" / "1" / "model.py").exists()


def test_optional_parameters_omitted_and_typed(tmp_path):
    out = write(tmp_path, "cpu", BASE)
    llm = parse(out / "tensorrt_llm" / "config.pbtxt")
    assert "max_tokens_in_paged_kv_cache" not in llm.parameters
    assert set(llm.parameters) == {
        "FORCE_CPU_ONLY_INPUT_TENSORS",
        "gpt_model_type",
        "gpt_model_path",
        "executor_worker_path",
        "tokenizer_dir",
    }
    assert set(parse(out / "tensorrt_llm_bls" / "config.pbtxt").parameters) == set()
    out = write(tmp_path, "cpu", FULL)
    p = parse(out / "tensorrt_llm" / "config.pbtxt").parameters
    assert p["exclude_input_in_output"].string_value == "true"
    assert p["enable_kv_cache_reuse"].string_value == "false"
    assert p["kv_cache_free_gpu_mem_fraction"].string_value == "0.5"
    assert p["max_tokens_in_paged_kv_cache"].string_value == "2560"
    assert p["gpu_device_ids"].string_value == "0,1;2,3"
    assert (p["tp_size"].string_value, p["pp_size"].string_value) == ("2", "1")
    assert parse(out / "tensorrt_llm_bls" / "config.pbtxt").parameters["accumulate_tokens"].string_value == "true"
    assert parse(out / "postprocessing" / "config.pbtxt").parameters["skip_special_tokens"].string_value == "false"
    llm = parse(out / "tensorrt_llm" / "config.pbtxt")
    assert llm.dynamic_batching.max_queue_delay_microseconds == 100
    assert llm.dynamic_batching.default_queue_policy.max_queue_size == 16
    # None means "not given"
    out = write(tmp_path, "cpu", {**BASE, "max_beam_width": None})
    assert "max_beam_width" not in parse(out / "tensorrt_llm" / "config.pbtxt").parameters


HOSTILE = [
    '/a "quoted" dir',
    "C:\\back\\slash\\",
    "two\nlines\r\n",
    "brace } { ]",
    "tab\tand 'single'",
    "ünïcødé/模型",
    'x" } parameters: { key: "evil" value: { string_value: "1" } } #',
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_strings_round_trip(tmp_path, value):
    out = write(
        tmp_path, "cpu", {**BASE, "tokenizer_dir": value, "engine_dir": value, "tensorrt_llm_model_name": value}
    )
    for name in ("preprocessing", "postprocessing", "tensorrt_llm"):
        params = parse(out / name / "config.pbtxt").parameters
        assert params["tokenizer_dir"].string_value == value
        assert "evil" not in params
    assert parse(out / "tensorrt_llm_bls" / "config.pbtxt").parameters["tensorrt_llm_model_name"].string_value == value


@pytest.mark.parametrize(
    "key,value",
    [
        ("tokenizer_dir", "/a/${tokenizer_dir}"),
        ("engine_dir", "nul\x00byte"),
        ("engine_dir", ""),
        ("tokenizer_dir", 42),
    ],
)
def test_unrepresentable_strings_rejected(key, value):
    with pytest.raises(ValueError, match=key):
        repo.render_repository("cpu", {**BASE, key: value})


def test_unknown_key_did_you_mean():
    with pytest.raises(ValueError, match=r"unknown .*'tokenizer_dri'.*did you mean 'tokenizer_dir'"):
        repo.render_repository("cpu", {**BASE, "tokenizer_dri": "/x"})
    with pytest.raises(ValueError, match="'completely_unrelated'"):
        repo.render_repository("cpu", {**BASE, "completely_unrelated": 1})


@pytest.mark.parametrize("key", sorted(repo.required_parameters("tensorrtllm")))
def test_missing_required_key(key):
    params = {k: v for k, v in BASE.items() if k != key}
    with pytest.raises(ValueError, match=f"missing required .*{key}"):
        repo.render_repository("tensorrtllm", params)


def test_batching_strategy_only_required_for_tensorrtllm():
    params = {k: v for k, v in BASE.items() if k != "batching_strategy"}
    repo.render_repository("cpu", params)
    assert "batching_strategy" in repo.required_parameters("tensorrtllm") - repo.required_parameters("cpu")


@pytest.mark.parametrize(
    "key,value",
    [
        ("triton_max_batch_size", 0),
        ("triton_max_batch_size", True),
        ("triton_max_batch_size", "eight"),
        ("triton_max_batch_size", 2.5),
        ("decoupled_mode", "maybe"),
        ("decoupled_mode", 2),
        ("logits_datatype", "TYPE_FP33"),
        ("bls_instance_count", -1),
        ("max_queue_size", -1),
        ("kv_cache_free_gpu_mem_fraction", 1.5),
        ("kv_cache_free_gpu_mem_fraction", float("nan")),
        ("batching_strategy", "static"),
        ("gpu_device_ids", "0;;1"),
        ("gpu_device_ids", "a,b"),
        ("triton_backend", "tensorrtllm"),  # contradicts backend="cpu"
    ],
)
def test_bad_values_rejected(key, value):
    with pytest.raises(ValueError, match=key):
        repo.render_repository("cpu", {**BASE, key: value})


def test_bad_backend():
    with pytest.raises(ValueError, match="backend"):
        repo.render_repository("gpu", BASE)  # type: ignore[arg-type]


def test_known_parameters_cover_upstream():
    upstream = set().union(*UPSTREAM_KEYS.values())
    assert repo.KNOWN_PARAMETERS == upstream | repo.HPC_SERVE_PARAMETERS


def test_templates_in_sync_and_complete():
    """backend/templates/<model>/config.pbtxt are generated from the tables and carry every upstream key."""
    tdir = Path(repo.__file__).parent / "templates"
    for name, text in repo.render_templates().items():
        on_disk = (tdir / name / "config.pbtxt").read_text()
        assert on_disk == text, f"run `python -m backend.repository --write-templates` ({name} is stale)"
        for key in UPSTREAM_KEYS[name]:
            assert "${" + key + "}" in text, (name, key)


def test_replace_is_clean_and_atomic(tmp_path):
    out = write(tmp_path, "tensorrtllm", BASE)
    (out / "stale_model").mkdir()
    repo.write_model_repository(out, "cpu", {**BASE, "triton_max_batch_size": 4})
    assert not (out / "stale_model").exists()
    assert parse(out / "tensorrt_llm" / "config.pbtxt").max_batch_size == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # no tmp/old leftovers
    with pytest.raises(ValueError):  # invalid params leave the previous repository untouched
        repo.write_model_repository(out, "cpu", {**BASE, "bogus": 1})
    assert parse(out / "tensorrt_llm" / "config.pbtxt").max_batch_size == 4


def test_refuses_to_replace_foreign_directory(tmp_path):
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError):
        repo.write_model_repository(foreign, "cpu", BASE)
    assert (foreign / "thesis.tex").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    repo.write_model_repository(empty, "cpu", BASE)
    assert (empty / "ensemble" / "config.pbtxt").is_file()


def test_cli_writes_repository(tmp_path):
    import json

    params = tmp_path / "params.json"
    params.write_text(json.dumps(BASE))
    repo.main([str(tmp_path / "cli"), "--backend", "cpu", "--params", str(params)])
    assert parse(tmp_path / "cli" / "ensemble" / "config.pbtxt").name == "ensemble"
