"""The gateway's pure parts: the balancer's policy, the chat template, stop sequences, the access token."""

from __future__ import annotations

import json
import stat

import pytest

from hpc.gateway.auth import authorized
from hpc.gateway.passthrough import PASSTHROUGH_ID_PREFIX, HiddenId, _parsed, _request_id
from hpc.serving.auth import Tokens, ensure_token, read_tokens
from hpc.serving.balancer import Balancer, Replica
from hpc.serving.text import FALLBACK_TEMPLATE, ChatTemplate, StopStream, cut_at_stop


def test_chat_template_from_tokenizer_config(tmp_path):
    template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": "<s>"}))
    chat = ChatTemplate.from_tokenizer_dir(tmp_path)
    assert not chat.is_fallback
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat.render(messages) == "<s><|system|>Be brief.<|user|>Hi<|assistant|>"


def test_chat_template_fallback_and_refusals(tmp_path):
    chat = ChatTemplate.from_tokenizer_dir(tmp_path)  # no tokenizer_config.json at all
    assert chat.is_fallback and chat.source == FALLBACK_TEMPLATE
    assert chat.render([{"role": "user", "content": "Hi"}]) == "user: Hi\nassistant:"
    strict = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}")
    with pytest.raises(Exception, match="user first"):
        strict.render([{"role": "assistant", "content": "x"}])


def test_stop_sequences_cut_whole_and_streamed():
    assert cut_at_stop("one two. three", [".", "two"]) == ("one ", True)
    assert cut_at_stop("one", ["x"]) == ("one", False)
    stream = StopStream(["END"])
    sent = [stream.feed(p) for p in ["ab", "cE", "N", "Dxyz"]]
    assert "".join(sent) == "abc" and stream.stopped and stream.flush() == ""
    stream = StopStream(["END"])
    assert stream.feed("abE") == "ab" and stream.feed("x") == "Ex" and stream.flush() == ""
    stream = StopStream(["END"])
    assert stream.feed("xyzEN") == "xyz" and stream.flush() == "EN"


def test_the_id_the_gateway_gave_a_passthrough_stream_is_taken_out_of_its_events_however_they_are_read():
    """Triton echoes a generate_stream request's id in each event; the gateway gave one to a request that had
    none (to stop it by when its client leaves), and the client gets the events it would get from the replica."""
    rid = "hpc-serve-passthrough:abc"
    events = [
        {"batch_index": 0, "id": rid, "model_name": "ensemble", "text_output": f"w{i} \n\n"} for i in range(5)
    ] + [{"model_name": "ensemble", "id": rid}, {"error": "x"}]
    stream = b"".join(f"data: {json.dumps(e, separators=(',', ':'))}\n\n".encode() for e in events)
    expected = b"".join(
        f"data: {json.dumps({k: v for k, v in e.items() if k != 'id'}, separators=(',', ':'))}\n\n".encode()
        for e in events
    )
    for size in (1, 3, 7, 40, len(stream)):  # events split across reads anywhere, several in one read
        hidden = HiddenId(rid)
        got = b"".join(hidden.feed(stream[i : i + size]) for i in range(0, len(stream), size)) + hidden.flush()
        assert got == expected, size
    cut = HiddenId(rid)
    assert cut.feed(stream[:20]) == b"" and cut.flush() == stream[:20], "a stream cut mid-event: what came, as it came"
    other = HiddenId("another")
    assert other.feed(stream) == stream, "another request's id is left alone"


def test_a_passthrough_stream_gets_an_id_written_into_its_body_only_when_it_has_none():
    """The body's bytes are kept (a body may be megabytes: not parsed and written again); the id goes first in its
    object, an empty object included; a client's own id is kept and stopped by; a body the replica will refuse
    (not a JSON object, an id that is no string) goes as it came, with nothing to stop it by."""
    cases = [b'{"text_input": "\xc3\xbc{", "max_tokens": 3}', b"  \n{ }"]
    for body in cases:
        request_id, hidden, sent = _request_id(_parsed(body), body)
        assert request_id is not None and request_id.startswith(PASSTHROUGH_ID_PREFIX) and hidden is not None
        assert json.loads(sent) == {"id": request_id} | json.loads(body)
        opening = body.index(b"{") + 1
        assert sent.startswith(body[:opening]) and sent.endswith(body[opening:]), "the client's bytes, as they came"
    mine = b'{"id": "mine", "text_input": "a"}'
    assert _request_id(_parsed(mine), mine) == ("mine", None, mine)
    for refused in (b'{"id": 3}', b'{"id": ""}', b"[1]", b"not json"):
        assert _request_id(_parsed(refused), refused) == (None, None, refused)


def test_token_is_private_stable_and_checked(tmp_path):
    token = ensure_token(tmp_path)
    path = tmp_path / "access_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) > 30
    assert ensure_token(tmp_path) == token
    tokens = read_tokens([tmp_path, tmp_path / "missing"])
    assert tokens == {token}
    assert authorized(f"Bearer {token}", tokens) and authorized(f"bearer {token}", tokens)
    assert not authorized(None, tokens) and not authorized("Bearer nope", tokens) and not authorized(token, tokens)
    assert authorized(None, set()), "a deployment without a token file needs none"


class FakeEngine:
    """Replica `dead` cannot be reached; `flaky` breaks after its first chunk; others answer "a", "b"."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.tokens: list[str | None] = []

    async def stream(self, grpc_url, params, token=None, workflow="engine", decoupled=True, llmapi_model=""):
        from hpc.serving.model_io import Chunk
        from hpc.serving.triton import ReplicaUnavailable

        self.calls.append(grpc_url)
        self.tokens.append(token)
        if grpc_url == "dead":
            raise ReplicaUnavailable("dead: UNAVAILABLE")
        if grpc_url == "locked":
            from hpc.serving.triton import TokenRefused

            raise TokenRefused("locked: UNAVAILABLE: This protocol is restricted, expecting header 'authorization'")
        yield Chunk("a", 1)
        if grpc_url == "flaky":
            raise ReplicaUnavailable("flaky: the stream broke")
        yield Chunk("b", 1)


def _replicas(*keys: str) -> list[Replica]:
    return [Replica(key=k, http_url=f"http://{k}", grpc_url=k) for k in keys]


def app_on(engine, checkpoint, tokenizer, fast_path: bool, *keys: str):
    """The gateway's app (its fast path on or off) for a deployment named "m" of `checkpoint`, on replicas `keys`
    whose requests `engine` answers: what the app's lifespan would make, without discovery."""
    from hpc.gateway.app import create_app
    from hpc.serving.deployment import Target

    target = Target(checkpoint.parent, "m", checkpoint)
    app = create_app(target, fast_path=fast_path)
    gw, _ = _gateway(*keys)
    gw.engine = engine
    gw.target, gw.tokenizer = target, tokenizer
    app.state.gateway = gw
    return app


def _gateway(*keys: str):
    from hpc.gateway.state import Gateway
    from hpc.serving.discovery import Discovery

    balancer = Balancer()
    balancer.update(_replicas(*keys))
    engine = FakeEngine()
    discovery = Discovery(None, balancer, None)  # type: ignore[arg-type]
    gw = Gateway(None, balancer, discovery, engine, None, None, ChatTemplate(None))  # type: ignore[arg-type]
    return gw, engine


async def _collect(gw) -> str:
    """As the routes take a generation: its first piece with `first` (the answers when none is left), then the rest."""
    from hpc.serving.model_io import GenerateParams

    pieces = gw.generate(GenerateParams(prompt="x", max_tokens=2))
    first = await gw.first(pieces)
    return "".join([first.text if first else "", *[c.text async for c in pieces]])


def test_a_replica_failing_before_its_first_chunk_is_benched_and_the_request_retried():
    import asyncio

    gw, engine = _gateway("dead", "live")
    gw.discovery.replica_tokens = Tokens(by_job={"live": "live-token"}, newest="newest-token")
    assert asyncio.run(_collect(gw)) == "ab"
    assert engine.calls == ["dead", "live"], "dead sorts first: tried, benched, then live"
    assert engine.tokens == ["newest-token", "live-token"], "each replica is sent its job's token"
    dead = next(r for r in gw.balancer.replicas if r.key == "dead")
    assert dead.failures == 1 and [r.key for r in gw.balancer.healthy()] == ["live"]
    assert all(r.outstanding == 0 for r in gw.balancer.replicas)


def test_an_answer_taken_whole_is_retried_even_after_the_replica_sent_pieces():
    """A request not streamed (`whole`): nothing reached the client, so a replica lost half-way is retried."""
    import asyncio

    from hpc.serving.model_io import GenerateParams

    gw, engine = _gateway("flaky", "z-live")

    async def collect() -> str:
        return "".join([c.text async for c in gw.generate(GenerateParams(prompt="x", max_tokens=2), whole=True)])

    assert asyncio.run(collect()) == "ab"
    assert engine.calls == ["flaky", "z-live"]
    assert [r.key for r in gw.balancer.healthy()] == ["z-live"], "the replica that broke off is benched"


def test_a_refused_token_is_not_retried_nor_benched_and_the_access_record_names_the_replica():
    import asyncio

    from hpc.gateway.accesslog import RequestRecord
    from hpc.serving.model_io import GenerateParams
    from hpc.serving.triton import TokenRefused, is_auth_refusal

    assert is_auth_refusal(RuntimeError("UNAVAILABLE: This protocol is restricted, expecting header 'x'"))
    assert not is_auth_refusal(RuntimeError("UNAVAILABLE: failed to connect to all addresses"))
    gw, engine = _gateway("locked", "z-live")
    with pytest.raises(TokenRefused):
        asyncio.run(_collect(gw))
    assert engine.calls == ["locked"] and all(r.failures == 0 for r in gw.balancer.replicas)
    gw, engine = _gateway("dead", "live")
    record = RequestRecord("POST", "/v1/completions")

    async def collect() -> str:
        return "".join([c.text async for c in gw.generate(GenerateParams(prompt="x", max_tokens=2), record)])

    assert asyncio.run(collect()) == "ab"
    assert (record.replica, record.retried) == ("live", 1) and record.ttft_s is not None


def test_a_failure_after_the_first_chunk_reaches_the_client_and_none_left_is_503():
    import asyncio

    from hpc.gateway.errors import APIError
    from hpc.serving.triton import ReplicaUnavailable

    gw, engine = _gateway("flaky", "z-live")
    with pytest.raises(ReplicaUnavailable):
        asyncio.run(_collect(gw))
    assert engine.calls == ["flaky"], "text was sent: no retry (the client would see it twice)"
    gw, _ = _gateway("dead")
    with pytest.raises(APIError) as exc:
        asyncio.run(_collect(gw))
    assert exc.value.status == 503


def test_no_replica_is_503_and_missing_fields_are_400(tmp_path, tiny_gpt2):
    """The app on a deployment with no job yet (and no token): served, but nothing to send requests to."""
    from fastapi.testclient import TestClient

    from hpc.gateway.app import create_app
    from hpc.serving.deployment import Target

    app = create_app(Target(tmp_path / "runs", "nothing", tiny_gpt2))
    with TestClient(app) as http:
        assert http.get("/v1/models").json()["data"][0]["id"] == "nothing"
        assert http.get("/v2/health/live").status_code == 200
        assert http.get("/v2/health/ready").status_code == 503
        response = http.post("/v1/completions", json={"model": "nothing", "prompt": "x"})
        assert response.status_code == 503 and response.json()["error"]["code"] == "no_replica_ready"
        response = http.post("/v1/chat/completions", json={"model": "nothing", "messages": []})
        assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
        response = http.post("/v1/completions", json={"model": "nothing"})
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
        assert http.post("/v2/models/ensemble/generate", json={}).status_code == 503


def test_a_spec_file_names_every_folder_of_its_deployment_and_nothing_else(tmp_path, tiny_gpt2):
    import yaml

    from hpc.serving.deployment import deployment_folders, published, resolve_target
    from launcher.contracts.layout import JobPaths
    from launcher.contracts.records import EndpointRecord, write_json_atomic
    from tests.e2e import write_spec

    target = resolve_target(str(write_spec(tmp_path, "gw", tiny_gpt2)))
    assert (target.workdir, target.name, target.tokenizer_dir) == ((tmp_path / "runs").resolve(), "gw", tiny_gpt2)
    for folder, name in (("gw-1", "gw"), ("gw-2", "gw"), ("gw-big-1", "gw-big"), ("other-1", "other")):
        (target.workdir / folder).mkdir(parents=True)
        (target.workdir / folder / "spec.yaml").write_text(yaml.safe_dump({"name": name}))
    assert [d.name for d in deployment_folders(target)] == ["gw-1", "gw-2"]
    live, cancelled = JobPaths(target.workdir / "gw-2", "7"), JobPaths(target.workdir / "gw-1", "6")
    for job in (live, cancelled):
        write_json_atomic(job.endpoint(0), EndpointRecord(job_id=job.job_id, address="10.0.0.1", http_port=1).to_dict())
    cancelled.cancel_marker.touch()
    assert [r.job_id for r in published(target)] == ["7"], "a cancelled job's replicas get no new requests"
    (target.workdir / "gw-big-1" / "spec.yaml").write_text(yaml.safe_dump({"name": "gw", "comment": "rendered again"}))
    assert [d.name for d in deployment_folders(target)] == ["gw-1", "gw-2", "gw-big-1"], "names are read again"


def test_a_replica_in_use_survives_two_health_checks_that_time_out_not_a_refusal(tmp_path):
    """A busy server answers health late: its replica stays for SLOW_CHECKS_KEPT timed-out checks (its load
    would otherwise become 503s), while a refused connection or a non-200 drops it at once."""
    from hpc.serving.balancer import Balancer, Replica
    from hpc.serving.deployment import Target
    from hpc.serving.discovery import SLOW_CHECKS_KEPT, Discovery

    balancer = Balancer()
    replica = Replica(key="1/0", http_url="http://a:1", grpc_url="a:2")
    balancer.update([replica])
    discovery = Discovery(Target(tmp_path, "svc", tmp_path), balancer, http=None)  # type: ignore[arg-type]
    assert [discovery._keep(replica, None) for _ in range(SLOW_CHECKS_KEPT + 1)] == [True] * SLOW_CHECKS_KEPT + [False]
    assert discovery._keep(replica, True) and discovery.slow_checks == {}
    assert discovery._keep(replica, None)  # counting starts again after an answer
    assert not discovery._keep(replica, False)
    stranger = Replica(key="2/0", http_url="http://b:1", grpc_url="b:2")
    assert not discovery._keep(stranger, None)  # a replica not in use yet is not taken on a timeout


def _response(texts: list[bytes], logprobs: list[float] | None):
    """A ModelInferResponse as tritonserver sends it (raw contents, as tritonclient's InferInput builds them)."""
    import numpy as np
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import serialize_byte_tensor

    response = service_pb2.ModelInferResponse(model_name="ensemble")
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1, len(texts)])
    response.raw_output_contents.append(serialize_byte_tensor(np.array(texts, dtype=object)).item())
    if logprobs is not None:
        response.outputs.add(name="output_log_probs", datatype="FP32", shape=[1, len(logprobs)])
        response.raw_output_contents.append(np.array(logprobs, dtype=np.float32).tobytes())
    return response


def test_a_responses_text_and_logprobs_are_read_from_the_raw_tensors_as_tritonclient_reads_them():
    import tritonclient.grpc as grpcclient

    from hpc.serving.model_io import text_and_logprobs

    texts = [b"ab", "é✓".encode(), b"", "\U0001f642".encode()[:3]]  # a character split, as streams split them
    response = _response(texts, [-0.5, -1.25, 0.0, -3.0])
    result = grpcclient.InferResult(response)  # what the gateway read before, and clients of Triton read
    assert [bytes(t) for t in result.as_numpy("text_output").ravel()] == texts
    assert text_and_logprobs(response, logprobs=True) == (b"".join(texts), (-0.5, -1.25, 0.0, -3.0))
    assert text_and_logprobs(response, logprobs=False) == (b"".join(texts), ())
    assert text_and_logprobs(_response([b"x"], None), logprobs=True) == (b"x", ())


def test_a_response_without_text_is_none():
    from tritonclient.grpc import service_pb2

    from hpc.serving.model_io import bytes_elements, text_and_logprobs

    assert text_and_logprobs(service_pb2.ModelInferResponse(model_name="ensemble"), logprobs=True) is None
    assert bytes_elements(b"") == []
    assert bytes_elements(b"\x02\x00\x00\x00hi\x00\x00\x00\x00") == [b"hi", b""]


@pytest.mark.slow
def test_a_long_prompt_is_counted_off_the_event_loop_which_goes_on_meanwhile(tiny_gpt2):
    """`Gateway.count_prompt`: the same count as `prompt_tokens`, a short prompt at once, a long one on a worker
    thread while the loop keeps running (its ticks go on: counted on the loop, it would stall every stream)."""
    import asyncio

    from backend.models.tokenizer import RELEASE_GIL_CHARS, load_tokenizer

    gw, _ = _gateway("a")
    gw.tokenizer = load_tokenizer(tiny_gpt2)
    short, long = "Once upon a time", "Once upon a time there was a model. " * 20_000

    async def count() -> tuple[int, int, int]:
        assert gw.count_prompt(short).done(), "a short prompt is counted at once"
        counting = gw.count_prompt(long)
        ticks = 0
        while not counting.done():
            await asyncio.sleep(0.001)
            ticks += 1
        return (await gw.count_prompt(short)), await counting, ticks

    assert len(long) >= RELEASE_GIL_CHARS
    short_n, long_n, ticks = asyncio.run(count())
    assert (short_n, long_n) == (gw.prompt_tokens(short), gw.prompt_tokens(long))
    assert ticks > 10, "the loop ran while the long prompt was counted"
