"""The bounds of an ordered stop, with a fake clock (no sleeping, no MPI, no tritonserver):
a follower's wait for its leader's release (launcher/node/stop.py), the launch.json keys that set the bounds, and
the bounded, non-spinning wait for an MPI request (backend/cpu_engine/parallel.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.contracts.plan import LaunchPlan, PlanError
from launcher.contracts.rank import STOP_FILE_ENV
from launcher.contracts.stop_records import DRAINED, DRAINING, DrainReport, StopNotice
from launcher.node.stop import KILL, TERM, WAIT, FollowerStop, LeaderDrain


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def follower(tmp_path: Path, clock: Clock, wait_s: float = 20.0) -> FollowerStop:
    return FollowerStop(
        wait_s, tmp_path / "rank-1.released", tmp_path / "rank-0.json", leader_gone_s=3.0, kill_after_s=2.0, clock=clock
    )


def test_follower_waits_for_nothing_before_a_stop_signal(tmp_path: Path) -> None:
    clock = Clock()
    stop = follower(tmp_path, clock)
    clock.now += 1000
    assert stop.action() == (WAIT, "") and not stop.started


def test_follower_waits_for_the_release_then_terms_then_kills(tmp_path: Path) -> None:
    clock = Clock()
    stop = follower(tmp_path, clock, wait_s=20.0)
    stop.begin()
    clock.now += 19.9
    assert stop.action()[0] == WAIT
    clock.now += 0.1
    what, why = stop.action()
    assert what == TERM and "within 20 s" in why
    assert stop.action()[0] == WAIT  # SIGTERM once; a loaded follower may still stop gracefully
    clock.now += 2.0
    assert stop.action()[0] == KILL
    clock.now += 100
    assert stop.action()[0] == WAIT  # and SIGKILL once


def test_follower_gives_up_soon_after_its_leader_ended_without_releasing_it(tmp_path: Path) -> None:
    clock = Clock()
    stop = follower(tmp_path, clock, wait_s=20.0)
    stop.begin()
    clock.now += 1.0
    (tmp_path / "rank-0.json").write_text("{}")  # the leader's launcher wrote its exit record
    assert stop.action()[0] == WAIT
    clock.now += 3.0
    what, why = stop.action()
    assert what == TERM and "leader ended without releasing" in why


def test_released_follower_is_not_hurried_by_its_leaders_end(tmp_path: Path) -> None:
    """The release comes first (the stub then ends its tritonserver itself): only the overall bound applies."""
    clock = Clock()
    stop = follower(tmp_path, clock, wait_s=20.0)
    stop.begin()
    (tmp_path / "rank-1.released").write_text("released")
    (tmp_path / "rank-0.json").write_text("{}")
    clock.now += 10
    assert stop.action()[0] == WAIT


def test_a_second_signal_never_extends_the_wait_and_the_launcher_can_cut_it(tmp_path: Path) -> None:
    clock = Clock()
    stop = follower(tmp_path, clock, wait_s=20.0)
    stop.begin()
    clock.now += 15
    stop.begin()
    clock.now += 5
    assert stop.action()[0] == TERM
    cut = follower(tmp_path / "x", Clock())
    cut.begin()
    cut.begin(0.0)  # the launcher itself gives up (Supervisor.stop): no release wait
    assert cut.action()[0] == TERM


def test_plan_stop_bounds(tmp_path: Path) -> None:
    def plan(**keys: object) -> LaunchPlan:
        shape = {"replicas": 1, "world_size_per_replica": 2}
        (tmp_path / "launch.json").write_text(json.dumps({"version": 1, "model_repository": "r", **shape, **keys}))
        return LaunchPlan.read(tmp_path)

    default = plan()
    assert (default.drain_s, default.exit_timeout_s, default.grace_s, default.follower_wait_s) == (10, 10, 13, 20)
    custom = plan(drain_s=4, release_wait_s=9, stop_grace_s=7)
    assert (custom.exit_timeout_s, custom.follower_wait_s, custom.grace_s) == (4, 9, 7)
    # the user's own --exit-timeout-secs is what tritonserver uses, so the follower waits for that one
    assert plan(server_args=["--exit-timeout-secs=30"]).follower_wait_s == 40
    assert plan(server_args=["--exit-timeout-secs", "2"]).exit_timeout_s == 2
    with pytest.raises(PlanError, match="drain_s"):
        plan(drain_s="soon")


class Request:
    """An MPI request that completes after ``polls`` calls of Test(), or never (None)."""

    def __init__(self, polls: int | None) -> None:
        self.polls, self.tests = polls, 0

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        self.tests += 1
        return self.polls is not None and self.tests >= self.polls


def test_wait_request_gives_up_on_a_peer_that_is_gone_without_spinning() -> None:
    from backend.cpu_engine.parallel import wait_request

    clock, naps = Clock(), []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        clock.now += seconds

    never = Request(None)
    assert wait_request(never, 5.0, clock=clock, sleep=sleep, spin_s=0.0, nap_s=0.001) is False
    assert 4999 <= len(naps) <= 5001 and set(naps) == {0.001}  # every poll after the spin sleeps
    assert clock.now == pytest.approx(105.0, abs=0.01)


def test_wait_request_spins_first_and_may_wait_forever() -> None:
    from backend.cpu_engine.parallel import wait_request

    clock, naps = Clock(), []
    soon = Request(50)
    assert wait_request(soon, None, clock=clock, sleep=naps.append, spin_s=1.0) is True
    assert soon.tests == 50 and naps == []  # within the spin time: no sleep, no added latency
    late = Request(10)
    assert wait_request(late, None, clock=clock, sleep=lambda s: clock.sleep(s), spin_s=0.0, nap_s=60.0)
    assert clock.now == pytest.approx(100 + 9 * 60.0)  # no timeout: it waits as long as it takes


def test_drain_deadline_is_what_the_launcher_announced(tmp_path: Path) -> None:
    from backend.cpu_engine.parallel import drain_deadline

    stop = tmp_path / "rank-0.stopping"
    env = {STOP_FILE_ENV: str(stop)}
    assert drain_deadline({}) is None and drain_deadline(env) is None  # not stopping
    StopNotice(signal="SIGTERM", at=5.0, drain_until=15.0).write(stop)
    assert drain_deadline(env) == 15.0
    stop.write_text("{half")
    assert drain_deadline(env) is None


def test_a_group_of_zombies_is_not_alive() -> None:
    """A stub whose tritonserver was killed waits as a zombie until its new parent reaps it: the launcher must
    not wait for it (nor report it as a leftover)."""
    import os
    import signal
    import subprocess

    from launcher.node.supervise import group_alive

    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert group_alive(proc.pid) and group_alive(os.getpgrp())
        os.kill(proc.pid, signal.SIGKILL)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
        assert not group_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_leader_holds_sigterm_until_its_model_drained(tmp_path: Path) -> None:
    """A model that says "draining" keeps tritonserver's SIGTERM back until it says "drained" (or the drain time
    ran out); one that says nothing within ack_s (it does not drain itself) gets the SIGTERM at once."""
    clock = Clock()
    drain_file = tmp_path / "rank-0.drain"
    drain = LeaderDrain(drain_file, clock() + 10.0, ack_s=1.5, clock=clock)
    assert not drain.release()
    DrainReport(state=DRAINING).write(drain_file)
    clock.sleep(5.0)  # past ack_s, but draining
    assert not drain.release()
    DrainReport(state=DRAINED).write(drain_file)
    assert drain.release() and drain.reason == "the model drained"
    assert not drain.release()  # once only

    silent = LeaderDrain(tmp_path / "rank-9.drain", clock() + 10.0, ack_s=1.5, clock=clock)
    assert not silent.release()
    clock.sleep(1.5)
    assert silent.release() and silent.reason == "the model does not drain itself"

    stuck = LeaderDrain(drain_file, clock() + 10.0, ack_s=1.5, clock=clock)
    DrainReport(state=DRAINING).write(drain_file)
    clock.sleep(9.9)
    assert not stuck.release()
    clock.sleep(0.1)
    assert stuck.release() and stuck.reason == "the drain time ran out"


def test_leader_without_a_drain_report_waits_for_the_servers_metrics(tmp_path: Path) -> None:
    """A model that writes no drain file (TensorRT-LLM's backend) is drained by tritonserver's own metrics: the
    SIGTERM waits until they read 0 for settle_s (a count back above 0 starts the wait again), or the drain time
    ran out; a probe that cannot say gives the SIGTERM at ack_s, as without one."""
    clock = Clock()
    start = clock()
    counts = [2, 1, 0, 3, 0, 0, 0, 0, 0, 0]
    drain = LeaderDrain(
        tmp_path / "rank-0.drain", clock() + 10.0, ack_s=1.5, in_flight=lambda: counts.pop(0), clock=clock
    )
    assert not drain.release()  # before ack_s the metrics are not read: the model may still report
    assert counts[0] == 2
    clock.sleep(1.5)
    released_at = None
    for _ in range(40):
        if drain.release():
            released_at = clock()
            break
        clock.sleep(0.25)
    # reads: 2, 1, 0 (idle from 2.0), 3 (not idle), 0 at 2.5 … settled 1 s later
    assert released_at == pytest.approx(start + 3.5) and drain.reason.startswith("nothing in flight")

    busy = LeaderDrain(tmp_path / "rank-1.drain", clock() + 10.0, ack_s=1.5, in_flight=lambda: 1, clock=clock)
    clock.sleep(9.9)
    assert not busy.release()
    clock.sleep(0.1)
    assert busy.release() and busy.reason == "the drain time ran out"

    blind = LeaderDrain(tmp_path / "rank-2.drain", clock() + 10.0, ack_s=1.5, in_flight=lambda: None, clock=clock)
    clock.sleep(1.5)
    assert blind.release() and "metrics do not say" in blind.reason


def test_in_flight_reads_the_engine_and_tritonservers_queues() -> None:
    """One reading for the renewer and a stopping leader: the engine's active + waiting, plus what tritonserver
    still holds in its queues; None for a page without the engine's lines."""
    from launcher.contracts.renew_plan import active_requests

    page = (
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 2\n'
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 1\n'
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="completed",version="1"} 40\n'
        'nv_inference_pending_request_count{model="ensemble",version="1"} 0\n'
        'nv_inference_pending_request_count{model="preprocessing",version="1"} 4\n'
    )
    assert active_requests(page) == 7
    assert active_requests('nv_inference_pending_request_count{model="x",version="1"} 4\n') is None


def test_in_flight_takes_the_larger_of_the_engines_and_the_models_own_count() -> None:
    """hpc-serve's llmapi model counts its own requests: the engine's stats can stop coming while requests run
    (upstream's stats result ends for good after one read timed out), leaving its gauges at 0 or stale. Per model
    the larger count is what is in flight; the model's line alone is a reading too."""
    from launcher.contracts.renew_plan import active_requests

    engine = 'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} %d\n'
    own = 'hpc_serve_model_requests_in_flight{model="tensorrt_llm",version="1"} %d\n'
    other = 'hpc_serve_model_requests_in_flight{model="tensorrt_llm_unary",version="1"} 1\n'
    assert active_requests(engine % 0 + own % 2) == 2, "stats gone stale at 0 while two requests run"
    assert active_requests(engine % 3 + own % 2) == 3, "the engine's count is taken when it is larger"
    assert active_requests(engine % 0 + own % 2 + other) == 3, "each model's larger count, summed"
    assert active_requests(own % 1) == 1
