"""The files of an ordered stop as typed records (launcher/contracts/stop_records.py): each written by its one writer and
read by its one reader through the same definition, a bash script's included (its printf format comes from the
record: `Record.shell_format`)."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend.cpu_engine.parallel import drain_deadline, report_drain
from launcher.contracts.records import VERSION, Record
from launcher.contracts.stop_records import (
    BY_TIME_LIMIT,
    DRAINED,
    DRAINING,
    DrainingMark,
    DrainReport,
    StopNotice,
    StopRequest,
    is_final,
    stop_request_format,
)
from launcher.node.stop import LeaderDrain

pytestmark = pytest.mark.timeout(30)


def printf(fmt: str, *args: str) -> str:
    """What bash's printf writes for `fmt` and `args`, as a script does."""
    command = " ".join(["printf", shlex.quote(fmt), *map(shlex.quote, args)])
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize(
    "record",
    [
        StopRequest(at=1.5, by="cancel"),
        StopNotice(signal="SIGUSR1", at=2.0, drain_until=12.0, drain_file="/d/jobs/1/ranks/rank-0.drain"),
        StopNotice(signal="SIGTERM", at=2.0, drain_until=12.0),
        DrainReport(state=DRAINING, at=3.0),
        DrainingMark(at=4.0, successor="35"),
        DrainingMark(at=5.0, final=True),
    ],
)
def test_each_record_reads_back_as_written(tmp_path: Path, record: Record) -> None:
    record.write(tmp_path / "file")
    assert type(record).read(tmp_path / "file") == record
    assert record.to_dict()["version"] == VERSION


def test_a_missing_or_broken_file_reads_as_none_and_a_broken_one_is_said_once(tmp_path: Path, capsys) -> None:
    """Records are written whole, so only "not there" is silent: a file that is not JSON, or JSON that does not fit
    the record's schema (a bug, a hand edit), reads as none and is said once on stderr, naming the file."""
    assert StopNotice.read(tmp_path / "none") is None
    assert not is_final(tmp_path / "none")
    assert capsys.readouterr().err == ""
    (tmp_path / "half").write_text('{"signal": "SIGTERM", "at"')
    (tmp_path / "unfit").write_text('{"signal": "SIGTERM"}')  # no `at`, no `drain_until`
    for _ in range(2):
        assert StopNotice.read(tmp_path / "half") is None and StopNotice.read(tmp_path / "unfit") is None
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and all("is not a readable StopNotice" in line for line in said), said
    assert str(tmp_path / "half") in said[0] and str(tmp_path / "unfit") in said[1]


def test_the_subs_stop_request_is_the_record(tmp_path: Path) -> None:
    """The `.sub`'s trap writes its StopRequest with printf and render's format: what the record reads."""
    now = int(time.time())
    request = StopRequest.from_dict(json.loads(printf(stop_request_format(), str(now))))
    assert (request.at, request.by, request.version) == (now, BY_TIME_LIMIT, VERSION)


@dataclass(frozen=True, kw_only=True)
class Sample(Record):
    version: int = VERSION
    step: int
    name: str
    rate: float = 0.0
    note: str = ""


def test_a_shell_format_escapes_what_printf_would_read(tmp_path: Path) -> None:
    fmt = Sample.shell_format(["step", "name", "rate"], note='50% of "a\\b"')
    written = printf(fmt, "3", "convert", "1.5")
    assert Sample.from_dict(json.loads(written)) == Sample(step=3, name="convert", rate=1.5, note='50% of "a\\b"')
    with pytest.raises(ValueError, match="fields' order"):
        Sample.shell_format(["name", "step"])


def test_the_models_drain_report_is_what_the_launcher_reads(tmp_path: Path) -> None:
    """The launcher's stop notice → the CPU engine's deadline and report → the launcher's LeaderDrain."""
    notice = StopNotice(signal="SIGTERM", at=1.0, drain_until=11.0, drain_file=str(tmp_path / "rank-0.drain"))
    notice.write(tmp_path / "rank-0.stopping")
    env = {"HPC_SERVE_STOP_FILE": str(tmp_path / "rank-0.stopping")}
    assert drain_deadline(env) == 11.0
    drain = LeaderDrain(Path(str(notice.drain_file)), time.time() + 60, ack_s=30)
    report_drain(DRAINING, env)
    assert drain.state() == DRAINING and not drain.release()
    report_drain(DRAINED, env)
    assert drain.release() and drain.reason == "the model drained"
