"""A tp 2 job across node1 and node2 serving, one behaviour per test on one shared job (its cancel is tested
in tests/test_e2e_cluster.py): where it publishes, what the ensemble, BLS and core model answer, what the
metrics say, and that the follower never listens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e import cli, core_model_stream, listening_ports, module_job, processes_under, status

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(400)]
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def served(slurm_cluster, tritonserver, tiny_gpt2, tmp_path_factory):
    with module_job(tmp_path_factory.mktemp("tp2"), "tp2", tiny_gpt2, tp=2, nodes=2, ntasks_per_node=1) as served:
        yield served


def test_the_leader_publishes_a_routable_endpoint_on_node1(served):
    job, endpoint = served
    assert status(job)["state"] == "READY"
    assert endpoint["host"] == "node1" and endpoint["rank"] == 0
    assert not endpoint["address"].startswith("127."), "clients must get an address other nodes can reach"


def test_the_ensemble_generates_and_bls_gives_the_same_greedy_text(served):
    job, _ = served
    text = cli("generate", job, PROMPT, "--max-tokens", "12").stdout
    assert text.strip(), "the ensemble returned no text"
    assert cli("generate", job, PROMPT, "--max-tokens", "12", "--model", "tensorrt_llm_bls").stdout == text


def test_the_metrics_port_reports_trtllm_and_inference_metrics(served):
    job, _ = served
    cli("generate", job, PROMPT, "--max-tokens", "2")
    metrics = json.loads(cli("metrics", job, "--json").stdout)
    by_type = {
        m["labels"].get("request_type"): m["value"] for m in metrics if m["name"] == "nv_trt_llm_request_metrics"
    }
    assert by_type["max"] == 8, by_type  # triton_max_batch_size of the spec, from the leader's metrics port
    assert any(m["name"] == "nv_inference_request_success_total" and m["value"] >= 1 for m in metrics)


def test_the_core_model_streams_token_by_token(served, tiny_gpt2):
    from backend.models.tokenizer import load_tokenizer

    pieces, error = core_model_stream(served[1], load_tokenizer(tiny_gpt2).encode(PROMPT), 8)
    assert error is None and len(pieces) >= 2, f"expected tokens streamed one by one, got {len(pieces)} ({error})"


def test_the_follower_is_a_tritonserver_that_listens_on_no_port(served):
    job, _ = served
    deploy_dir = Path(status(job)["job_dir"]).parent.parent
    followers = [
        pid for pid, cmd in processes_under(deploy_dir) if "tritonserver " in cmd and "--load-model=tensorrt_llm" in cmd
    ]
    assert len(followers) == 1 and listening_ports(followers[0]) == set()
