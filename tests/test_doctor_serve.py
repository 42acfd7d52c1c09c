"""`hpc-serve doctor --serve` without a cluster: each battery verdict from what was measured, the stop string it
picks, the doctor's shape of a spec, which models it runs, and the CLI's refusal without a SPEC. The run against a
job: tests/test_doctor_serve_cluster.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpc.doctor.battery import (
    Answer,
    Battery,
    bad_request_verdict,
    concurrent_verdict,
    gone_verdict,
    length_verdict,
    metrics_verdict,
    pick_stop,
    stop_verdict,
    streamed_verdict,
    unary_verdict,
)
from hpc.doctor.report import exit_code
from hpc.doctor.serve import models_to_run, smallest
from hpc.doctor.serve import stop_verdict as ordered_stop_verdict
from hpc.jobs.status import JobStatus
from hpc.spec import Spec
from launcher.contracts.llmapi import IMAGE_MODEL, OWN_MODEL
from launcher.contracts.records import RankExitRecord
from tests.e2e import cli


def spec(tmp_path: Path, **over) -> Spec:
    data: dict[str, Any] = {
        "name": "s",
        "workdir": str(tmp_path),
        "model": {"backend": "cpu", "workflow": "llmapi", "checkpoint_dir": str(tmp_path), "tp_size": 2},
        "slurm": {"nodes": 4, "ntasks_per_node": 1},
        "replicas": 2,
    }
    for key, value in over.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
    return Spec.model_validate(data)


def test_smallest_shape_keeps_tp_drops_replicas_gateway_renew_and_renames(tmp_path):
    small = smallest(spec(tmp_path, gateway={"enabled": True}), OWN_MODEL)
    assert (small.replicas, small.slurm.nodes, small.slurm.ntasks_per_node, small.model.tp_size) == (1, 2, 1, 2)
    assert small.gateway is None and small.renew is None and small.name == "s-doctor"
    shared = smallest(spec(tmp_path, slurm={"nodes": 1, "ntasks_per_node": 4}), OWN_MODEL)  # replicas share a node
    assert (shared.slurm.nodes, shared.slurm.ntasks_per_node) == (1, 2)


def test_smallest_shape_writes_the_specs_model_yaml(tmp_path):
    """model.yaml of the doctor's job is the spec's: llm_api keys not given stay out (a `kv_cache_config: null`
    written for one would fail TensorRT-LLM's update_llm_args_with_extra_dict, and the job with it)."""
    from hpc.render.llmapi import model_yaml_args
    from launcher.contracts.llmapi import KV_EVENT_BUFFER

    given = spec(tmp_path, llm_api={"max_batch_size": 4})
    assert model_yaml_args(smallest(given, OWN_MODEL)) == model_yaml_args(given)
    # not given: no `null`; only what render adds for hpc-serve's model (its KV-cache events, for routing)
    assert model_yaml_args(smallest(given, OWN_MODEL))["kv_cache_config"] == {"event_buffer_max_size": KV_EVENT_BUFFER}


def test_models_on_cpu_are_ours_only_and_say_so(tmp_path):
    cpu = spec(tmp_path)
    assert models_to_run(cpu, "spec") == ([OWN_MODEL], [])
    models, notes = models_to_run(cpu, "both")
    assert models == [OWN_MODEL] and notes[0].status == "skip" and "backend cpu" in notes[0].detail
    gpu = spec(tmp_path, model={"backend": "tensorrtllm"}, slurm={"gpus_per_node": 1})
    assert models_to_run(gpu, "both") == ([OWN_MODEL, IMAGE_MODEL], [])


def test_unary_and_streamed():
    assert unary_verdict(Answer(text="P and more", events=1), "P").status == "ok"
    assert unary_verdict(Answer(text="P", events=1), "P").status == "fail"
    assert unary_verdict(Answer(error="boom"), "P").status == "fail"
    assert streamed_verdict(Answer(text="ab", events=5, first_s=0.1, total_s=0.5), False).status == "ok"
    one = streamed_verdict(Answer(text="ab", events=1, first_s=0.5, total_s=0.5), True)
    assert one.status == "fail" and "positionally" in one.fix


def test_stop_string_picked_after_the_start_and_verdicts():
    text = "abc The quick brown fox jumps"
    stop = pick_stop(text, None)
    assert stop is not None and text.index(stop) >= len(text) // 4
    ended = Answer(text=text[: text.index(stop)], finish_reason="stop")
    assert stop_verdict(text, stop, ended, image=False).status == "ok"
    assert stop_verdict(text, stop, Answer(text=text, finish_reason="length"), image=False).status == "fail"
    upstream = stop_verdict(text, stop, Answer(error="Error generating request: TypeError"), image=True)
    assert upstream.status == "warn" and "known upstream failure" in upstream.detail
    assert stop_verdict(text, stop, Answer(error="x"), image=False).status == "fail"


def test_length_verdict():
    assert length_verdict(Answer(text="x", finish_reason="length"), 24, 24).status == "ok"
    assert length_verdict(Answer(text="x", finish_reason="length"), 24, 23).status == "fail"
    assert length_verdict(Answer(text="x", finish_reason="stop"), 24, None).status == "fail"
    cut = length_verdict(Answer(text="a\ufffdb", finish_reason="length"), 24, 26)
    assert cut.status == "ok" and "not counted" in cut.detail


def test_client_gone_concurrent_bad_request_metrics():
    left, after = Answer(text="x", events=3, left=True), Answer(text="y", events=1)
    assert gone_verdict(left, True, True, 0.2, after).status == "ok"
    unseen = gone_verdict(left, True, False, 0.0, after)
    assert unseen.status == "ok" and "never showed" in unseen.detail
    assert gone_verdict(left, True, True, None, after).status == "fail"  # the engine kept the request
    assert gone_verdict(Answer(text="x", events=9), True, True, None, after).status == "fail"  # never left
    assert concurrent_verdict([after] * 16, 1.0).status == "ok"
    assert concurrent_verdict([after] * 15 + [None], 1.0).status == "fail"
    named = [("sampling_param_max_tokens", Answer(error="input 'sampling_param_max_tokens' must be at least 1"))]
    assert bad_request_verdict(named, after, image=False).status == "ok"
    assert bad_request_verdict([("sampling_param_max_tokens", Answer(error="bad"))], after, False).status == "fail"
    assert bad_request_verdict([("sampling_param_max_tokens", Answer(error="bad"))], after, True).status == "warn"
    assert bad_request_verdict([("sampling_param_max_tokens", after)], after, image=False).status == "fail"
    families = {"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"}
    assert metrics_verdict(families, False).status == "ok"
    assert metrics_verdict(set(), False).status == "fail"
    assert metrics_verdict(set(), True).status == "skip"


def test_ordered_stop_verdict_and_exit_code():
    ended = JobStatus("7", "CANCELLED")
    clean = [RankExitRecord(rank=r, exit_code=0, ended_at=103.0) for r in (0, 1)]
    good = ordered_stop_verdict(ended, clean, 2, 100.0, 5.0, [])
    assert good.status == "ok" and "3.0 s" in good.detail and exit_code([good]) == 0
    killed = ordered_stop_verdict(
        ended, [clean[0], RankExitRecord(rank=1, exit_code=137, signal="SIGKILL")], 2, 100.0, 5, []
    )
    assert killed.status == "fail" and exit_code([good, killed]) == 1
    signalled = ordered_stop_verdict(ended, clean, 2, 100.0, 5.0, ["rank 0's leader node: SIGTERM"])
    assert signalled.status == "fail"
    assert ordered_stop_verdict(ended, clean[:1], 2, 100.0, 5.0, []).status == "fail"  # rank 1 wrote nothing
    assert ordered_stop_verdict(JobStatus("7", "CANCELLING"), clean, 2, 100.0, 5.0, []).status == "fail"
    slow = [RankExitRecord(rank=r, exit_code=0, ended_at=125.0) for r in (0, 1)]
    assert ordered_stop_verdict(ended, slow, 2, 100.0, 30.0, []).status == "warn"


@pytest.mark.slow
def test_serve_needs_a_spec():
    proc = cli("doctor", "--serve", check=False)
    assert proc.returncode == 2 and "--serve needs a SPEC" in proc.stderr


class _Unreachable:
    """A replica every request to which fails (what a model that cannot serve looks like to the battery)."""

    def __getattr__(self, name: str) -> Any:
        raise ConnectionError(f"{name}: the replica does not answer")


@pytest.mark.parametrize(
    ("model", "selectable", "hinted"),
    [(OWN_MODEL, True, True), (OWN_MODEL, False, False), (IMAGE_MODEL, True, False)],
)
def test_a_failed_row_of_our_model_suggests_the_images_where_it_can_serve(model, selectable, hinted):
    """hpc-serve's model has met TensorRT-LLM only through the CPU stand-in: on backend tensorrtllm each failed
    row of it says to try the image's model.py (model.llmapi_model: image) and report the row; not on backend
    cpu (there is no image's model there), and never on the image's own rows."""
    rows = Battery(_Unreachable(), model, image_selectable=selectable).run(say=lambda line: None)  # type: ignore[arg-type]
    failed = [r for r in rows if r.status == "fail"]
    assert failed, rows
    assert all(("model.llmapi_model: image" in r.fix) == hinted for r in failed), failed
    assert all(r.fix.startswith("read rank 0's log") for r in failed), "the row's own fix comes first"
