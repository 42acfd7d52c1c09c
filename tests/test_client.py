"""hpc.client without a server: the shared retry rule (hpc/serving/retry.py), the sampling parameters, how the
gateway's answers become exceptions, and TARGETs that name nothing ready. tests/test_client_e2e.py runs it
against real jobs and a real gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import httpx
import pytest

from hpc.client import AsyncClient, AuthError, Busy, Client, NotReady, RequestError, ServerError, TargetError
from hpc.client.transport import _refusal, generate_params
from hpc.serving.balancer import Balancer, NoReplica, Replica, Saturated
from hpc.serving.retry import stream_with_retry, taken_whole
from hpc.serving.triton import ContextTooLong, ModelError, failed_internally
from tests.e2e import write_spec

pytestmark = pytest.mark.timeout(60)


class Down(Exception):
    pass


class Full(Exception):
    pass


class Replicas:
    """Replica `dead*` cannot be reached, `full*` refuses (queue full), `flaky*` breaks after its first piece;
    the others answer "a", "b". Records which were asked and which streams were closed."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.closed: list[str] = []

    async def attempt(self, replica: Replica) -> AsyncGenerator[str, None]:
        self.asked.append(replica.key)
        try:
            if replica.key.startswith("dead"):
                raise Down(replica.key)
            if replica.key.startswith("full"):
                raise Full(replica.key)
            if replica.key.startswith("locked"):
                raise PermissionError(replica.key)  # e.g. a refused token: neither benched nor retried
            if replica.key.startswith("broken"):
                raise ModelError(f"the model failed the request on {replica.key}")  # an engine that died
            yield "a"
            if replica.key.startswith("flaky"):
                raise Down(replica.key)
            yield "b"
        finally:
            self.closed.append(replica.key)


def _run(*keys: str, take: int | None = None, whole: bool = False) -> tuple[list[str], Replicas, Balancer]:
    balancer = Balancer()
    balancer.update([Replica(key=k, http_url=f"http://{k}", grpc_url=k) for k in keys])
    replicas = Replicas()

    def attempt(replica: Replica):
        return taken_whole(replicas.attempt(replica)) if whole else replicas.attempt(replica)

    async def collect() -> list[str]:
        got = []
        stream = stream_with_retry(balancer, attempt, Down, Full)
        async for item in stream:
            got.append(item)
            if take is not None and len(got) == take:
                await stream.aclose()
                break
        return got

    return asyncio.run(collect()), replicas, balancer


def test_retry_benches_an_unreachable_replica_and_skips_a_full_one_without_benching_it():
    got, replicas, balancer = _run("dead", "full", "live")
    assert got == ["a", "b"] and replicas.asked == ["dead", "full", "live"]
    by_key = {r.key: r for r in balancer.replicas}
    assert by_key["dead"].failures == 1 and by_key["full"].refusals == 1 and by_key["full"].failures == 0
    assert [r.key for r in balancer.available()] == ["full", "live"], "busy is not broken: full stays in"
    assert all(r.outstanding == 0 for r in balancer.replicas)


def test_no_retry_once_a_piece_was_yielded_and_the_errors_when_none_is_left():
    with pytest.raises(Down):
        _run("flaky", "live")
    with pytest.raises(Saturated):
        _run("full", "full2")
    with pytest.raises(NoReplica) as exc:
        _run("dead", "dead2")
    assert not isinstance(exc.value, Saturated)


def _failing(*keys: str) -> tuple[list[str], Replicas, Balancer]:
    balancer = Balancer()
    balancer.update([Replica(key=k, http_url=f"http://{k}", grpc_url=k) for k in keys])
    replicas = Replicas()

    async def collect() -> list[str]:
        stream = stream_with_retry(balancer, replicas.attempt, Down, Full, failed=failed_internally)
        return [item async for item in stream]

    return asyncio.run(collect()), replicas, balancer


def test_a_model_failure_before_the_first_byte_is_tried_once_more_elsewhere_and_not_benched():
    got, replicas, balancer = _failing("broken", "live")
    assert got == ["a", "b"] and replicas.asked == ["broken", "live"]
    assert [r.failures for r in balancer.replicas] == [0, 0], "not benched: the request may be what it failed on"
    with pytest.raises(ModelError, match="on broken"):  # once only: the first failure is the answer
        _failing("broken", "broken2", "live")
    with pytest.raises(ModelError, match="on broken"):  # none left to try: the model's error, not a 503
        _failing("broken")
    with pytest.raises(ContextTooLong):  # a refusal of what the request asked is the client's at once
        asyncio.run(_refused())


async def _refused() -> None:
    balancer = Balancer()
    balancer.update([Replica(key=k, http_url=k, grpc_url=k) for k in ("a", "b")])

    async def attempt(replica: Replica) -> AsyncGenerator[str, None]:
        raise ContextTooLong("too long")
        yield ""

    async for _ in stream_with_retry(balancer, attempt, Down, Full, failed=failed_internally):
        pass


def test_an_answer_taken_whole_is_retried_when_its_replica_breaks_half_way():
    """What the gateway and the client do for a request not streamed (taken_whole): the replica that broke after
    its first piece is benched and the whole answer comes from another; streamed, the same break fails."""
    got, replicas, balancer = _run("flaky", "live", whole=True)
    assert got == ["a", "b"] and replicas.asked == ["flaky", "live"]
    assert {r.key: r.failures for r in balancer.replicas} == {"flaky": 1, "live": 0}
    assert all(r.outstanding == 0 for r in balancer.replicas)
    with pytest.raises(Down):
        _run("flaky", "live", whole=False)


def test_the_hooks_see_each_pick_and_retry_and_other_errors_pass_as_they_are():
    balancer = Balancer()
    balancer.update([Replica(key=k, http_url=f"http://{k}", grpc_url=k) for k in ("dead", "full", "live")])
    picks: list[tuple[str, int]] = []
    retries: list[tuple[str, str]] = []

    async def collect(b: Balancer) -> list[str]:
        stream = stream_with_retry(
            b,
            Replicas().attempt,
            Down,
            Full,
            on_retry=lambda r, e: retries.append((r.key, type(e).__name__)),
            on_pick=lambda r, tried: picks.append((r.key, tried)),
        )
        return [item async for item in stream]

    assert asyncio.run(collect(balancer)) == ["a", "b"]
    assert picks == [("dead", 0), ("full", 1), ("live", 2)], "each pick with the replicas tried before it"
    assert retries == [("dead", "Down"), ("full", "Full")]
    locked = Balancer()
    locked.update([Replica(key=k, http_url=f"http://{k}", grpc_url=k) for k in ("locked", "z-live")])
    with pytest.raises(PermissionError):
        asyncio.run(collect(locked))
    assert [r.key for r in locked.available()] == ["locked", "z-live"] and locked.replicas[0].failures == 0


def test_a_caller_that_stops_early_closes_the_replicas_stream():
    got, replicas, balancer = _run("live", take=1)
    assert got == ["a"] and replicas.closed == ["live"]
    assert balancer.replicas[0].outstanding == 0


def test_sampling_parameters_are_openais_and_unknown_ones_are_named():
    params = generate_params("x", 5, {"stop": "END", "temperature": 0.5, "seed": 3})
    assert (params.stop, params.temperature, params.seed, params.top_p) == (("END",), 0.5, 3, None)
    with pytest.raises(TypeError, match="temprature.*temperature, top_p, top_k, seed, presence_penalty"):
        generate_params("x", 5, {"temprature": 1.0})  # type: ignore[typeddict-unknown-key]


def _answer(status: int, message: str, param: str | None = None, code: str | None = None) -> httpx.Response:
    body = {"error": {"message": message, "type": "x", "param": param, "code": code}}
    return httpx.Response(status, json=body)


def test_the_gateways_error_answers_become_the_clients_exceptions():
    refusal = _refusal(_answer(400, "top_p: must be at most 1", "top_p"))
    assert isinstance(refusal, RequestError) and refusal.param == "top_p" and "top_p: must be" in str(refusal)
    assert isinstance(_refusal(_answer(401, "missing or wrong access token")), AuthError)
    assert isinstance(_refusal(_answer(404, "no such model", "model")), RequestError)
    assert isinstance(_refusal(_answer(429, "every replica's queue is full")), Busy)
    assert isinstance(_refusal(_answer(503, "no replica", code="no_replica_ready")), NotReady)
    assert isinstance(_refusal(httpx.Response(502, text="bad gateway")), ServerError)


@pytest.mark.slow
def test_a_deployment_with_no_job_is_not_ready(tmp_path, tiny_gpt2, hpc_home):
    spec = write_spec(tmp_path, "idle", tiny_gpt2)
    with Client(str(spec)) as client:
        assert not client.ready()
        with pytest.raises(NotReady, match="no replica of idle"):
            client.generate("x", 2)
    with Client(str(spec), gateway=True) as client, pytest.raises(NotReady, match="no gateway of idle"):
        client.generate("x", 2)

    async def stream() -> list[str]:
        async with AsyncClient(str(spec)) as client:
            return [piece async for piece in client.stream("x", 2)]

    with pytest.raises(NotReady):
        asyncio.run(stream())


def test_a_target_that_names_nothing_says_what_a_target_is(hpc_home):
    with pytest.raises(TargetError, match="spec file"):
        Client("no-such-deployment")


@pytest.mark.parametrize(
    ("name", "value"), [("top_p", 5.0), ("top_p", 0.0), ("temperature", -0.1), ("frequency_penalty", 3)]
)
def test_a_sampling_value_out_of_range_is_refused_before_sending_naming_its_field(name, value):
    """From Python as from the CLI and the gateway (one range each: hpc/spec/limits.py): `param` names the field."""
    with pytest.raises(RequestError) as exc:
        generate_params("x", 5, {name: value})  # type: ignore[misc]
    assert exc.value.param == name and str(exc.value).startswith(f"{name} must be")


def test_the_gateway_takes_exactly_the_ranges_the_client_checks():
    from hpc.gateway.bodies import Sampling
    from hpc.spec.limits import SAMPLING_BOUNDS

    for name, bound in SAMPLING_BOUNDS.items():
        for value in (bound.low, bound.high, bound.high + 0.01, bound.low - 0.01):
            body = {"model": "m", name: value}
            if bound.holds(value):
                assert getattr(Sampling.model_validate(body), name) == value
            else:
                with pytest.raises(ValueError, match=name):
                    Sampling.model_validate(body)
