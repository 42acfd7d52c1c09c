"""The llmapi workflow's CPU side without tritonserver: the stand-in's wire (protocol.py), the request tensors
(backend/models/llmapi_io.py), model.yaml's arguments (engine_args.py), and the leader node's lifetime per
TensorRT-LLM release (`python -m tensorrt_llm.llmapi.mgmn_leader_node` of the stand-in)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backend.cpu_engine.llmapi import protocol as p
from backend.cpu_engine.llmapi.engine_args import DEFAULT_MAX_BATCH_SIZE, EngineArgsError, engine_args
from backend.models import llmapi_io as io
from launcher.contracts.llmapi import (
    IPC_ADDR_VAR,
    IPC_HMAC_KEY_VAR,
    SPAWN_PROXY_VAR,
    STANDIN_VERSION_VAR,
    new_hmac_key,
    proxy_env,
)
from launcher.contracts.trtllm_versions import LEADER_NODE_MODULE
from tests._llmapi import STANDIN_PATH
from tests._triton import free_port

ROOT = Path(__file__).resolve().parent.parent


def test_messages_round_trip_typed():
    message = p.Output("3", [1, 2], True, -1.5, "length", None, p.Perf(1, 2, 3, 4, 1, 1, 1))
    assert p.decode(p.encode(message)) == message
    submit = p.Submit("1", [5], p.Sampling(max_tokens=4, stop_words=[[7, 8]]), True)
    assert p.decode(p.encode(submit)) == submit


@pytest.mark.parametrize("data", [b"not json", b'{"type": "Exec", "fields": {}}', b'{"type": "Abort", "fields": {}}'])
def test_anything_else_is_a_protocol_error(data):
    with pytest.raises(p.ProtocolError, match="malformed message"):
        p.decode(data)


def test_endpoint_names_what_is_missing():
    good = proxy_env(4242, new_hmac_key())
    assert p.endpoint(good).address == ("127.0.0.1", 4242)
    with pytest.raises(p.ProtocolError, match=f"{SPAWN_PROXY_VAR}=1 is not set"):
        p.endpoint({k: v for k, v in good.items() if k != SPAWN_PROXY_VAR})
    with pytest.raises(p.ProtocolError, match=IPC_ADDR_VAR):
        p.endpoint({**good, IPC_ADDR_VAR: "ipc:///tmp/x"})
    with pytest.raises(p.ProtocolError, match=f"{IPC_HMAC_KEY_VAR} must be a non-empty hex string"):
        p.endpoint({**good, IPC_HMAC_KEY_VAR: "not hex"})


def _arrays(**values) -> dict[str, np.ndarray]:
    out = {"text_input": np.array([b"hello"], dtype=np.object_)}
    for name, value in values.items():
        out[name] = value if isinstance(value, np.ndarray) else np.array([value])
    return out


def test_request_defaults_are_upstreams():
    req = io.parse_request(_arrays())
    assert (req.prompt, req.max_tokens, req.exclude_input_from_output, req.streaming) == ("hello", 32, False, False)
    assert req.output == io.OutputConfig() and not req.return_perf_metrics
    assert req.sampling_kwargs() == {"max_tokens": 32, "exclude_input_from_output": False, "return_perf_metrics": False}


def test_stop_strings_and_hpc_serves_own_inputs_become_sampling_params_keywords():
    req = io.parse_request(
        _arrays(
            sampling_param_stop=np.array([b"END", b"", "\u00e9".encode()], dtype=np.object_),
            sampling_param_ignore_eos=np.array([True]),
            sampling_param_min_tokens=np.array([3], np.int32),
            sampling_param_repetition_penalty=np.array([1.25], np.float32),
            sampling_param_length_penalty=np.array([-0.5], np.float32),
            sampling_param_top_k=np.array([5], np.int32),
            sampling_param_seed=np.array([2**64 - 1], np.uint64),
        )
    )
    kwargs = req.sampling_kwargs()
    assert kwargs["stop"] == ["END", "\u00e9"], "text, as SamplingParams tokenizes it (upstream passes bytes)"
    assert (kwargs["ignore_eos"], kwargs["min_tokens"], kwargs["repetition_penalty"]) == (True, 3, 1.25)
    assert (kwargs["length_penalty"], kwargs["top_k"], kwargs["seed"]) == (-0.5, 5, 2**64 - 1)
    from backend.standin.tensorrt_llm.sampling_params import SamplingParams  # upstream's keywords and checks

    assert SamplingParams(**kwargs).length_penalty == -0.5


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"sampling_param_max_tokens": np.array([0], np.int32)}, "'sampling_param_max_tokens' must be at least 1"),
        (
            {"sampling_param_temperature": np.array([np.inf], np.float32)},
            "'sampling_param_temperature' must be a finite",
        ),
        ({"sampling_param_top_p": np.array([1.5], np.float32)}, "'sampling_param_top_p' must be a finite number >= 0"),
        ({"sampling_param_top_k": np.array([-1], np.int32)}, "'sampling_param_top_k' must be at least 0"),
        ({"sampling_param_best_of": np.array([2], np.int32)}, "'sampling_param_best_of' is 2"),
        ({"sampling_param_repetition_penalty": np.array([0], np.float32)}, "'sampling_param_repetition_penalty' must"),
        ({"sampling_param_min_tokens": np.array([-1], np.int32)}, "'sampling_param_min_tokens' must be at least 0"),
        ({"sampling_param_length_penalty": np.array([np.nan], np.float32)}, "'sampling_param_length_penalty' must be"),
        ({"streaming": np.array([True, False])}, "Expected a scalar tensor for tensor streaming"),
        ({"text_input": np.array([b"\xff"], dtype=np.object_)}, "'text_input' is not valid UTF-8"),
    ],
)
def test_bad_values_name_their_input(values, words):
    with pytest.raises(io.InputError, match=words):
        io.parse_request(_arrays(**values))


def test_responses_are_strings():
    req = io.parse_request(
        _arrays(return_finish_reason=True, return_cumulative_logprob=True, sampling_param_return_perf_metrics=True)
    )
    perf = {name: 0 for name in io.PERF_OUTPUTS}
    arrays = io.response_arrays(io.Completion("hi", "stop", None, -1.25, perf), req)
    assert arrays["text_output"].tolist() == [b"hi"] and arrays["finish_reason"].tolist() == ["stop"]
    assert arrays["cumulative_logprob"].tolist() == ["-1.25"] and arrays["acceptance_rate"].tolist() == ["0.0"]
    assert "stop_reason" not in arrays


def test_engine_args(tmp_path):
    kv = {"max_tokens": 512, "enable_block_reuse": False, "tokens_per_block": 16, "free_gpu_memory_fraction": 0.9}
    args = engine_args({"model": str(tmp_path), "kv_cache_config": kv}, 1)
    assert args.load.max_batch_size == DEFAULT_MAX_BATCH_SIZE and args.kv_cache_tokens == 512
    assert (args.block_reuse, args.tokens_per_block) == (False, 16)
    assert args.ignored == ["kv_cache_config.free_gpu_memory_fraction"]
    default = engine_args({"model": str(tmp_path)}, 1)
    assert (default.block_reuse, default.tokens_per_block) == (True, 32), "TensorRT-LLM's KvCacheConfig defaults"
    for bad, words in [
        ({"model": "org/hub-name"}, "not a folder on this node"),
        (
            {"model": str(tmp_path), "tensor_parallel_size": 2},
            "tensor_parallel_size 2 but the leader node's MPI world has 1",
        ),
        ({"model": str(tmp_path), "pipeline_parallel_size": 2}, "pipeline_parallel_size 2"),
        ({"model": str(tmp_path), "max_batch_size": 0}, "max_batch_size must be a positive integer"),
        ({"model": str(tmp_path), "kv_cache_config": {"enable_block_reuse": "yes"}}, "must be true or false"),
    ]:
        with pytest.raises(EngineArgsError, match=words):
            engine_args(bad, 1)


def _leader_node(env: dict[str, str], version: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", LEADER_NODE_MODULE],
        env={**os.environ, **env, "PYTHONPATH": STANDIN_PATH, STANDIN_VERSION_VAR: version},
        stderr=subprocess.PIPE,
        text=True,
    )


def _load(env: dict[str, str], checkpoint: Path) -> p.Channel:
    channel = p.connect(p.endpoint(env), timeout_s=60)
    channel.send(p.Load({"model": str(checkpoint)}))
    assert isinstance(channel.recv(), p.Loaded)
    return channel


@pytest.mark.slow
def test_a_current_leader_node_outlives_its_client_and_ends_by_the_stop_action(tiny_gpt2):
    """1.x (RemoteMpiCommSessionClient.shutdown is a no-op): the LLM's connection closing leaves the leader node
    serving (a second LLM may connect); only `mgmn_leader_node --action stop` ends it, exit 0."""
    env = proxy_env(free_port(), new_hmac_key())
    proc = _leader_node(env, "1.2.1")
    try:
        _load(env, tiny_gpt2).close()
        second = _load(env, tiny_gpt2)  # still serving: the first client's end did not stop it
        second.close()
        assert proc.poll() is None
        stop = subprocess.run(
            [sys.executable, "-m", LEADER_NODE_MODULE, "--action", "stop"],
            env={**os.environ, **env, "PYTHONPATH": STANDIN_PATH},
            check=False,
            timeout=60,
        )
        assert stop.returncode == 0
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_leader_node_before_the_stop_action_stops_when_the_model_connection_breaks(tiny_gpt2):
    """Before 1.0 (no --action): tritonserver gone without unloading (killed), the leader node must not outlive it."""
    env = proxy_env(free_port(), new_hmac_key())
    proc = _leader_node(env, "0.20.0")
    try:
        _load(env, tiny_gpt2).close()
        assert proc.wait(60) == 0
        assert "the model's connection is gone" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
