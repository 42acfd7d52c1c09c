"""Access control's parts that need no server: the token's life (one per deployment, 0600, kept across
resubmissions), what render writes for `auth: token` and `auth: none`, the shim's build (a private cache, a clear
error without a compiler) and what the launcher hands tritonserver. Against a real tritonserver:
tests/test_auth_launcher.py (the launcher) and tests/test_auth_e2e.py (local and Slurm jobs)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml

from hpc.render import jobfiles as R
from hpc.serving.auth import Tokens, deployment_token, ensure_deployment_token, ensure_token, grpc_headers, http_headers
from hpc.spec import SpecError, parse_spec
from launcher.contracts import auth
from launcher.contracts.layout import Deployment
from launcher.contracts.plan import LaunchPlan, PlanError


def _spec(tmp: Path, **extra):
    (tmp / "ckpt").mkdir(exist_ok=True)
    data = {
        "name": "auth-test",
        "workdir": "runs",
        "model": {"backend": "cpu", "workflow": "engine", "checkpoint_dir": "ckpt"},
        **extra,
    }
    return parse_spec(yaml.safe_dump(data), file="s.yaml", base=tmp)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_render_makes_one_token_per_deployment_and_keeps_it_across_folders(tmp_path):
    spec = _spec(tmp_path)
    assert spec.auth == "token", "the default"
    first = R.render(spec, spec.workdir / "auth-test-1").deploy_dir
    token = Deployment(first).token.read_text().strip()
    assert _mode(Deployment(first).token) == 0o600 and token.startswith("hpcs_") and len(token) > 40
    assert json.loads(Deployment(first).launch.read_text())["auth"] == "token"
    # a resubmission's folder gets the deployment's token; re-rendering a folder keeps its own
    second = R.render(spec, spec.workdir / "auth-test-2").deploy_dir
    assert Deployment(second).token.read_text().strip() == token and _mode(Deployment(second).token) == 0o600
    R.render(spec, second)
    assert Deployment(second).token.read_text().strip() == token
    # another deployment in the same workdir has its own
    other = R.render(_spec(tmp_path, name="auth-other"), spec.workdir / "auth-other-1").deploy_dir
    assert Deployment(other).token.read_text().strip() != token
    # the token is in no other file of the folder (scripts, launch.json, spec.yaml, the shipped code)
    for folder in (first, second):
        leaks = [p for p in folder.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        assert leaks == [Deployment(folder).token]
    assert deployment_token([first, second]) == token


def test_the_newest_token_is_inherited_and_a_made_one_is_never_replaced(tmp_path):
    old, new, fresh = (tmp_path / n for n in ("d-1", "d-2", "d-3"))
    for folder in (old, new, fresh):
        folder.mkdir()
    (old / "access_token").write_text("hpcs_old-token-0123456789\n")
    (new / "access_token").write_text("hpcs_new-token-0123456789\n")
    assert ensure_token(fresh, [old, new, fresh]) == "hpcs_new-token-0123456789"
    assert ensure_token(fresh, [old]) == "hpcs_new-token-0123456789", "a folder's token stays its own"
    (tmp_path / "elsewhere").mkdir()
    assert ensure_deployment_token(tmp_path / "elsewhere", tmp_path, "nothing-here").startswith("hpcs_")


def test_auth_none_makes_no_token_and_token_says_so(tmp_path):
    spec = _spec(tmp_path, auth="none")
    d = R.render(spec, spec.workdir / "auth-test-1").deploy_dir
    assert not Deployment(d).token.exists()
    assert json.loads(Deployment(d).launch.read_text())["auth"] == "none"
    assert deployment_token([d]) is None
    with pytest.raises(SpecError) as exc:
        _spec(tmp_path, auth="tokens")
    assert "auth" in str(exc.value) and "'token' or 'none'" in str(exc.value)


def test_headers_each_job_its_folders_token(tmp_path):
    for name, token in (("d-1", "hpcs_first-0123456789ab"), ("d-2", "hpcs_second-0123456789a")):
        (tmp_path / name / "jobs" / f"job-{name}").mkdir(parents=True)
        (tmp_path / name / "access_token").write_text(token)
    tokens = Tokens.of_folders([tmp_path / "d-1", tmp_path / "d-2"])
    assert tokens.for_job("job-d-1") == "hpcs_first-0123456789ab"
    assert tokens.for_job("job-d-2") == tokens.for_job("unknown") == tokens.newest == "hpcs_second-0123456789a"
    assert http_headers("t") == {"authorization": "Bearer t"} and http_headers(None) == {}
    assert grpc_headers("t") == {"triton-grpc-protocol-authorization": "Bearer t"} and grpc_headers(None) == {}


def test_launch_json_auth_is_checked(tmp_path):
    plan = {"version": 1, "model_repository": "repo", "replicas": 1, "world_size_per_replica": 1}
    (tmp_path / "launch.json").write_text(json.dumps(plan))
    assert LaunchPlan.read(tmp_path).auth == "none", "a plan without the key (hand-written, older) serves without"
    (tmp_path / "launch.json").write_text(json.dumps(plan | {"auth": "yes"}))
    with pytest.raises(PlanError, match="auth must be one of token, none"):
        LaunchPlan.read(tmp_path)


def test_the_launcher_refuses_a_token_file_others_may_read_or_a_bad_token(tmp_path):
    path = tmp_path / "access_token"
    with pytest.raises(auth.AuthSetupError, match="does not exist.*auth: none"):
        auth.read_token(path)
    path.write_text("hpcs_abcdefghijklmnopqrstuvwxyz\n")
    path.chmod(0o644)
    with pytest.raises(auth.AuthSetupError, match="chmod 600"):
        auth.read_token(path)
    path.chmod(0o600)
    assert auth.read_token(path) == "hpcs_abcdefghijklmnopqrstuvwxyz"
    for bad in ("short", "has space inside the token", "colon:and=equals-0123456789"):
        path.write_text(bad)
        with pytest.raises(auth.AuthSetupError, match="A-Z a-z 0-9"):
            auth.read_token(path)


@pytest.mark.slow
def test_the_shim_is_built_once_into_a_private_folder(tmp_path):
    root = auth.cache_root(tmp_path / "cache")
    assert _mode(root) == 0o700
    built = auth.build_shim(root)
    assert built == auth.shim_path(root) and built.is_file() and _mode(built.parent) == 0o700
    mtime = built.stat().st_mtime_ns
    assert auth.build_shim(root, {"PATH": "/nonexistent"}) == built, "cached: no compiler needed again"
    assert built.stat().st_mtime_ns == mtime
    (tmp_path / "shared").mkdir(mode=0o777)
    (tmp_path / "shared").chmod(0o777)
    with pytest.raises(auth.AuthSetupError, match="not a private folder"):
        auth.private_dir(tmp_path / "shared")


def test_no_compiler_is_a_clear_error(tmp_path):
    with pytest.raises(auth.AuthSetupError) as exc:
        auth.build_shim(auth.cache_root(tmp_path), {"PATH": str(tmp_path), "CC": "no-such-cc"})
    assert "no `no-such-cc` on PATH" in str(exc.value) and "install gcc" in str(exc.value)
    assert "auth: none" in str(exc.value)
    (tmp_path / "broken-cc").write_text("#!/bin/sh\necho 'cc: internal error' >&2\nexit 1\n")
    (tmp_path / "broken-cc").chmod(0o755)
    with pytest.raises(auth.AuthSetupError, match="(?s)could not build.*internal error.*auth: none"):
        auth.build_shim(auth.cache_root(tmp_path), {"PATH": str(tmp_path), "CC": "broken-cc"})


def test_tritonserver_gets_the_file_and_the_flags_never_the_token(tmp_path):
    guard = auth.Guard(tmp_path / "access_token", tmp_path / "shim.so")
    env = guard.env({"LD_PRELOAD": "/opt/site/libfoo.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == f"{tmp_path / 'shim.so'}:/opt/site/libfoo.so" and env["PATH"] == "/bin"
    assert env[auth.FILE_VAR] == str(tmp_path / "access_token")
    apis = "inference,model-repository,model-config,shared-memory,statistics,trace,logging"
    assert env[auth.FLAGS_VAR].splitlines() == [
        f"--http-restricted-api={apis}:authorization=Bearer ",
        f"--grpc-restricted-protocol={apis}:authorization=Bearer ",
    ]
    assert guard.env({})["LD_PRELOAD"] == str(tmp_path / "shim.so")
