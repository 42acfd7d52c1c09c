"""launch.json's one schema (launcher/contracts/plan.py): what render writes reads back as the same plan, and a plan that
lacks what every reader needs is refused naming the file and the key, never read with a made-up default."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher.contracts.config import DEFAULT_DRAIN_S, DEFAULT_READY_TIMEOUT_S
from launcher.contracts.plan import KEEP_SERVING, REQUIRED, VERSION, LaunchPlan, PlanError
from launcher.contracts.renew_plan import RenewPlan
from tests.plans import make_plan

pytestmark = pytest.mark.timeout(30)


def test_a_plan_reads_back_as_written(tmp_path: Path) -> None:
    renew = RenewPlan(before_s=900, stop_lead_s=30, time_limit_s=3600, max_jobs=3, until=2e9, drain_s=60, notice_s=7)
    plan = make_plan(
        tmp_path,
        name="rt",
        tp_size=2,
        replicas=3,
        world_size_per_replica=2,
        ports={"http": 9000, "grpc": "auto", "metrics": "auto"},
        server_args=("--log-verbose=1",),
        env={"PMIX_MCA_gds": "hash"},
        auth="token",
        gpu_binding="per-rank",
        replica_policy=KEEP_SERVING,
        stop_grace_s=5.0,
        renew=renew,
        decoupled=False,
    )
    plan.write(tmp_path / "launch.json")
    assert LaunchPlan.read(tmp_path) == plan == LaunchPlan.read(tmp_path / "launch.json")
    data = json.loads((tmp_path / "launch.json").read_text())
    assert data["version"] == VERSION and data["renew"] == renew.to_dict() and data["deployment_dir"] == str(tmp_path)
    assert LaunchPlan.from_dict(data) == plan, "without a folder: its own deployment_dir"
    assert plan.world_size == 6


def test_keys_a_plan_may_leave_out_take_their_defaults(tmp_path: Path) -> None:
    """A plan written by hand, or by an older hpc-serve: every key but the required ones has its default."""
    plan = LaunchPlan.from_dict({"model_repository": "repo", "replicas": 2, "world_size_per_replica": 1}, tmp_path)
    assert plan.model_repository == str(tmp_path / "repo"), "relative to the folder it was read from"
    assert (plan.auth, plan.gpu_binding, plan.replica_policy, plan.mode) == ("none", "none", "fail-job", "leader")
    assert plan.decoupled, "a plan without the key: the generation model streams"
    assert (plan.drain_s, plan.ready_timeout_s, plan.renew, plan.stop_grace_s) == (
        DEFAULT_DRAIN_S,
        DEFAULT_READY_TIMEOUT_S,
        None,
        None,
    )
    written = plan.to_dict()
    assert "renew" not in written and "stop_grace_s" not in written, "optional keys are written only when set"


@pytest.mark.parametrize("key", REQUIRED)
def test_a_missing_required_key_names_the_file_and_the_key(tmp_path: Path, key: str) -> None:
    """Never "1 replica of 1 rank" for a plan without its shape: the launcher and `status` would disagree."""
    data = make_plan(tmp_path, replicas=2, world_size_per_replica=2).to_dict()
    del data[key]
    (tmp_path / "launch.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match=rf"^{re.escape(str(tmp_path / 'launch.json'))}: {key} is required"):
        LaunchPlan.read(tmp_path)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"version": 2}, "version must be 1"),
        ({"replicas": "two"}, "replicas must be a number, got 'two'"),
        ({"world_size_per_replica": 0}, "world_size_per_replica must be at least 1, got 0"),
        ({"mode": "solo"}, "mode must be one of leader, orchestrator, got 'solo'"),
        ({"replica_policy": "retry"}, "replica_policy must be one of fail-job, keep-serving, restart, got 'retry'"),
        ({"renew": [60]}, "renew must be an object"),
        ({"renew": {"before_s": 60}}, "renew is malformed: stop_lead_s is required"),
    ],
)
def test_a_malformed_key_names_the_file_and_the_key(tmp_path: Path, change: dict, words: str) -> None:
    (tmp_path / "launch.json").write_text(json.dumps(make_plan(tmp_path).to_dict() | change))
    with pytest.raises(PlanError, match=f"^{re.escape(str(tmp_path / 'launch.json'))}: ") as caught:
        LaunchPlan.read(tmp_path)
    assert words in str(caught.value)


def test_a_missing_or_broken_file_is_a_plan_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="launch.json not found"):
        LaunchPlan.read(tmp_path)
    (tmp_path / "launch.json").write_text("{")
    with pytest.raises(PlanError, match="invalid JSON"):
        LaunchPlan.read(tmp_path)
    (tmp_path / "launch.json").write_text("[]")
    with pytest.raises(PlanError, match="expected a version 1 launch plan object, got list"):
        LaunchPlan.read(tmp_path)
