"""hpc.metrics: the parser view of a Triton metrics page (prometheus_client's parser, real exposition text)."""

from hpc.metrics import parse

PAGE = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 3
nv_inference_request_success{model="tensorrt_llm",version="1"} 3
# HELP nv_inference_request_failure Number of failed inference requests
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="ensemble",reason="BACKEND",version="1"} 0
nv_inference_request_failure{model="ensemble",reason="REJECTED",version="1"} 2
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 16
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 2
# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.25
"""


def test_default_view_keeps_llm_families_and_nonzero_failures():
    samples = parse(PAGE)
    names = {(s.name, s.labels.get("request_type") or s.labels.get("reason") or s.labels.get("model")) for s in samples}
    assert ("nv_trt_llm_request_metrics", "max") in names
    assert ("nv_inference_request_failure_total", "REJECTED") in names
    assert ("nv_inference_request_failure_total", "BACKEND") not in names  # zero failures are hidden
    assert not any(s.name == "nv_cpu_utilization" for s in samples)
    active = [s for s in samples if s.labels.get("request_type") == "active"]
    assert active[0].value == 2.0


def test_all_families_and_zero_failures_on_request():
    samples = parse(PAGE, prefixes=(), hide_zero_failures=False)
    assert any(s.name == "nv_cpu_utilization" for s in samples)
    assert any(s.labels.get("reason") == "BACKEND" for s in samples)
