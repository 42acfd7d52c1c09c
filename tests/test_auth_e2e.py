"""`auth: token` end to end, on a local job and on a tp 2 Slurm job across node1/node2: without the deployment's
token (or with a wrong one) tritonserver refuses every restricted API over HTTP and gRPC, with it everything is
served, health stays open; the token is in no file of the deployment folder but its own, in no log, in no
process's arguments or environment. And `auth: none` serves anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
from collections import Counter
from pathlib import Path

import pytest

from hpc.serving.auth import grpc_headers, http_headers
from launcher.contracts.layout import Deployment
from tests.e2e import cli, core_model_stream, gateway_process, job_token, module_job, processes_under, status

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(400)]

WRONG = "hpcs_not-the-token-0123456789"
#: a request of each restricted API group (inference, model-repository, model-config, statistics, logging,
#: trace, shared-memory), as curl would send it
RESTRICTED = [
    ("POST", "/v2/models/ensemble/generate", {"text_input": "Once upon a time", "max_tokens": 4}),
    ("POST", "/v2/models/ensemble/generate_stream", {"text_input": "Once upon a time", "max_tokens": 4}),
    ("POST", "/v2/repository/index", {}),
    ("GET", "/v2/models/ensemble/config", None),
    ("GET", "/v2/models/stats", None),
    ("GET", "/v2/logging", None),
    ("GET", "/v2/trace/setting", None),
    ("GET", "/v2/systemsharedmemory/status", None),
]


@pytest.fixture(scope="module", params=["local", "cluster"])
def served(request, tritonserver, tiny_gpt2, tmp_path_factory):
    """(job id, endpoint record, deployment folder) of a READY job with the default `auth: token`: one tp 1 job
    of the local executor, one tp 2 job across the test cluster's two nodes."""
    if request.param == "cluster":
        request.getfixturevalue("slurm_cluster")
        spec = dict(tp=2, nodes=2, ntasks_per_node=1)
    else:
        spec = dict(executor="local")
    name = f"auth-{request.param}"
    with module_job(tmp_path_factory.mktemp(name), name, tiny_gpt2, **spec) as (job, endpoint):
        yield job, endpoint, Path(status(job)["job_dir"]).parent.parent


def _http(endpoint: dict, method: str, path: str, body: dict | None, headers: dict[str, str]) -> tuple[int, str]:
    conn = http.client.HTTPConnection(endpoint["address"], endpoint["http_port"], timeout=60)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, data, {"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def test_http_refuses_every_restricted_api_without_the_right_token(served):
    job, endpoint, _ = served
    token = job_token(job)
    assert token
    for method, path, body in RESTRICTED:
        for headers in ({}, http_headers(WRONG), {"authorization": token}):  # the last: no "Bearer"
            code, text = _http(endpoint, method, path, body, headers)
            assert code == 403 and "restricted" in text, (method, path, headers, code, text)
        code, text = _http(endpoint, method, path, body, http_headers(token))
        assert code == 200, (method, path, code, text)
    for path in ("/v2/health/ready", "/v2/health/live"):
        assert _http(endpoint, "GET", path, None, {})[0] == 200, f"{path}: a probe needs no token"


def test_grpc_refuses_without_the_right_token(served):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    job, endpoint, _ = served
    token = job_token(job)
    client = grpcclient.InferenceServerClient(f"{endpoint['address']}:{endpoint['grpc_port']}")
    try:
        assert client.is_server_ready(), "health needs no token"
        for headers in (None, grpc_headers(WRONG), http_headers(token)):  # HTTP's header name is not gRPC's
            for call, args in (
                (client.get_model_config, ("ensemble",)),
                (client.get_model_repository_index, ()),
                (client.get_inference_statistics, ()),
            ):
                with pytest.raises(InferenceServerException, match="restricted"):
                    call(*args, headers=headers)
        assert client.get_model_config("ensemble", headers=grpc_headers(token)).config.name == "ensemble"
    finally:
        client.close()
    # inference over the streaming API, as clients of the core model call it
    for headers in ({}, grpc_headers(WRONG)):
        pieces, error = core_model_stream(endpoint, [5, 6, 7], 4, headers=headers)
        assert not pieces and error and "restricted" in error, error
    pieces, error = core_model_stream(endpoint, [5, 6, 7], 4)  # the job's token, as every client sends it
    assert error is None and pieces


def test_the_gateways_engine_tells_a_refused_token_from_a_broken_replica_under_concurrency(served):
    """A stream that tritonserver refuses while the client is still sending often reaches grpc's asyncio client
    as INTERNAL "Internal error from Core" (its status lost: 193 of 300 did before the engine checked): each of
    these concurrent refusals must still read as TokenRefused (the gateway's 502, replica not benched), never as
    ReplicaUnavailable, and the right token is served alongside."""
    from hpc.serving.model_io import GenerateParams
    from hpc.serving.triton import ReplicaUnavailable, TokenRefused, TritonEngine

    job, endpoint, _ = served
    url, token = f"{endpoint['address']}:{endpoint['grpc_port']}", job_token(job)
    params = GenerateParams(prompt="Once upon a time", max_tokens=2)

    async def one(engine: TritonEngine, key: str | None) -> str:
        try:
            return "served" if [c async for c in engine.stream(url, params, key)] else "empty"
        except (TokenRefused, ReplicaUnavailable) as exc:
            return type(exc).__name__

    async def many() -> Counter[str]:
        engine = TritonEngine()
        try:
            wrong = await asyncio.gather(*(one(engine, WRONG) for _ in range(60)))
            right = await asyncio.gather(*(one(engine, token) for _ in range(4)))
            return Counter(wrong) + Counter(f"right {r}" for r in right)
        finally:
            await engine.close()

    assert asyncio.run(many()) == Counter({"TokenRefused": 60, "right served": 4})


def test_the_clients_send_it_and_token_prints_it(served):
    job, _, deploy_dir = served
    assert cli("generate", job, "Once upon a time", "--max-tokens", "4").stdout.strip()
    assert cli("token", job).stdout.strip() == job_token(job)
    assert cli("token", str(deploy_dir / "spec.yaml")).stdout.strip() == job_token(job)


def test_bench_of_a_gateway_url_names_the_token_flag_and_runs_with_it(served, tmp_path):
    """docs/bench-and-metrics.md's `hpc-serve bench http://…` under the default `auth: token`: without --token a
    usage error that names the flag and where the token comes from; with it, the run."""
    job, _, _ = served
    with gateway_process(job, tmp_path / "gateway.log") as (_, record):
        small = ("--num-requests", "2", "--input-tokens", "16", "--input-stdev", "0", "--output-tokens", "2")
        proc = cli("bench", record.url, *small, check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "asks for its deployment's access token: pass --token" in proc.stderr
        assert "hpc-serve token NAME" in proc.stderr and "Traceback" not in proc.stderr
        token = cli("token", job).stdout.strip()
        ran = cli("bench", record.url, "--token", token, *small)
        assert "requests/s" in ran.stdout


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{todo.pop()}/task").iterdir():
                children = (task / "children").read_text().split()
                todo += [int(c) for c in children if int(c) not in found]
                found |= {int(c) for c in children}
    return found


def test_the_token_is_in_no_file_log_argument_or_environment(served):
    job, endpoint, deploy_dir = served
    token = job_token(job)
    assert token
    token_file = Deployment(deploy_dir).token
    assert token_file.stat().st_mode & 0o777 == 0o600
    cli("generate", job, "Once upon a time", "--max-tokens", "4")  # something in the logs after a request
    files = [p for p in deploy_dir.rglob("*") if p.is_file()]
    assert any(p.suffix in (".out", ".err") for p in files), "the rank logs are among the files read"
    assert [p for p in files if token.encode() in p.read_bytes()] == [token_file]
    pids = {pid for pid, _ in processes_under(deploy_dir)} | _descendants(endpoint["pid"]) | {endpoint["pid"]}
    assert len(pids) >= 4, "launchers, tritonservers and their stubs"
    for pid in pids:
        for name in ("cmdline", "environ"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                assert token.encode() not in Path(f"/proc/{pid}/{name}").read_bytes(), (pid, name)
    assert token not in json.dumps(status(job)) and token not in cli("endpoints", job, "--format", "env").stdout


def test_auth_none_serves_anyone(tritonserver, tiny_gpt2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("auth-none")
    with module_job(folder, "auth-none", tiny_gpt2, executor="local", auth="none") as (job, endpoint):
        deploy_dir = Path(status(job)["job_dir"]).parent.parent
        assert not Deployment(deploy_dir).token.exists()
        for method, path, body in RESTRICTED[:4]:
            code, text = _http(endpoint, method, path, body, {})
            assert code == 200, (path, code, text)
        pieces, error = core_model_stream(endpoint, [5, 6, 7], 4)
        assert error is None and pieces
        answered = cli("token", job, check=False)  # an answer (exit 0, no token), not an error: docs/cli.md
        assert answered.returncode == 0 and answered.stdout == "" and "auth: none" in answered.stderr
