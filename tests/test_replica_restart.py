"""replica_policy restart without Slurm: the spec's `restart:` section, the `.sub` it renders (sound shell, its
bounds and record format from the one place that types them), and what `status` says of a job whose replica was
restarted, is restarting, or was given up on, from the records the `.sub` writes. The cluster runs it for real:
tests/test_e2e_restart_cluster.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from hpc.jobs.status import JobStatus
from hpc.render.jobfiles import render
from hpc.spec import SpecError, load_spec
from launcher.contracts.records import GAVE_UP, RESTARTING, EndpointRecord, RankExitRecord, ReplicaRestart
from tests._golden import check_script

pytestmark = pytest.mark.slow


@pytest.fixture
def ckpt(tiny_gpt2) -> Path:
    return tiny_gpt2


def _spec(tmp_path: Path, ckpt: Path, **top: object) -> Path:
    spec = {
        "name": "rs",
        "workdir": str(tmp_path / "runs"),
        "model": {"backend": "cpu", "checkpoint_dir": str(ckpt), "tp_size": 2},
        "replicas": 2,
        "slurm": {"nodes": 2, "ntasks_per_node": 2},
        **top,
    }
    path = tmp_path / "rs.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_restart_bounds_need_the_restart_policy_and_durations(tmp_path, ckpt):
    with pytest.raises(SpecError, match="restart: bounds replica_policy restart, but replica_policy is fail-job"):
        load_spec(_spec(tmp_path, ckpt, restart={"max_restarts": 2}))
    with pytest.raises(SpecError, match="is not a duration"):
        load_spec(_spec(tmp_path, ckpt, replica_policy="restart", restart={"backoff": "soon"}))
    with pytest.raises(SpecError, match="max_restarts"):
        load_spec(_spec(tmp_path, ckpt, replica_policy="restart", restart={"max_restarts": 0}))
    spec = load_spec(_spec(tmp_path, ckpt, replica_policy="restart"))
    assert (spec.restart_bounds.max_restarts, spec.restart_bounds.backoff_s, spec.restart_bounds.reset_after_s) == (
        3,
        10,
        600,
    )


def test_the_sub_restarts_with_the_specs_bounds_and_is_sound_shell(tmp_path, ckpt):
    spec = load_spec(_spec(tmp_path, ckpt, replica_policy="restart", restart={"max_restarts": 5, "backoff": "2s"}))
    rendered = render(spec, tmp_path / "deploy")
    sub = rendered.sub.read_text()
    check_script(rendered.sub)
    assert '[ "$count" -gt 5 ]' in sub and "delay=2\n" in sub
    assert ReplicaRestart.shell(5).replace("\\n", "") in sub.replace("\\n", ""), "the record's format, typed once"
    assert 'ranks="2 3"' in sub, "replica 1's ranks, whose records move aside before it starts again"
    plain = render(load_spec(_spec(tmp_path, ckpt)), tmp_path / "plain")
    text = plain.sub.read_text()
    assert 'if [ "$crash" -eq 0 ]; then return 1; fi' in text, "fail-job restarts a start crash only"
    assert '[ "$count" -gt 1 ]' in text and ".start_crash" in text
    check_script(plain.sub)


def test_status_tells_each_restarted_replicas_story():
    now = time.time()
    cause = RankExitRecord(rank=2, host="node2", exit_code=-9, signal="SIGKILL", ended_at=now - 30)
    endpoint = EndpointRecord(replica=1, rank=2, address="n", http_port=1, restarts=1)
    status = JobStatus(
        "7",
        "READY",
        endpoints=[endpoint],
        replicas=2,
        replica_restarts={
            1: ReplicaRestart(
                replica=1,
                restarts=1,
                exit_status=137,
                ended_at=now - 30,
                restart_at=now - 20,
                outcome=RESTARTING,
                max_restarts=3,
            )
        },
        restart_causes={1: cause},
    )
    (line,) = status.restart_lines()
    assert line.startswith("replica 1 READY (restarts: 1 of 3; last: rank 2 on node2 exited with signal SIGKILL at ")
    status.endpoints, status.restarting = [], [1]
    status.replica_restarts[1] = ReplicaRestart(
        replica=1, restarts=2, exit_status=137, ended_at=now, restart_at=now + 20, outcome=RESTARTING, max_restarts=3
    )
    assert status.restart_lines()[0].startswith("replica 1 restarting in 2")
    status.replica_restarts[1] = ReplicaRestart(
        replica=1, restarts=3, exit_status=1, ended_at=now, restart_at=now, outcome=GAVE_UP, max_restarts=3
    )
    assert status.restart_lines()[0].startswith("replica 1 not restarted (gave-up) (restarts: 3 of 3")
    assert status.to_json()["replica_restarts"]["1"]["outcome"] == GAVE_UP
