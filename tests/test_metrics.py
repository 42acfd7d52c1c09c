"""hpc.serving.metrics and launcher/contracts/prometheus.py: the one parser of a Triton metrics page (real exposition text), its view
in `hpc-serve metrics`, and the requests in flight the drain reads from it."""

import pytest

from hpc.serving.metrics import parse
from launcher.contracts.prometheus import samples
from launcher.contracts.renew_plan import active_requests

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


# ------------------------------------------------------------------------------------------------ the one parser
#: what tritonserver's page may hold beyond PAGE: escapes in label values, a brace and a comma in one, a
#: timestamp, a histogram, NaN/Inf, a family with HELP only, comments that are neither HELP nor TYPE
ODD_PAGE = (
    PAGE
    + r"""# a comment
# TYPE nv_llm_output_token_len histogram
nv_llm_output_token_len_bucket{model="tensorrt_llm",version="1",le="10"} 1
nv_llm_output_token_len_bucket{model="tensorrt_llm",version="1",le="+Inf"} 2
nv_llm_output_token_len_sum{model="tensorrt_llm",version="1"} 12
nv_llm_output_token_len_count{model="tensorrt_llm",version="1"} 2
# HELP nv_inference_count Number of inferences performed
# TYPE nv_inference_count counter
nv_inference_count{model="a \"quoted\" \\ name,}",version="1"} 7 1700000000000
# TYPE nv_energy_consumption_total counter
nv_energy_consumption_total{gpu_uuid="GPU-1"} 3.5e3
# HELP nv_help_only only help
nv_help_only{a="1",} NaN
nv_untyped +Inf
"""
)


def test_the_parser_reads_a_page_as_prometheus_client_does():
    """The launcher's stdlib parser, in hpc.serving.metrics' view, against prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    def key(name: str, labels: dict, value: float) -> tuple:
        return name, labels, "nan" if value != value else value

    theirs = [
        key(s.name, dict(s.labels), float(s.value)) for f in text_string_to_metric_families(ODD_PAGE) for s in f.samples
    ]
    assert [key(s.name, s.labels, s.value) for s in parse(ODD_PAGE, prefixes=(), hide_zero_failures=False)] == theirs
    assert ("nv_inference_count_total", {"model": 'a "quoted" \\ name,}', "version": "1"}, 7.0) in theirs


def test_a_line_that_is_no_sample_is_named_by_its_number():
    with pytest.raises(ValueError, match="metrics line 3: "):
        list(samples('# TYPE x gauge\nx 1\nx{a="1" 2\n'))
    with pytest.raises(ValueError, match="metrics line 1: "):
        list(samples("x{a=1} 2\n"))


def test_requests_in_flight_read_from_any_label_order_and_value():
    page = (
        "# HELP nv_trt_llm_request_metrics TRT LLM request metrics\n"
        "# TYPE nv_trt_llm_request_metrics gauge\n"
        'nv_trt_llm_request_metrics{request_type="waiting",model="a}b",version="1"} 1\n'
        'nv_trt_llm_request_metrics{model="a}b",request_type="active",version="1"} 2\n'
        'nv_trt_llm_request_metrics{model="a}b",request_type="max",version="1"} 64\n'
        "# TYPE nv_inference_pending_request_count gauge\n"
        'nv_inference_pending_request_count{model="ensemble",version="1"} 4\n'
    )
    assert active_requests(page) == 7, "a brace inside a label value hid the line from the old regex"
    assert active_requests(page + "nv_trt_llm_request_metrics{broken 1\n") is None, "a page it cannot read"
    assert active_requests(page.replace("} 2\n", "} NaN\n")) is None


def test_the_snapshot_table_folds_long_metric_names_instead_of_cutting_them():
    """At 80 columns (a terminal's default, and rich's when piped) a cut would end every gateway family's name in
    "…" at the same place: eight rows would read "hpc_serve_gateway_replica_…"."""
    from rich.console import Console

    from hpc.bench.metrics_view import snapshot_table
    from hpc.bench.replica_metrics import Snapshot

    names = [f"hpc_serve_gateway_replica_{what}" for what in ("draining", "kv_missed_blocks", "outstanding")]
    snapshot = Snapshot(at=0.0, values={"3207@hpcserve/0": dict.fromkeys(names, 1.0)})
    console = Console(width=80, record=True)
    console.print(snapshot_table(snapshot))
    text = "".join(line.split("│")[1].strip() for line in console.export_text().splitlines() if line.count("│") > 2)
    assert all(name in text for name in names), console.export_text()


def test_the_rates_table_fits_80_columns_without_its_empty_columns_and_uncut_headers():
    """`metrics --watch` of a replica without a gateway (the llmapi default): the gateway's columns and those its
    pages have no figure for are left out, and no header is cut (it read `repl…`, `requ…`, `toke…`)."""
    from rich.console import Console

    from hpc.bench.metrics_view import rates_table
    from hpc.bench.replica_metrics import Snapshot, key_of

    def page(done: float) -> dict[str, float]:
        return {
            key_of("nv_inference_request_success", {"model": "tensorrt_llm"}): done,
            key_of("nv_inference_request_failure", {"model": "tensorrt_llm", "reason": "REJECTED"}): 0.0,
        }

    before = Snapshot(at=0.0, values={"3207@hpcserve/0": page(10)})
    now = Snapshot(at=2.0, values={"3207@hpcserve/0": page(30)})
    console = Console(width=80, record=True)
    console.print(rates_table(before, now))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "replica" in text and "req/s" in text and "10.00" in text, text
    assert "…" not in text and "in flight (gw)" not in text and "KV reuse" not in text, text
