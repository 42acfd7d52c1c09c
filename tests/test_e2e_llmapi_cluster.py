"""The llmapi workflow on the Slurm test cluster: a tp 2 job across node1 and node2, launched by the launcher code a GPU
cluster runs (launcher/node/llmapi.py): rank 0 on node1 runs the engine's leader node and tritonserver (without
the MPI job), rank 1 on node2 a worker node. Clients shaped like upstream's llmapi clients (tritonclient, curl)
against the published endpoint, with the deployment's token in their headers (auth: token; with auth: none they
run unchanged). Then the worker is killed: the job fails at once, `status` names rank 1, and nothing is left.
On a job of its own the leader node is killed: `status` names rank 0, and nothing is left.

`triton.decoupled: false`, upstream's model.yaml default: tritonserver serves upstream's unary calls
(llmapi_client.py, test_llmapi_cancel.py) only on a model that is not decoupled. Streaming, on a decoupled one:
tests/test_llmapi_cpu.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hpc.serving.auth import http_headers
from launcher.contracts.layout import JobPaths
from launcher.contracts.llmapi import (
    CPU_MIN_STEP_VAR,
    IPC_ADDR_VAR,
    IPC_HMAC_KEY_VAR,
    MPI_SIZE_VAR,
    SPAWN_PROXY_VAR,
    STANDIN_DEFAULT_VERSION,
    STANDIN_ROOT,
    STANDIN_VERSION_VAR,
)
from launcher.contracts.records import read_rank_records
from launcher.contracts.trtllm_versions import LEADER_NODE_MODULE, WORKER_NODE_MODULE, has_stop_action
from tests._llmapi import (
    environ_of,
    flag,
    grpc_client,
    inputs,
    job_processes,
    leader_of,
    of_job,
    stop_inputs,
    text_of,
    token_headers,
)
from tests.e2e import (
    CLI,
    cli,
    listening_ports,
    private_job_index,
    processes_under,
    status,
    submit,
    wait_for,
    write_spec,
)
from tests.steps import GPU_PACE_MS, LONG_REQUEST, STEPS_AFTER_STOP

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(400)]
PROMPT = "The current time is"  # test_llmapi_cancel.py's
MODEL = "tensorrt_llm"
CANCELLED = "StatusCode.CANCELLED"
LONG = LONG_REQUEST


@pytest.fixture(scope="module")
def served(slurm_cluster, tritonserver, tiny_gpt2, tmp_path_factory):
    """(job id, endpoint record, token, deployment folder) of the READY job."""
    folder = tmp_path_factory.mktemp("llmapi-tp2")
    job = ""
    with private_job_index(folder):
        try:
            spec = write_spec(
                folder,
                "llmapi-tp2",
                tiny_gpt2,
                tp=2,
                nodes=2,
                workflow="llmapi",
                triton={"decoupled": False},
                env={CPU_MIN_STEP_VAR: str(GPU_PACE_MS)},  # a GPU's pace: a stop crossing a busy machine lands mid-way
            )
            job, job_dir = submit(spec)
            (endpoint,) = status(job)["endpoints"]
            deploy = Path(job_dir).parent.parent
            yield job, endpoint, (deploy / "access_token").read_text().strip(), deploy
        finally:
            if job:
                subprocess.run(["scancel", job], capture_output=True, check=False)


def test_rank0_runs_the_leader_node_and_tritonserver_and_rank1_a_worker(served):
    job, endpoint, _, deploy = served
    assert status(job)["state"] == "READY" and endpoint["host"] == "node1" and endpoint["rank"] == 0
    (server,) = job_processes(deploy, "tritonserver --model-repository")
    (leader,) = job_processes(deploy, LEADER_NODE_MODULE, job)
    (worker,) = job_processes(deploy, WORKER_NODE_MODULE, job)
    served_ports = {endpoint["http_port"], endpoint["grpc_port"], endpoint["metrics_port"]}
    assert listening_ports(worker).isdisjoint(served_ports), "a worker node serves nothing (MPI's TCP port only)"
    assert served_ports <= listening_ports(server)
    server_env, leader_env = environ_of(server), environ_of(leader)
    assert server_env[SPAWN_PROXY_VAR] == "1" and server_env[IPC_ADDR_VAR] == leader_env[IPC_ADDR_VAR]
    assert server_env[IPC_HMAC_KEY_VAR] == leader_env[IPC_HMAC_KEY_VAR]
    assert not [k for k in server_env if k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))], "tritonserver: no MPI job"
    assert leader_env["SLURM_PROCID"] == "0" and environ_of(worker)["SLURM_PROCID"] == "1"
    assert environ_of(worker)["SLURMD_NODENAME"] == "node2"
    for env in (leader_env, environ_of(worker)):  # what trtllm-llmapi-launch exports on every rank
        assert env[SPAWN_PROXY_VAR] == "1" and env[MPI_SIZE_VAR] == "2"
    standin = str(deploy / "python" / STANDIN_ROOT)
    for env in (server_env, leader_env, environ_of(worker)):  # backend cpu: `import tensorrt_llm` is the stand-in
        assert env["PYTHONPATH"].split(os.pathsep)[0] == standin, env["PYTHONPATH"]


def test_llmapi_client_and_the_cancel_sequence_of_test_llmapi_cancel(served):
    """llmapi_client.py's unary call (text_input, sampling_param_max_tokens, request id "1", parameter Streaming),
    then test_llmapi_cancel.py: stop before any request, a request, stop after it, the same request again under
    another id gives the same greedy text; across the two nodes' ranks."""
    from tritonclient.utils import InferenceServerException

    _, endpoint, token, _ = served
    client, headers = grpc_client(endpoint), token_headers(token)
    text = "Born in north-east France, Soyer trained as a"
    answer = client.infer(MODEL, inputs(text, 16), request_id="1", parameters={"Streaming": False}, headers=headers)
    assert text_of(answer).startswith(text) and len(text_of(answer)) > len(text), "the prompt is echoed, then text"
    request = inputs(PROMPT, 100)
    with pytest.raises(InferenceServerException) as stopped:
        client.infer(MODEL, stop_inputs(), request_id="1", parameters={"Streaming": False}, headers=headers)
    assert stopped.value.status() == CANCELLED
    first = client.infer(MODEL, request, request_id="1", parameters={"Streaming": False}, headers=headers)
    with pytest.raises(InferenceServerException) as again:
        client.infer(MODEL, stop_inputs(), request_id="1", parameters={"Streaming": False}, headers=headers)
    assert again.value.status() == CANCELLED
    second = client.infer(MODEL, request, request_id="2", parameters={"Streaming": False}, headers=headers)
    assert np.array_equal(first.as_numpy("text_output"), second.as_numpy("text_output"))


def test_a_stop_by_request_id_ends_a_generation_in_flight(served):
    """llmapi_client.py --stop-after-ms: a second call with the same id and `stop`; once the engine is generating
    (its step counter moved), the stop ends it: both calls CANCELLED, the engine idle again."""
    from tritonclient.utils import InferenceServerException

    job, endpoint, token, deploy = served
    leader, headers = leader_of(deploy, job), token_headers(token)
    start = leader.stats()
    done: list = []
    client = grpc_client(endpoint)
    client.async_infer(
        MODEL, inputs(PROMPT, LONG), lambda result, error: done.append((result, error)), request_id="7", headers=headers
    )
    sent = leader.wait_for("the request generating", lambda s: s.iterations >= start.iterations + 5)
    with pytest.raises(InferenceServerException) as stopped:
        grpc_client(endpoint).infer(MODEL, stop_inputs(), request_id="7", headers=headers)
    assert stopped.value.status() == CANCELLED
    after = leader.wait_for("nothing in flight", lambda s: s.active_requests == 0 and s.waiting_requests == 0)
    assert after.iterations - sent.iterations <= STEPS_AFTER_STOP, "stopped mid-way"
    wait_for(lambda: done, 30, "the stopped call's answer")
    assert done[0][0] is None and done[0][1].status() == CANCELLED


def test_curl_generate_with_sampling_param_max_tokens(served):
    """TensorRT-LLM's README: `curl -X POST .../v2/models/tensorrt_llm/generate -d '{"text_input": ...,
    "sampling_param_max_tokens": N}'`, with the token; without it, tritonserver's 403 (a restricted API)."""
    _, endpoint, token, _ = served
    url = f"http://{endpoint['address']}:{endpoint['http_port']}/v2/models/{MODEL}/generate"
    body = json.dumps({"text_input": PROMPT, "sampling_param_max_tokens": 8, "return_finish_reason": True})
    out = subprocess.run(
        ["curl", "-sS", "-X", "POST", url, "-H", f"Authorization: Bearer {token}", "-d", body],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    answer = json.loads(out)
    assert answer["text_output"].startswith(PROMPT) and answer["finish_reason"] == "length", answer
    refused = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", url, "-d", body],
                             capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    assert refused == "403"


@pytest.mark.parametrize(
    ("case", "extra", "words"),
    [
        ("no text_input", {"text": None}, "text_input is missing from the request"),
        ("max tokens 0", {"max_tokens": 0}, "sampling_param_max_tokens"),
        ("NaN temperature", {"sampling_param_temperature": np.array([np.nan], np.float32)}, "temperature"),
        ("invalid UTF-8", {"text": b"\xff\xfe"}, "utf-8"),
        ("100k-character prompt", {"text": "word " * 20_000}, "should not exceed max_seq_len"),
    ],
)
def test_bad_input_is_an_error_naming_it_and_the_job_serves_on(served, case, extra, words):
    from tritonclient.utils import InferenceServerException

    _, endpoint, token, _ = served
    kwargs = {k: extra.pop(k) for k in ("text", "max_tokens") if k in extra}
    with pytest.raises(InferenceServerException) as bad:
        grpc_client(endpoint).infer(MODEL, inputs(**kwargs, **extra), request_id=case, headers=token_headers(token))
    assert words.lower() in bad.value.message().lower(), bad.value.message()
    assert text_of(grpc_client(endpoint).infer(MODEL, inputs(PROMPT, 4), headers=token_headers(token)))


def test_our_clients_serve_a_model_that_is_not_decoupled(served):
    """`hpc-serve generate` and hpc.client on this job (triton.decoupled false): the endpoint record says so, and
    they ask for one whole response (`streaming` false), streamed or not, the same greedy text."""
    from hpc.client import Client

    job, _, _, _ = served
    whole = cli("generate", job, PROMPT, "--max-tokens", "8", "--direct").stdout.strip()
    streamed = cli("generate", job, PROMPT, "--max-tokens", "8", "--direct", "--stream").stdout.strip()
    assert whole and whole == streamed
    with Client(job, gateway=False) as client:
        assert client.generate(PROMPT, max_tokens=8).strip() == whole


def _http_inputs(text: str, **arrays: np.ndarray) -> list:
    """end_to_end_test.py's and benchmark_core_model.py's tensors over HTTP (utils.prepare_tensor("http")):
    `text_input` BYTES [1], then whatever else the tool adds, in the dtype it sends."""
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, arr in {"text_input": np.array([text], dtype=object), **arrays}.items():
        tensor = httpclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        tensor.set_data_from_numpy(arr)
        out.append(tensor)
    return out


def test_benchmark_core_model_test_llmapi_sends_200_at_once_and_all_are_answered(served):
    """benchmark_core_model.py --test-llmapi, its default protocol (HTTP, concurrency 128): 10 warm-up `infer`s,
    then 200 `async_infer`s at once (request ids "0".."199"; text_input + sampling_param_max_tokens INT32),
    read with get_result() as utils.get_http_results does. Every one is answered, across both nodes' ranks, and
    each prompt's greedy text is the same whichever request carried it."""
    import tritonclient.http as httpclient

    _, endpoint, token, _ = served
    url = f"{endpoint['address']}:{endpoint['http_port']}"
    client = httpclient.InferenceServerClient(url, concurrency=128, network_timeout=300.0)
    headers = http_headers(token)
    prompts = [PROMPT, "Born in north-east France, Soyer trained as a", "The capital of"]

    def request(i: int) -> list:
        return _http_inputs(prompts[i % 3], sampling_param_max_tokens=np.array([4 + i % 3], np.int32))

    for i in range(10):
        client.infer(MODEL, request(i), request_id=str(i), headers=headers)
    pending = [client.async_infer(MODEL, request(i), request_id=str(i), headers=headers) for i in range(200)]
    texts = [r.get_result().as_numpy("text_output")[0].decode() for r in pending]  # an error raises here
    client.close()
    assert len(texts) == 200 and all(t.startswith(prompts[i % 3]) for i, t in enumerate(texts))
    assert all(len({texts[i] for i in range(k, 200, 3)}) == 1 for k in range(3)), "greedy: one text per prompt"


def test_end_to_end_test_test_llmapi_functionality_over_http(served):
    """end_to_end_test.py --test-llmapi: one `infer` per prompt with request_id str(i), asking `text_output` and,
    with --output-config, `finish_reason`. Its --sampling-params sends each value in numpy's dtype of the Python
    value (an int as INT64, a float as FP64), which the model's INT32/FP32 inputs refuse: tritonserver names the
    input and both types, and the job serves on."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    _, endpoint, token, _ = served
    client = httpclient.InferenceServerClient(f"{endpoint['address']}:{endpoint['http_port']}")
    headers = http_headers(token)
    asked = [httpclient.InferRequestedOutput("text_output"), httpclient.InferRequestedOutput("finish_reason")]
    for i, text in enumerate([PROMPT, "The capital of"]):
        tensors = _http_inputs(
            text, sampling_param_max_tokens=np.array([6], np.int32), return_finish_reason=np.array([True])
        )
        result = client.infer(MODEL, tensors, outputs=asked, request_id=str(i), headers=headers)
        assert result.as_numpy("text_output")[0].decode().startswith(text)
        assert result.as_numpy("finish_reason")[0].decode() == "length"
    for name, value, kind in (("sampling_param_temperature", 0.5, "FP64"), ("sampling_param_top_k", 4, "INT64")):
        with pytest.raises(InferenceServerException) as wrong:
            client.infer(MODEL, _http_inputs(PROMPT, **{name: np.array([value])}), headers=headers)
        assert f"{name}' data-type is '{kind}'" in wrong.value.message(), wrong.value.message()
    assert client.infer(MODEL, _http_inputs(PROMPT), headers=headers).as_numpy("text_output")[0]


def test_a_killed_worker_fails_the_job_naming_rank_1_and_leaves_nothing(served):
    """Last (it ends the job): SIGKILL rank 1's worker node on node2. The replica fails at once, `status` says
    which rank and how, and no process of the job is left on either node."""
    job, _, _, deploy = served
    (worker,) = job_processes(deploy, WORKER_NODE_MODULE, job)
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: status(job)["state"] == "FAILED", 60, "the job to fail")
    shown = cli("status", job, check=False).stdout
    assert "rank 1 on node2" in shown and "SIGKILL" in shown, shown
    wait_for(lambda: not processes_under(deploy) and not of_job(job), 60, "no process of the job left")
    assert JobPaths(deploy, job).rank_record(0).exists(), "rank 0 says why it stopped too"


def test_a_killed_leader_node_fails_the_job_naming_rank_0_and_leaves_nothing(
    slurm_cluster, tritonserver, tiny_gpt2, tmp_path
):
    """SIGKILL rank 0's leader node on node1 (the engine tritonserver's model talks to) of a job of its own:
    `status` heads the failure with rank 0, the signal and the leader node, not with rank 1 (which Slurm may kill
    before its launcher writes a record), and no process of the job is left on either node."""
    job = ""
    with private_job_index(tmp_path):
        try:
            spec = write_spec(tmp_path, "llmapi-leader", tiny_gpt2, tp=2, nodes=2, workflow="llmapi", auth="none")
            job, job_dir = submit(spec)
            deploy = Path(job_dir).parent.parent
            (leader,) = job_processes(deploy, LEADER_NODE_MODULE, job)
            os.kill(leader, signal.SIGKILL)
            wait_for(lambda: status(job)["state"] == "FAILED", 60, "the job to fail")
            shown = cli("status", job, check=False).stdout
            assert "rank 0 on node1 exited with signal SIGKILL: the leader node" in shown, shown
            wait_for(lambda: not processes_under(deploy) and not of_job(job), 60, "no process of the job left")
        finally:
            if job:
                subprocess.run(["scancel", job], capture_output=True, check=False)


@pytest.mark.parametrize("release", ["1.0.0", "1.1.0", STANDIN_DEFAULT_VERSION, "0.20.0"])
def test_an_ordered_stop_of_tp2_ends_every_process_as_its_release_ends_it_and_kills_nothing(
    slurm_cluster, tritonserver, tiny_gpt2, tmp_path, release
):
    """`hpc-serve cancel` of a tp 2 job across node1/node2, as TensorRT-LLM `release` ends its leader node: from
    1.0 on the launcher sends `mgmn_leader_node --action stop` once tritonserver exited (the LLM's shutdown
    leaves it running), before 1.0 the LLM's shutdown ends it (and no --action is sent: that module takes none).
    Either way the job ends CANCELLED (what was asked), no process is left, and the launcher never had to SIGTERM or SIGKILL the
    leader node; the worker node was released by it (exit 0)."""
    job = ""
    with private_job_index(tmp_path):
        try:
            spec = write_spec(
                tmp_path, "llmapi-stop", tiny_gpt2, tp=2, nodes=2, workflow="llmapi", env={STANDIN_VERSION_VAR: release}
            )
            job, job_dir = submit(spec)
            deploy = Path(job_dir).parent.parent
            cli("cancel", job)
            wait_for(lambda: status(job)["state"] not in ("READY", "RUNNING", "STOPPING"), 120, "the job to end")
            assert status(job)["state"] == "CANCELLED", cli("status", job, check=False).stdout
            wait_for(lambda: not processes_under(deploy) and not of_job(job), 60, "no process of the job left")
            logs = "\n".join(p.read_text() for p in JobPaths(deploy, job).rank_logs("err"))
            logs += "\n".join(p.read_text() for p in JobPaths(deploy, job).rank_logs("out"))
            assert f"tensorrt_llm {release}" in logs, logs[-3000:]
            assert ("--action stop" in logs) == has_stop_action(release), logs[-3000:]
            records = read_rank_records(JobPaths(deploy, job))
            assert sorted((r.rank, r.exit_code, r.signal) for r in records) == [(0, 0, None), (1, 0, None)]
            (rank0,) = [r for r in records if r.rank == 0]
            assert (rank0.leader_node_exit, rank0.leader_node_signal) == (0, None), "it ended as its release ends it"
        finally:
            if job:
                subprocess.run(["scancel", job], capture_output=True, check=False)


def test_an_ordered_stop_waits_for_the_generation_in_flight_by_the_engines_metrics(
    slurm_cluster, tritonserver, tiny_gpt2, tmp_path
):
    """The drain of an llmapi replica knows what is in flight from the model's engine metrics
    (nv_trt_llm_request_metrics): a stream started before `hpc-serve cancel` runs to its last token, and only then
    does the leader SIGTERM tritonserver, saying why ("nothing in flight ... tritonserver's metrics"), well before
    the drain time; nothing is killed. Streamed the way NVIDIA's llmapi client streams (gRPC, `streaming` true)."""
    import queue

    job = ""
    with private_job_index(tmp_path):
        try:
            paced = {CPU_MIN_STEP_VAR: str(GPU_PACE_MS)}
            job, job_dir = submit(
                write_spec(tmp_path, "llmapi-drain", tiny_gpt2, tp=2, nodes=2, workflow="llmapi", env=paced)
            )
            deploy = Path(job_dir).parent.parent
            (endpoint,) = status(job)["endpoints"]
            token = (deploy / "access_token").read_text().strip()
            paths = JobPaths(deploy, job)

            def sigterm_sent() -> str:
                logs = "\n".join(p.read_text() for p in paths.rank_logs("err"))
                return next((line for line in logs.splitlines() if "sending SIGTERM to tritonserver" in line), "")

            client = grpc_client(endpoint)
            events: queue.Queue = queue.Queue()

            def arrived(result, error) -> None:  # whether the SIGTERM was sent, read as each response arrives
                events.put((result, error, bool(sigterm_sent())))

            client.start_stream(callback=arrived, headers=token_headers(token))
            request = inputs(
                PROMPT,
                LONG // 2,
                streaming=flag(),
                sampling_param_ignore_eos=flag(),
                sampling_param_logprobs=np.array([1], np.int32),  # one a token: counts the tokens of each response
            )
            client.async_stream_infer(MODEL, request, request_id="drain")
            first, error, _ = events.get(timeout=60)
            assert error is None, error
            cancel = subprocess.Popen([*CLI, "cancel", job], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            tokens = len(first.as_numpy("output_log_probs") if first.as_numpy("output_log_probs") is not None else [])
            while True:
                result, error, stopped = events.get(timeout=60)
                assert error is None, error
                logprobs = result.as_numpy("output_log_probs")
                tokens += len(logprobs) if logprobs is not None else 0
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            assert not stopped, "tritonserver was told to stop while a generation was in flight"
            client.stop_stream()
            # a response may carry several tokens (those that waited for a busy sender go together)
            assert tokens == LONG // 2, "every token of the generation in flight came"
            assert cancel.wait(120) == 0, cancel.stdout.read() if cancel.stdout else ""
            reason = wait_for(sigterm_sent, 60, "the leader's SIGTERM to tritonserver")
            assert "nothing in flight" in reason and "metrics" in reason, reason
            wait_for(lambda: status(job)["state"] not in ("READY", "RUNNING", "STOPPING"), 120, "the job to end")
            records = read_rank_records(paths)
            assert sorted((r.rank, r.exit_code, r.signal) for r in records) == [(0, 0, None), (1, 0, None)]
        finally:
            if job:
                subprocess.run(["scancel", job], capture_output=True, check=False)
