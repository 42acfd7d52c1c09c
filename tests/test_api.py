"""The Python API end to end on the local executor: submit → wait → client → cancel, and a failing spec."""

from __future__ import annotations

import pytest

from tests.e2e import processes_under, write_spec

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(300)]


def test_submit_wait_generate_stream_cancel(tritonserver, hpc_home, tmp_path, tiny_gpt2):
    from hpc.api import Job, submit

    job = submit(write_spec(tmp_path, "api", tiny_gpt2), executor="local")
    try:
        assert job.wait(timeout=120).state == "READY"
        (endpoint,) = job.endpoints()
        assert not endpoint.address.startswith("127.")
        client = job.client()
        text = client.generate("The api says", max_tokens=8)
        streamed = "".join(client.stream("The api says", max_tokens=8))
        assert text and streamed == text, (text, streamed)
        assert Job(job.job_id).status().state == "READY"  # found again from the id alone
    finally:
        final = job.cancel(grace_s=20)
    assert final.state == "CANCELLED"
    assert not processes_under(job.ref.deploy_dir)


def test_invalid_spec_raises_and_submits_nothing(hpc_home, tmp_path):
    from hpc.api import submit
    from hpc.spec import SpecError

    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "name: bad\nworkdir: runs\nmodel:\n  backend: cpu\n  checkpoint_dir: nowhere\n  workflow: engine\n  tp_sise: 2\n"
    )
    with pytest.raises(SpecError) as err:
        submit(spec, executor="local")
    assert "model.tp_sise: unknown key 'tp_sise'; did you mean 'tp_size'?" in str(err.value)
    assert not (tmp_path / "runs").exists()
    assert not (hpc_home / "jobs").exists()
