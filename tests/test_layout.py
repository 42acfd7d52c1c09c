"""launcher/contracts/layout.py and launcher/contracts/records.py: the deployment folder's names, and the records both sides share.

The launcher writes, `hpc` reads, possibly different versions of hpc-serve on the two sides: records of an
older version (no `version` key, fields missing) and of a newer one (fields this one does not know) are read.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from launcher.contracts import job_index, layout, records
from launcher.contracts.layout import Deployment, JobPaths
from launcher.contracts.records import EndpointRecord, RankExitRecord, read_endpoints, read_rank_records


def test_job_paths_match_developers_md(tmp_path: Path) -> None:
    job = Deployment(tmp_path).job("123")
    assert job.folder == tmp_path / "jobs" / "123"
    assert job.endpoint(1) == tmp_path / "jobs/123/endpoints/replica-1.json"
    assert job.rank_record(2) == tmp_path / "jobs/123/ranks/rank-2.json"
    assert job.stopping(0).name == "rank-0.stopping" and job.released(3).name == "rank-3.released"
    assert job.rank_log(4, "err") == tmp_path / "jobs/123/123_4_log.err"
    assert job.cancel_marker.name == "cancel_requested" and job.local_state.name == "local.json"
    assert JobPaths.of_folder(job.folder) == job and JobPaths.is_job_folder(job.folder)
    assert Deployment(tmp_path).sbatch_log("err") == tmp_path / "logs" / "%j.err"
    with pytest.raises(ValueError):
        job.rank_log(0, "log")


def test_rank_logs_are_this_jobs_only(tmp_path: Path) -> None:
    job = JobPaths(tmp_path, "7").create()
    for name in ("7_0_log.err", "7_1_log.err", "7_0_log.out", "17_0_log.err"):
        (job.folder / name).write_text("")
    assert [p.name for p in job.rank_logs("err")] == ["7_0_log.err", "7_1_log.err"]


def test_with_source_root_puts_it_first_once() -> None:
    root = str(layout.SOURCE_ROOT)
    assert layout.with_source_root(None) == root
    assert layout.with_source_root(f"/a:{root}:/b").split(":") == [root, "/a", "/b"]


def test_endpoint_record_round_trip_and_urls(tmp_path: Path) -> None:
    job = JobPaths(tmp_path, "5")
    record = EndpointRecord(
        job_id="5",
        replica=1,
        rank=2,
        host="node2",
        address="10.0.0.6",
        http_port=8000,
        grpc_port=8001,
        metrics_port=8002,
        pid=42,
        started_at=1.0,
        ready_at=2.5,
    )
    records.write_json_atomic(job.endpoint(1), record.to_dict())
    on_disk = json.loads(job.endpoint(1).read_text())
    assert list(on_disk)[:2] == ["version", "job_id"] and on_disk["version"] == records.VERSION
    assert read_endpoints(job) == [record]
    assert (record.http_url, record.grpc_url, record.metrics_url) == (
        "http://10.0.0.6:8000",
        "10.0.0.6:8001",
        "http://10.0.0.6:8002/metrics",
    )


def test_records_of_other_versions_are_read(tmp_path: Path) -> None:
    job = JobPaths(tmp_path, "5").create()
    job.endpoint(0).write_text(json.dumps({"address": "h", "http_port": "8000", "grpc_port": 1, "metrics_port": 2}))
    job.endpoint(1).write_text(
        json.dumps({"version": 9, "address": "h", "http_port": 9000, "replica": 1, "gateway": {"new": "field"}})
    )
    job.rank_record(0).write_text(
        json.dumps({"rank": 0, "host": "n", "exit_code": -9, "signal": "SIGKILL", "log_tail": ["x"], "ended_at": 3.0})
    )  # before records had versions
    old, new = read_endpoints(job)
    assert old.http_port == 8000 and old.replica == 0 and new.version == 9 and new.http_port == 9000
    (rank,) = read_rank_records(job)
    assert rank.failed and rank.signal == "SIGKILL" and rank.error is None and "error" not in rank.to_dict()


def test_readers_skip_partial_and_temporary_files(tmp_path: Path) -> None:
    job = JobPaths(tmp_path, "5").create()
    records.write_json_atomic(job.rank_record(1), RankExitRecord(rank=1, exit_code=0).to_dict())
    job.rank_record(2).write_text('{"rank": 2, "exit')  # being written by hand
    (job.ranks_dir / ".rank-3.json.abc.tmp").write_text("{}")  # write_json_atomic's temporary
    job.endpoint(0).write_text("[]")  # not a record at all
    assert [r.rank for r in read_rank_records(job)] == [1] and read_endpoints(job) == []


def test_template_values_name_the_folder(tmp_path: Path) -> None:
    values = layout.template_values(tmp_path)
    assert values["sub_path"] == str(tmp_path / "tensorrt_llm_triton.sub")
    assert values["restart_count_name"] == "restart_count"
    assert job_index.template_values() == {"index_job_shell": job_index.INDEX_JOB_SHELL}


def test_layout_does_not_import_the_job_index() -> None:
    """The job index builds on layout (JobPaths, the folder names), never the other way: no import cycle, hidden
    or not."""
    tree = ast.parse(Path(layout.__file__).read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert not [name for name in imported if "job_index" in name], imported
