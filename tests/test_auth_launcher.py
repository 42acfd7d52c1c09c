"""`auth: token` in the launcher, against the real tritonserver (nvidia-pytriton): the leader's tritonserver is
protected and told the token through the shim only; a shim the loader ignores, or none that can be built,
fails the rank before any endpoint is published, with the reason in its record."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hpc.serving.auth import ensure_token, http_headers
from launcher.contracts import auth
from tests.test_launcher_triton import (  # noqa: F401 - launchers: the fixture that stops them
    IDENTITY,
    SERVER,
    SKIP,
    Launcher,
    launchers,
    make_deployment,
    pids_matching,
)

pytestmark = [
    pytest.mark.triton,
    pytest.mark.timeout(180),
    pytest.mark.skipif(SERVER is None, reason=f"no tritonserver: {SKIP}"),
]

BODY = json.dumps({"inputs": [{"name": "IN", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}).encode()


def _infer(port: int, headers: dict[str, str]) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/identity/infer", BODY, headers, method="POST")
    try:
        with opener.open(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _deployment(tmp_path: Path) -> tuple[Path, str]:
    dep = make_deployment(tmp_path / "dep", {"identity": IDENTITY}, auth="token")
    return dep, ensure_token(dep)


def test_the_leader_requires_the_token_and_shows_it_nowhere(tmp_path, launchers):  # noqa: F811
    dep, token = _deployment(tmp_path)
    run = Launcher(dep, "a1", HPC_SERVE_CACHE_DIR=str(tmp_path / "cache"))
    launchers.append(run)
    ep = run.endpoint()
    port = ep["http_port"]
    assert _infer(port, {}) == 403 and _infer(port, http_headers("hpcs_wrong-token-0123456789")) == 403
    assert _infer(port, http_headers(token)) == 200
    assert "checked that tritonserver refuses requests without the deployment's token" in run.err.read_text()
    shim = auth.shim_path(tmp_path / "cache" / "auth-shim")
    assert shim.is_file() and oct(shim.parent.stat().st_mode & 0o777) == "0o700"
    # neither tritonserver nor its stubs nor the launcher carry the token in their arguments or environment
    pids = pids_matching(str(dep))
    assert ep["pid"] in pids and len(pids) >= 3, "the launcher, tritonserver and its stub"
    for pid in pids:
        for name in ("cmdline", "environ"):
            assert token.encode() not in Path(f"/proc/{pid}/{name}").read_bytes(), f"{pid} {name}"
    stubs = [p for p in pids if p not in (ep["pid"], run.proc.pid)]
    for pid in stubs:  # the shim removed itself and its variables before tritonserver started them
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"LD_PRELOAD" not in environ and auth.FILE_VAR.encode() not in environ
    logs = run.out.read_bytes() + run.err.read_bytes()
    assert token.encode() not in logs


def test_a_preload_the_loader_skips_fails_the_rank_before_it_is_published(tmp_path, launchers):  # noqa: F811
    dep, _ = _deployment(tmp_path)
    shim = auth.shim_path(tmp_path / "cache" / "auth-shim")
    shim.parent.mkdir(mode=0o700)
    shim.write_text("not a shared library")  # ld.so says so and starts tritonserver without it
    run = Launcher(dep, "b1", HPC_SERVE_CACHE_DIR=str(tmp_path / "cache"))
    launchers.append(run)
    assert run.proc.wait(60) == 2, run.logs()
    assert not run.paths.endpoint(0).exists(), "an unprotected replica is never published"
    record = json.loads(run.paths.rank_record(0).read_text())
    assert "did not take effect" in record["error"] and "auth: none" in record["error"], record
    assert not pids_matching(str(dep / "triton_model_repo")), "tritonserver was stopped"


@pytest.mark.parametrize(
    ("setup", "env", "expected"),
    [
        ("no compiler", {"CC": "no-such-cc"}, "install gcc"),
        ("no token file", {}, "does not exist"),
        ("readable token file", {}, "chmod 600"),
    ],
)
def test_what_cannot_be_set_up_fails_the_rank_before_tritonserver_starts(
    tmp_path,
    launchers,  # noqa: F811
    setup,
    env,
    expected,
):
    dep, _ = _deployment(tmp_path)
    if setup == "no token file":
        (dep / "access_token").unlink()
    if setup == "readable token file":
        (dep / "access_token").chmod(0o644)
    run = Launcher(dep, "c1", HPC_SERVE_CACHE_DIR=str(tmp_path / "cache"), **env)
    launchers.append(run)
    assert run.proc.wait(60) == 2, run.logs()
    record = json.loads(run.paths.rank_record(0).read_text())
    assert expected in record["error"] and record["exit_code"] == 2, record
    assert "tritonserver" not in run.out.read_text(), "never started"
