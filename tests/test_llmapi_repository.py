"""The llmapi workflow's model repository (backend/llmapi_repository.py): upstream's config.pbtxt with decoupled set,
model.yaml whose triton_config agrees with it; hpc-serve's model (its shim, and its own inputs declared) unless the
image's model files are asked for."""

from __future__ import annotations

import pytest
import yaml

from backend import llmapi_repository as llmapi
from backend.models.llmapi_io import OWN_INPUTS
from backend.repository import MARKER_FILE, write_model_repository
from launcher.contracts.llmapi import OWN_MODEL
from tests.test_repository import BASE, parse

ARGS = {"model": "/ckpt", "tensor_parallel_size": 1, "max_batch_size": 4}


def test_config_is_upstreams_with_decoupled(tmp_path):
    llmapi.write_llmapi_repository(tmp_path / "repo", ARGS, OWN_MODEL)
    config = parse(tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt")
    assert config.name == "tensorrt_llm" and config.backend == "python"
    assert config.model_transaction_policy.decoupled
    assert config.max_batch_size == 0
    inputs = {i.name: i for i in config.input}
    assert not inputs["text_input"].optional and all(i.optional for n, i in inputs.items() if n != "text_input")
    assert {"stop", "streaming", "sampling_param_max_tokens", "return_finish_reason"} <= set(inputs)
    assert not any(n.startswith("lora_") or n == "image_url" for n in inputs)  # 1.2.1's inputs
    assert "text_output" in {o.name for o in config.output}
    assert set(OWN_INPUTS) <= set(inputs)
    llmapi.write_llmapi_repository(tmp_path / "image", ARGS, None)  # the image's model: upstream's inputs only
    assert not set(OWN_INPUTS) & {i.name for i in parse(tmp_path / "image" / "tensorrt_llm" / "config.pbtxt").input}


def test_model_yaml_and_shim(tmp_path):
    out = tmp_path / "repo"
    llmapi.write_llmapi_repository(out, ARGS, OWN_MODEL)
    model_yaml = yaml.safe_load((out / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml == {**ARGS, "triton_config": {"decoupled": True, "max_batch_size": 0}}
    assert (
        "from backend.models.llmapi import TritonPythonModel" in (out / "tensorrt_llm" / "1" / "model.py").read_text()
    )
    assert (out / MARKER_FILE).is_file()
    llmapi.write_llmapi_repository(out, ARGS, None)  # the image's model.py comes at job start
    assert sorted(p.name for p in (out / "tensorrt_llm" / "1").iterdir()) == ["model.yaml"]


def test_replaces_an_engine_repository(tmp_path):
    out = tmp_path / "repo"
    write_model_repository(out, "cpu", BASE)
    llmapi.write_llmapi_repository(out, ARGS, OWN_MODEL)
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER_FILE, "tensorrt_llm"])


def test_decoupled_follows_model_yaml(tmp_path):
    out = tmp_path / "repo"
    llmapi.write_llmapi_repository(out, {**ARGS, "triton_config": {"decoupled": False}}, OWN_MODEL)
    assert not parse(out / "tensorrt_llm" / "config.pbtxt").model_transaction_policy.decoupled
    assert (
        yaml.safe_load((out / "tensorrt_llm" / "1" / "model.yaml").read_text())["triton_config"]["decoupled"] is False
    )


@pytest.mark.parametrize(
    ("triton_config", "words"),
    [({"decoupled": "yes"}, "decoupled must be true or false"), ({"max_batch_size": 8}, "max_batch_size must be 0")],
)
def test_triton_config_that_disagrees_is_refused(tmp_path, triton_config, words):
    with pytest.raises(ValueError, match=words):
        llmapi.write_llmapi_repository(tmp_path / "repo", {**ARGS, "triton_config": triton_config}, OWN_MODEL)
    assert not (tmp_path / "repo").exists()


def test_model_files_must_be_known(tmp_path):
    with pytest.raises(ValueError, match="model_files"):
        llmapi.write_llmapi_repository(tmp_path / "repo", ARGS, "gpu")  # type: ignore[arg-type]
