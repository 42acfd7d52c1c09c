"""Benchmark clients through the gateway, unchanged: the real aiperf (`aiperf profile --endpoint-type chat
--streaming`, NVIDIA's benchmark tool) against a gateway in front of a local job of each workflow, with 0 errors
in aiperf's own export; and the request bodies genai-perf and vLLM's `benchmark_serving` build, replayed as they
build them, answered in full (their bodies field by field: tests/test_gateway_client_shapes.py).

aiperf is run from a virtual environment of its own: its pins (pyzmq 26.4, orjson 3.11, prometheus_client 0.23,
rich 14.1, ...) would replace what this package is tested with, so it is no test extra. The environment is the
one `$HPC_SERVE_AIPERF` names (the `aiperf` program), else `aiperf` on PATH, else one installed from PyPI
(`pip install aiperf==AIPERF_VERSION`) into pytest's cache folder once (`.pytest_cache`, kept between runs);
where that install fails (no index reachable) the aiperf test is skipped, saying so (on CI it fails: tests/_env.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests._env import unavailable

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(600)]

#: the aiperf release this test was written against (its CLI flags and its export's keys)
AIPERF_VERSION = "0.13.0"
#: the variable naming an installed `aiperf` program to use instead
AIPERF_VAR = "HPC_SERVE_AIPERF"
#: aiperf's summary export in its artifact folder (aiperf/orchestrator/local_executor.py's default name)
EXPORT_NAME = "profile_export_aiperf.json"
#: its per-request records beside it (one JSON line each, with "error" for a failed request)
RECORDS_NAME = "profile_export.jsonl"
#: the most the install of aiperf from PyPI may take before the test is skipped (about 70 packages: measured 2 and
#: 9 minutes here, the longer beside other tests); the aiperf test's own limit leaves room for it
INSTALL_LIMIT_S = 1200
REQUESTS, CONCURRENCY, INPUT_TOKENS, OUTPUT_TOKENS = 8, 2, 16, 8
#: what the export must say: every request sent completed, none failed (aiperf's metric names; an average each)
COUNTS = {
    "request_count": REQUESTS,
    "completed_request_count": REQUESTS,
    "error_request_count": None,
    "request_error_rate": 0.0,
}


@pytest.fixture(scope="session")
def aiperf(request, tmp_path_factory) -> str:
    """The `aiperf` program to run (module docstring says which)."""
    named = os.environ.get(AIPERF_VAR)
    if named:
        assert Path(named).is_file(), f"${AIPERF_VAR}={named}: no such program"
        return named
    on_path = shutil.which("aiperf")
    if on_path:
        return on_path
    if sys.version_info < (3, 11):
        unavailable(f"aiperf {AIPERF_VERSION} needs Python 3.11 or later (set ${AIPERF_VAR} to an installed one)")
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider: this session's folder then
    name = f"aiperf-{AIPERF_VERSION}"
    folder = Path(cache.mkdir(name)) if cache is not None else tmp_path_factory.mktemp(name)
    program, done = folder / "bin" / "aiperf", folder / "installed"
    if not done.exists():
        venv.create(folder, with_pip=True, clear=True)
        why = _install(folder)
        if why:
            unavailable(
                f"aiperf {AIPERF_VERSION} did not install from the package index into {folder} (set ${AIPERF_VAR} "
                f"to an installed aiperf): {why}"
            )
        done.touch()
    return str(program)


def _install(folder: Path) -> str:
    """Install aiperf into the virtual environment `folder`: "" once done, else why not."""
    command = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", f"aiperf=={AIPERF_VERSION}"]
    try:
        install = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_LIMIT_S)
    except subprocess.TimeoutExpired:
        return f"pip was still installing after {INSTALL_LIMIT_S} s"
    return "" if install.returncode == 0 else install.stderr.strip()[-600:]


@pytest.fixture(scope="module", params=["llmapi", "engine"])
def workflow_gateway(request, tmp_path_factory, tiny_gpt2, tritonserver) -> Iterator[dict]:
    """A READY local job of the workflow and `hpc-serve gateway` on it (tests/conftest.py `gateway_on_a_job`)."""
    from tests.conftest import gateway_on_a_job

    with gateway_on_a_job(tmp_path_factory, tiny_gpt2, workflow=request.param) as started:
        yield started | {"workflow": request.param}


@pytest.mark.timeout(INSTALL_LIMIT_S + 600)  # the first run may install aiperf (the `aiperf` fixture)
def test_aiperf_streaming_chat_completes_with_no_errors(aiperf, workflow_gateway, tiny_gpt2, tmp_path):
    gw = workflow_gateway
    artifacts = tmp_path / "aiperf"
    command = [
        aiperf,
        "profile",
        "--model",
        gw["model"],
        "--url",
        gw["url"],
        "--endpoint-type",
        "chat",
        "--streaming",
        "--api-key",
        gw["token"],
        "--tokenizer",
        str(tiny_gpt2),
        "--request-count",
        str(REQUESTS),
        "--concurrency",
        str(CONCURRENCY),
        "--isl",
        str(INPUT_TOKENS),
        "--isl-stddev",
        "0",
        "--osl",
        str(OUTPUT_TOKENS),
        "--osl-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--random-seed",
        "0",
        "--ui-type",
        "none",
        "--workers-max",
        "2",
        "--record-processors",
        "1",
        "--artifact-dir",
        str(artifacts),
    ]
    # the tokenizer is a folder: aiperf loads it as a path (its HF_HUB_OFFLINE mode wants a hub cache instead)
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=480)
    said = f"aiperf exited {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    exports = sorted(artifacts.rglob(EXPORT_NAME))
    assert run.returncode == 0 and exports, said
    summary = json.loads(exports[0].read_text())
    counts = {name: _average(summary.get(name)) for name in COUNTS}
    # aiperf leaves a count of 0 out of its export (error_request_count with no error): None is 0 there
    assert counts == COUNTS, (counts, summary.get("error_summary"), said)
    assert summary["error_summary"] == [] and summary["was_cancelled"] is False, summary["error_summary"]
    records = [json.loads(line) for line in exports[0].with_name(RECORDS_NAME).read_text().splitlines()]
    assert len(records) == REQUESTS and not [r["error"] for r in records if r.get("error")]
    # ignore_eos reached the model: every answer was the length asked for, by the usage the gateway sent (aiperf's
    # own count re-tokenizes the random model's text, which comes to other lengths)
    assert _average(summary["usage_completion_tokens"]) == OUTPUT_TOKENS, summary["usage_completion_tokens"]


def _average(metric: object) -> float | None:
    """A metric of aiperf's export: {"unit", "avg", ...} (a count's avg is the count)."""
    return metric.get("avg") if isinstance(metric, dict) else None  # type: ignore[return-value]


def test_genai_perf_and_vllm_benchmark_bodies_are_answered_in_full(workflow_gateway):
    """genai-perf's chat body and vLLM's `bench serve` completions and chat bodies (as they build them:
    tests/test_gateway_client_shapes.py), streamed as those tools read them: every one 200, `[DONE]` last, each
    generation ended at its length (`ignore_eos`), and the usage, where asked, says that length."""
    from tests.test_gateway_client_shapes import BENCHMARK_BODIES

    gw = workflow_gateway
    headers = {"Authorization": f"Bearer {gw['token']}"}
    with httpx.Client(base_url=gw["url"], headers=headers, timeout=120, trust_env=False) as http:
        for name, (path, body) in BENCHMARK_BODIES.items():
            body = {**body, "model": gw["model"]}
            with http.stream("POST", path, json=body) as response:
                lines = [line for line in response.iter_lines() if line.startswith("data: ")]
                assert response.status_code == 200, (name, response.read())
            assert lines[-1] == "data: [DONE]", (name, lines[-3:])
            events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
            ends = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
            assert ends == (["length"] if body.get("ignore_eos") else ends[:1]) and ends[0] in ("length", "stop")
            asked = body.get("max_tokens", body.get("max_completion_tokens"))
            usage = [e["usage"]["completion_tokens"] for e in events if e.get("usage")]
            assert usage == ([asked] if body.get("stream_options") else []), (name, usage)


def test_the_engine_extensions_reach_each_workflows_model_and_act(workflow_gateway):
    """Through the gateway onto the CPU engine: `seed` makes sampling repeatable (the same seed, the same text) and
    seeds differ; `top_k` 1 is the greedy answer; `length_penalty` is taken and changes nothing on one beam;
    `repetition_penalty` changes the greedy text (the tiny model repeats itself); `ignore_eos` and `min_tokens`
    make the length asked for."""
    gw = workflow_gateway
    headers = {"Authorization": f"Bearer {gw['token']}"}
    with httpx.Client(base_url=gw["url"], headers=headers, timeout=120, trust_env=False) as http:

        def answer(**fields: object) -> dict:
            body = {"model": gw["model"], "prompt": "Once upon a time", "max_tokens": 12, **fields}
            response = http.post("/v1/completions", json=body)
            assert response.status_code == 200, (fields, response.text)
            return response.json()["choices"][0]

        def text(**fields: object) -> str:
            return answer(**fields)["text"]

        sampled = {seed: text(temperature=1.0, seed=seed, ignore_eos=True) for seed in (1, 2, 3)}
        assert text(temperature=1.0, seed=1, ignore_eos=True) == sampled[1], "the same seed: the same text"
        assert len(set(sampled.values())) > 1, sampled
        greedy = text(temperature=0.0, ignore_eos=True)
        assert text(temperature=1.0, top_k=1, seed=5, ignore_eos=True) == greedy
        assert text(temperature=0.0, ignore_eos=True, length_penalty=0.5) == greedy
        penalized = text(temperature=0.0, ignore_eos=True, repetition_penalty=1.8)
        assert penalized != greedy and penalized == text(temperature=0.0, ignore_eos=True, repetition_penalty=1.8)
        assert answer(temperature=0.0, min_tokens=12)["finish_reason"] == "length"
        assert answer(temperature=0.0, ignore_eos=True)["finish_reason"] == "length"
