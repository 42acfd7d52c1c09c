"""`hpc-serve bench` and `hpc-serve metrics` against the CPU engine: a local job (through the client and
through a gateway URL), and a 2-replica job on the Slurm test cluster (requests over both replicas, metrics per
replica and summed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from hpc.scheduler.index import find_job
from launcher.contracts.job_index import entry_name_of
from tests.e2e import cli, gateway_process, module_job, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def local_job(tritonserver, tiny_gpt2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    with module_job(
        folder, "bench", tiny_gpt2, executor="local", auth="none", triton={"triton_max_batch_size": 16}
    ) as (
        job,
        _,
    ):
        yield job, folder


def _bench(target: str, out: Path, *extra: str) -> dict:
    proc = cli("bench", target, "--output-dir", str(out), "--input-tokens", "24", "--output-tokens", "8", *extra)
    assert "requests/s" in proc.stdout and "TTFT p99 ms" in proc.stdout, proc.stdout
    return json.loads((out / "summary.json").read_text())


def test_bench_a_job_writes_numbers_csv_and_plots(local_job, tmp_path):
    job, _ = local_job
    summary = _bench(job, tmp_path, "--num-requests", "24", "--request-rate", "40", "--slo-ttft", "60000")
    (run,) = summary["runs"]
    assert run["completed"] == 24 and run["errors"] == {}
    assert run["output_tokens"] >= 24 and run["ttft_ms"]["p50"] <= run["latency_ms"]["p50"]
    assert run["goodput"]["good_requests"] == 24
    assert summary["settings"]["tokenizer_used"].endswith("tiny-gpt2")
    assert len((tmp_path / "requests.csv").read_text().splitlines()) == 25
    for name in ("distributions.png", "timeline.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG and (tmp_path / name).stat().st_size > 10_000


def test_bench_without_matplotlib_says_so_first_and_keeps_the_numbers(local_job, tmp_path):
    """The README's `pip install` has no matplotlib: the run is not lost to the plots' late import."""
    job, _ = local_job
    hidden = tmp_path / "no_matplotlib"
    (hidden / "matplotlib").mkdir(parents=True)
    (hidden / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    out = tmp_path / "out"
    proc = cli(
        "bench",
        job,
        "--output-dir",
        str(out),
        "--num-requests",
        "4",
        "--input-tokens",
        "8",
        "--output-tokens",
        "4",
        env={"PYTHONPATH": f"{hidden}:{os.environ.get('PYTHONPATH', '')}"},
    )
    assert "requests/s" in proc.stdout, proc.stdout
    assert "no plots: they need matplotlib" in proc.stderr
    assert json.loads((out / "summary.json").read_text())["runs"][0]["completed"] == 4
    assert (out / "requests.csv").is_file() and not list(out.glob("*.png"))
    assert f"wrote {out / 'summary.json'}" in " ".join(proc.stdout.split())


def test_bench_a_gateway_url_with_a_concurrency_sweep(local_job, tmp_path, tiny_gpt2):
    job, folder = local_job
    with gateway_process(job, tmp_path / "gateway.log") as (_, record):
        summary = _bench(
            record.url, tmp_path, "--num-requests", "12", "--sweep", "concurrency=1,4", "--tokenizer", str(tiny_gpt2)
        )
    assert [r["point"] for r in summary["runs"]] == ["rate inf, conc 1", "rate inf, conc 4"]
    assert all(r["completed"] == 12 for r in summary["runs"])
    assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG


def test_metrics_of_a_job_counts_the_requests_and_watches_rates(local_job, monkeypatch):
    job, _ = local_job
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps tables to 80 columns when not on a terminal
    cli("generate", job, "Hello", "--max-tokens", "4")
    samples = json.loads(cli("metrics", job, "--json").stdout)
    assert {s["replica"] for s in samples} == {f"{job}/0"}
    assert any(s["name"] == "nv_inference_request_success_total" and s["value"] >= 1 for s in samples)
    kinds = {
        s["labels"].get("kv_cache_block_type") for s in samples if s["name"] == "nv_trt_llm_kv_cache_block_metrics"
    }
    assert {"used", "free", "max"} <= kinds
    watched = cli("metrics", job, "--watch", "0.5", "--count", "1").stdout
    assert "req/s" in watched and "KV blocks used" in watched
    assert f"{job}/0" in watched and "total" in watched


@pytest.mark.cluster
def test_bench_and_metrics_over_two_replicas_on_the_cluster(
    slurm_cluster, tritonserver, tiny_gpt2, tmp_path, hpc_home, monkeypatch
):
    path = write_spec(tmp_path, "bench2", tiny_gpt2, nodes=2, ntasks_per_node=1, auth="none")
    data = yaml.safe_load(path.read_text())
    data["replicas"] = 2
    path.write_text(yaml.safe_dump(data))
    job = ""
    try:
        job = cli("submit", str(path)).stdout.split()[0]
        assert cli("wait", job, "--timeout", "200", timeout=240, check=False).returncode == 0
        summary = _bench("bench2", tmp_path / "out", "--num-requests", "40", "--concurrency", "8")
        assert summary["runs"][0]["completed"] == 40
        samples = json.loads(cli("metrics", "bench2", "--json").stdout)
        served = {
            s["replica"]: s["value"]
            for s in samples
            if s["name"] == "nv_inference_request_success_total" and s["labels"]["model"] == "ensemble"
        }
        name = entry_name_of(find_job(job).paths)  # a Slurm job's replicas are named by its cluster too: 33@hpcserve/0
        assert set(served) == {f"{name}/0", f"{name}/1"} and all(v >= 1 for v in served.values()), served
        assert sum(served.values()) >= 41  # the 40 and the warm-up, spread by the balancer
        monkeypatch.setenv("COLUMNS", "200")  # a terminal wide enough for the replicas' names, each one line
        table = cli("metrics", job).stdout
        assert f"{name}/0" in table and f"{name}/1" in table and "total" in table
    finally:
        if job:
            subprocess.run(["scancel", job], capture_output=True, check=False)
