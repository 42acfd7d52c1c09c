"""The simulated engine on the Slurm test cluster: a tp 2 job of it across node1 and node2 (rank 0 on node1: the
leader node running the simulated engine, and tritonserver; rank 1 on node2: a worker node that answers the
leader's heartbeat), `hpc-serve gateway` in front of it, the `openai` package as the client: real text, whole and
streamed, and the engine's own KV-cache figures for a prompt asked twice."""

from __future__ import annotations

import httpx
import pytest

from launcher.contracts.llmapi import ENGINE_VAR, SIM_GPU_VAR
from launcher.contracts.trtllm_versions import LEADER_NODE_MODULE, WORKER_NODE_MODULE
from tests._llmapi import environ_of, job_processes
from tests._sim import sim_spec
from tests.e2e import served_on_the_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(400)]
openai = pytest.importorskip("openai")

NAME = "sim-tp2"


@pytest.fixture(scope="module")
def served(slurm_cluster, tritonserver, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sim-tp2")
    with served_on_the_cluster(folder, sim_spec(folder, NAME, tp=2, nodes=2)) as served:
        yield served


def test_tp2_across_two_nodes_runs_the_simulated_engine_on_both_ranks(served):
    job, deploy = served["job"], served["deploy"]
    (leader,) = job_processes(deploy, LEADER_NODE_MODULE, job)
    (worker,) = job_processes(deploy, WORKER_NODE_MODULE, job)
    for env in (environ_of(leader), environ_of(worker)):
        assert env[ENGINE_VAR] == "sim" and env[SIM_GPU_VAR] == "h200"
    assert environ_of(worker)["SLURMD_NODENAME"] == "node2"


def test_the_gateway_serves_real_text_whole_and_streamed(served):
    client = served["client"]
    whole = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=16, seed=5)
    text = whole.choices[0].text
    assert len(text.split()) >= 5 and "\ufffd" not in text, text
    pieces = [
        c.choices[0].text
        for c in client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=16, seed=5, stream=True)
    ]
    assert len([p for p in pieces if p]) > 1 and "".join(pieces) == text


def test_a_prompt_asked_twice_finds_its_blocks_in_the_engines_cache(served):
    """The gateway sums the engine's per-request KV figures: the second time, the prompt's blocks are reused."""

    def reused() -> float:
        page = httpx.get(served["url"] + "/metrics").text
        return sum(
            float(line.split()[-1])
            for line in page.splitlines()
            if line.startswith("hpc_serve_gateway_replica_kv_reused_blocks_total{")
        )

    prompt = "The market opened early that morning " * 20  # several blocks of 32 tokens
    before = reused()
    served["client"].completions.create(model=NAME, prompt=prompt, max_tokens=4)
    served["client"].completions.create(model=NAME, prompt=prompt, max_tokens=4)
    assert reused() - before >= 3
