"""Shared fixtures: an isolated job index, a tiny checkpoint, the real Slurm test cluster and the jobs a test
submitted to it (or started on this machine); a gateway in front of a local job, for the test modules of the gateway
end to end.

A missing cluster or tritonserver fails on CI and skips elsewhere (tests/_env.py).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._env import unavailable as _unavailable

# pytest keeps the assertion-rewritten test modules as bytecode only where writing bytecode is on; with
# PYTHONDONTWRITEBYTECODE=1 (set on some machines) it rewrites all ~100 again on every run, most of the unit
# tier's collection (docs/decisions.md "The test command's two pytests"). The cache is pytest's own, under
# tests/__pycache__.
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _no_site_profile(monkeypatch) -> None:
    """No test sees this machine's site profile (~/.config or /etc/hpc-serve/site.yaml): $HPC_SERVE_SITE set but
    empty means none, for the test and every command it runs. tests/test_site.py names its own."""
    monkeypatch.setenv("HPC_SERVE_SITE", "")


@pytest.fixture
def hpc_home(tmp_path, monkeypatch) -> Path:
    """A private job index, so tests never see (or touch) the user's jobs."""
    home = tmp_path / "hpc-home"
    monkeypatch.setenv("HPC_SERVE_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def shared_tmp(tmp_path_factory) -> Path:
    """A folder every emulated node sees (they are one machine), kept for the session."""
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="session")
def tiny_gpt2(shared_tmp) -> Path:
    from backend.cpu_engine.init_model import create_checkpoint

    return Path(create_checkpoint(shared_tmp / "tiny-gpt2", family="gpt2", size="tiny", seed=0))


@pytest.fixture(scope="session")
def tritonserver() -> str:
    """Skip (or fail on CI) when no tritonserver can be found the way the launcher finds one."""
    try:
        from launcher.node.server import resolve as resolve_server
    except ImportError as exc:  # pragma: no cover - the launcher is part of the package
        pytest.fail(f"launcher.node.server: {exc}")
    try:
        resolved = resolve_server(None)
    except Exception as exc:  # noqa: BLE001 - the launcher's own message says what was tried
        _unavailable(f"no tritonserver: {exc}")
    return resolved.argv0


@pytest.fixture(scope="session")
def slurm_cluster() -> dict:
    """The one-machine test cluster of ci/cluster/up.sh, up and with both nodes idle."""
    if not shutil.which("sinfo"):
        _unavailable("Slurm is not installed (bash ci/cluster/up.sh)")
    if subprocess.run(["scontrol", "ping"], capture_output=True, text=True).returncode != 0:
        _unavailable("the Slurm test cluster is not up (bash ci/cluster/up.sh)")
    env = {"OMPI_MCA_btl": "self,tcp", "PMIX_MCA_gds": "hash"}
    return {"nodes": ["node1", "node2"], "partition": "debug", "env": env}


@pytest.fixture
def jobs(slurm_cluster, hpc_home, tritonserver) -> Iterator[list[str]]:
    """Slurm job ids a test started (it appends them); whatever the outcome, they are scancel'ed at the end.
    tests/test_e2e_replicas_cluster.py has a `jobs` of its own: jobs shared by the module."""
    started: list[str] = []
    yield started
    for job in started:
        subprocess.run(["scancel", job], capture_output=True)


@pytest.fixture
def local_jobs(hpc_home, tritonserver) -> Iterator[list[tuple[str, Path]]]:
    """(job id, deployment folder) of each local job a test started (it appends them); whatever the outcome,
    nothing of theirs survives the test."""
    from tests.e2e import kill_local_jobs

    started: list[tuple[str, Path]] = []
    yield started
    kill_local_jobs(started)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, tiny_gpt2, tritonserver) -> Iterator[dict]:
    """A READY local job, its token, and `hpc-serve gateway` on it (a process of its own), for one test module:
    {"url", "token", "job", "model", "spec", "log"}; "jobs": what local_jobs kills at the end (a test adds its
    own). A module that counts engine steps names `paced_gateway` its `gateway`."""
    with gateway_on_a_job(tmp_path_factory, tiny_gpt2) as started:
        yield started


@pytest.fixture(scope="module")
def paced_gateway(tmp_path_factory, tiny_gpt2, tritonserver) -> Iterator[dict]:
    """`gateway`, its engine at a GPU's pace: for a module that counts engine steps (it names it `gateway`)."""
    with gateway_on_a_job(tmp_path_factory, tiny_gpt2, paced=True) as started:
        yield started


@contextlib.contextmanager
def gateway_on_a_job(
    tmp_path_factory, checkpoint: Path, paced: bool = False, workflow: str = "engine"
) -> Iterator[dict]:
    """The `gateway` fixture's job and gateway; `paced`: the job's engine steps at a GPU's pace (tests/steps.py
    `GPU_PACE_MS`); `workflow`: the spec's (llmapi: hpc-serve's llmapi model over the CPU stand-in)."""
    from tests.e2e import cli, gateway_on_port, local_jobs, write_spec
    from tests.steps import GPU_PACE_MS

    folder = tmp_path_factory.mktemp("gateway")
    triton = {"parameters": {"min_step_ms": GPU_PACE_MS}} if paced else None
    spec = write_spec(folder, "gw", checkpoint, tp=1, triton=triton, workflow=workflow)
    with local_jobs(folder, spec, 1) as jobs:
        ((job, _),) = jobs
        token = cli("token", job).stdout.strip()
        assert cli("token", job).stdout.strip() == token, "the same token every time"
        log = folder / "gateway.log"
        with gateway_on_port(job, log) as url:
            yield {"url": url, "token": token, "job": job, "model": "gw", "spec": spec, "jobs": jobs, "log": log}


@pytest.fixture
def client(gateway):
    """An `openai` client of the module's gateway, with its token, that does not retry."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=gateway["url"] + "/v1", api_key=gateway["token"], max_retries=0)


@pytest.fixture(scope="module")
def serve_app(gateway) -> Iterator[Callable[..., str]]:
    """`start(target_text, **create_app options)` → the URL of a gateway running in this process (uvicorn in a
    thread: its access log is this process's, and it takes options the module's CLI gateway was not given)."""
    import threading

    import uvicorn

    from hpc.gateway.app import create_app
    from hpc.serving.deployment import resolve_target
    from tests.e2e import free_port, gateway_ready, wait_for

    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(target: str, **options) -> str:
        port = free_port()
        app = create_app(resolve_target(target), **({"refresh_s": 1} | options))
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: gateway_ready(url), 30, "the in-process gateway to find a replica")
        return url

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(15)
