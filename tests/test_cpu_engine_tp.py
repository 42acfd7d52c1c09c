"""Tensor parallelism: the engine under ``mpirun -n 2`` (leader + follower) gives the same tokens as tp 1.

The test runs this very file under mpirun; ``__main__`` is the MPI program (rank 0 leader, rank 1 follower).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backend.cpu_engine.init_model import create_checkpoint
from tests._env import unavailable

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent


def _requests(prompt_sets: list[list[int]]):
    from backend.cpu_engine.sampling import SamplingParams
    from backend.cpu_engine.scheduler import GenerationRequest

    out = []
    for i, p in enumerate(prompt_sets):
        sp = SamplingParams(temperature=0.8, top_k=40, seed=100 + i) if i % 2 else SamplingParams()
        out.append(GenerationRequest(input_ids=p, max_new_tokens=12 + 3 * i, sampling=sp, return_log_probs=True))
    return out


PROMPTS = [[3, 17, 42, 5], [9] * 11, list(range(20, 57)), [101, 7], [250, 3, 4, 5, 6, 7, 8]]
#: questions on one 37-token document, then another document: KV-block reuse across the ranks (prefix_cache.py)
REUSE_PROMPTS = [list(range(20, 57)) + tail for tail in ([5, 6], [7], [8, 9])] + [list(range(60, 90))]


def _run(engine) -> list[dict]:
    reqs = _requests(PROMPTS)
    engine.submit(reqs[0])
    engine.submit(reqs[1])
    engine.step()
    engine.step()
    for r in reqs[2:]:
        engine.submit(r)
        engine.step()
    engine.run_until_idle()
    return [{"tokens": r.output_ids, "log_probs": r.log_probs, "reason": r.finish_reason} for r in reqs]


def mpi_main(model_dir: str, out_file: str) -> None:
    from backend.cpu_engine.engine import Engine
    from backend.cpu_engine.follower import follower_loop, load_shard
    from backend.cpu_engine.parallel import SingleComm, world_comm

    comm = world_comm(2)
    shard = load_shard(model_dir, comm, max_slots=4)
    if comm.rank > 0:
        follower_loop(shard)
        return
    tp2 = _run(Engine(shard=shard, max_batch_size=4))
    reuse = Engine(shard=shard, max_batch_size=4, block_size=4, block_reuse=True)  # each rank copies its own shard
    tp2_reuse = [reuse.generate(r) for r in _requests(REUSE_PROMPTS)]
    Engine(shard=shard).shutdown()  # any leader Engine over this comm can tell the follower to stop
    tp1 = _run(Engine(model_dir, comm=SingleComm(), max_batch_size=4))
    tp1_plain = [Engine(model_dir, comm=SingleComm()).generate(r) for r in _requests(REUSE_PROMPTS)]
    heads = {"tp2_local_heads": shard.n_heads, "tp2_local_kv_heads": shard.n_kv, "tp2_local_inter": shard.inter}
    reuse_runs = {
        "tp2_reuse": [(r.output_ids, r.kv_blocks_reused) for r in tp2_reuse],
        "tp1_plain": [(r.output_ids, r.kv_blocks_reused) for r in tp1_plain],
    }
    Path(out_file).write_text(json.dumps({"tp2": tp2, "tp1": tp1, **heads, **reuse_runs}))


def mpi_silent_leader(model_dir: str, out_file: str) -> None:
    """Rank 0 stays silent longer than the timeout before its first message ("loading": must NOT count), sends
    one heartbeat, then stays silent until rank 1 has left; rank 1's follower loop must wait through the load
    and leave on the silence after the heartbeat, while its leader is still there.

    Every step waits for an event, not for time: the leader's silence starts once the follower is in its loop
    (``.waiting``), and a sleep never ends early, so that silence is longer than the timeout however slow the
    machine; the leader then waits for the follower's result (``out_file``) before it leaves, so the follower
    can only have left on the silence, not because the leader's process ended."""
    import time

    from backend.cpu_engine.follower import PING, follower_loop, load_shard
    from backend.cpu_engine.parallel import MpiComm

    timeout_s = 2.0
    waiting, result = Path(out_file + ".waiting"), Path(out_file)
    comm = MpiComm(leader_timeout_s=timeout_s)
    shard = load_shard(model_dir, comm, max_slots=2)
    if comm.rank == 0:
        leader = {"follower_waiting": _wait_for_file(waiting)}
        time.sleep(timeout_s + 1)  # "loading a big checkpoint": silent longer than leader_timeout_s
        comm.bcast_obj(PING)
        leader["follower_left_while_leader_was_there"] = _wait_for_file(result)
        Path(out_file + ".leader").write_text(json.dumps(leader))
        return
    waiting.write_text("")
    follower_loop(shard)
    # a follower that gave up during the silent load would not have heard the heartbeat
    result.write_text(json.dumps({"heard_from_leader": comm.heard_from_leader}))


def _wait_for_file(path: Path, timeout_s: float = 120.0) -> bool:
    """Whether `path` exists within `timeout_s` (a generous bound: only a broken peer takes that long)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def mpi_faults(model_dir: str, out_file: str) -> None:
    """A follower that fails half-way through a forward pass, and a plan every rank must reject: the step's
    requests fail with the reason, both ranks stay in step, and the next request is served exactly as tp 1."""
    import numpy as np

    from backend.cpu_engine.engine import Engine
    from backend.cpu_engine.follower import follower_loop, load_shard
    from backend.cpu_engine.lockstep import PlanRejected
    from backend.cpu_engine.model import StepPlan
    from backend.cpu_engine.parallel import SingleComm, world_comm
    from backend.cpu_engine.scheduler import GenerationRequest

    comm = world_comm(2)
    shard = load_shard(model_dir, comm, max_slots=4)
    if comm.rank > 0:
        real_mlp, calls = shard._mlp, []

        def failing_mlp(layer, h):  # the 2nd MLP of the first step raises (after 3 all-reduces were done)
            calls.append(1)
            if len(calls) == 2:
                raise MemoryError("injected follower fault")
            return real_mlp(layer, h)

        shard._mlp = failing_mlp
        follower_loop(shard)
        return
    engine = Engine(shard=shard, max_batch_size=4)
    first = engine.submit(GenerationRequest(input_ids=PROMPTS[0], max_new_tokens=6))
    reason = engine.step_or_fail()
    rejected = ""
    try:  # a plan with a token id outside the vocabulary: both ranks refuse it before any collective
        shard.run_step(StepPlan(prefills=[(0, np.array([10**9]))]))
    except PlanRejected as e:
        rejected = str(e)
    rejected_by_engine = engine.generate(GenerationRequest(input_ids=[5, -1, 7], max_new_tokens=4))
    after = engine.generate(GenerationRequest(input_ids=PROMPTS[2], max_new_tokens=8))
    engine.shutdown()
    ref = Engine(model_dir, comm=SingleComm(), max_batch_size=4).generate(
        GenerationRequest(input_ids=PROMPTS[2], max_new_tokens=8)
    )
    Path(out_file).write_text(
        json.dumps(
            {
                "step_reason": reason,
                "first": [first.finish_reason, first.error],
                "rejected": rejected,
                "negative": [rejected_by_engine.finish_reason, rejected_by_engine.error],
                "after": after.output_ids,
                "ref": ref.output_ids,
            }
        )
    )


def _mpirun() -> str:
    exe = shutil.which("mpirun")
    if not exe:
        unavailable("mpirun not installed (apt-get install openmpi-bin)")
    return exe


def _run_two_ranks(ckpt: str, out: Path, mode: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    """This file's ``__main__`` under ``mpirun -n 2`` (rank 0 leader, rank 1 follower) in test ``mode``."""
    env = {
        **os.environ,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "CPU_ENGINE_TP_TEST_MODE": mode,
    }
    cmd = [_mpirun(), "-n", "2", "--oversubscribe", sys.executable, str(HERE), ckpt, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tp2_equals_tp1(family: str, tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    ckpt = create_checkpoint(tmp_path / family, family=family, seed=5)
    out = tmp_path / "result.json"
    _run_two_ranks(ckpt, out, "", timeout=300)
    res = json.loads(out.read_text())
    # the model really was split: each rank held half the heads and half the MLP
    assert res["tp2_local_heads"] == 2 and res["tp2_local_kv_heads"] == (1 if family == "llama" else 2)
    for a, b in zip(res["tp2"], res["tp1"], strict=True):
        assert a["tokens"] == b["tokens"] and a["reason"] == b["reason"]
        assert max(abs(x - y) for x, y in zip(a["log_probs"], b["log_probs"], strict=True)) < 1e-4
    # reused blocks (each rank copying its own heads' share) give the tokens computing everything on one rank gives
    assert [t for t, _ in res["tp2_reuse"]] == [t for t, _ in res["tp1_plain"]]
    assert [n for _, n in res["tp2_reuse"]] == [0, 9, 9, 0] and [n for _, n in res["tp1_plain"]] == [0] * 4


@pytest.mark.slow
def test_follower_leaves_when_leader_goes_silent(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    ckpt = create_checkpoint(tmp_path / "gpt2", family="gpt2", seed=5)
    out = tmp_path / "result.json"
    proc = _run_two_ranks(ckpt, out, "silent-leader", timeout=300)
    leader = json.loads(Path(f"{out}.leader").read_text())
    assert leader["follower_waiting"], "the follower never reached its loop"
    # the silent load did not count: the follower was still in its loop when the heartbeat came
    assert json.loads(out.read_text()) == {"heard_from_leader": True}
    # the silence after the heartbeat did: it left while its leader was still there, saying why
    assert leader["follower_left_while_leader_was_there"], proc.stderr[-3000:]
    assert "no message from the leader for 2s" in proc.stderr


@pytest.mark.slow
def test_a_failing_rank_fails_only_its_step_and_ranks_stay_in_step(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    ckpt = create_checkpoint(tmp_path / "gpt2", family="gpt2", seed=5)
    out = tmp_path / "result.json"
    _run_two_ranks(ckpt, out, "faults", timeout=120)
    res = json.loads(out.read_text())
    assert "peer rank failed" in res["step_reason"]
    assert res["first"][0] == "error" and "peer rank failed" in res["first"][1]
    assert "outside the vocabulary" in res["rejected"]
    assert res["negative"][0] == "error" and "token id -1 at position 1" in res["negative"][1]
    assert res["after"] == res["ref"] and len(res["after"]) == 8


@pytest.mark.slow
def test_tp_size_must_equal_world_size(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    code = (
        "from backend.cpu_engine.parallel import world_comm\n"
        "try:\n    world_comm(2)\nexcept ValueError as e:\n    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "MPI world size 1 != tp_size 2" in proc.stdout, proc.stdout + proc.stderr


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if os.environ.get("CPU_ENGINE_TP_TEST_MODE") == "silent-leader":
        mpi_silent_leader(sys.argv[1], sys.argv[2])
    elif os.environ.get("CPU_ENGINE_TP_TEST_MODE") == "faults":
        mpi_faults(sys.argv[1], sys.argv[2])
    else:
        mpi_main(sys.argv[1], sys.argv[2])
