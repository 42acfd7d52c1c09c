"""The simulated engine (model.backend: sim) served end to end on this machine: a local job (the real CLI, the
real tritonserver, the stand-in's leader node running the simulated engine) answering a completion with real
text, whole and streamed. The cluster's tp 2 across node1/node2 through the gateway: tests/test_sim_cluster.py."""

from __future__ import annotations

import pytest

from tests._sim import sim_spec
from tests.e2e import cli, processes_under, submit, wait_for

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_local_sim_job_answers_with_real_text_whole_and_streamed(tmp_path, local_jobs):
    spec = sim_spec(tmp_path, "sim-local")
    job, job_dir = submit(spec, "--executor", "local", timeout=240)
    deploy_dir = job_dir.parent.parent
    local_jobs.append((job, deploy_dir))
    assert (tmp_path / "sim-llama" / "config.json").is_file(), "submit made the checkpoint (model.init)"
    assert not list((tmp_path / "sim-llama").glob("*.safetensors")), "and no weights"

    whole = cli("generate", job, "Once upon a time", "--max-tokens", "16", "--seed", "3").stdout.strip()
    streamed = cli("generate", job, "Once upon a time", "--max-tokens", "16", "--seed", "3", "--stream").stdout
    assert len(whole.split()) >= 5 and "\ufffd" not in whole, whole
    assert streamed.strip() == whole, "the same seed and prompt: the same text, whole or streamed"
    other = cli("generate", job, "Once upon a time", "--max-tokens", "16", "--seed", "4").stdout.strip()
    assert other != whole, "another seed reads elsewhere"

    out = cli("cancel", job, timeout=120).stdout
    assert out.startswith(f"{job} CANCELLED"), out
    wait_for(lambda: not processes_under(deploy_dir), 60, f"every process of {deploy_dir} to exit")
