"""What benchmarks/soak.py reads of a job besides its answers: its tritonservers and python stubs and their
resident memory, how its ranks ended, and Slurm's word on it. Found by the job (its processes' environment and
its records), never by name over the whole machine: other jobs and helpers run here too.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from launcher.contracts.layout import JobPaths
from launcher.contracts.records import read_endpoints, read_rank_records
from launcher.contracts.trtllm_versions import LEADER_NODE_MODULE, WORKER_NODE_MODULE


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def job_servers(deploy: Path, job: str) -> dict[int, str]:
    """pid → label of the job's tritonservers and python stubs: the processes whose environment carries the
    job's id (Slurm gives every task of the job SLURM_JOB_ID; tritonserver passes it to its stubs), the
    leaders named by their endpoint records. Not by name over the whole machine: other jobs run here too."""
    leaders = {e.pid: e.replica for e in read_endpoints(JobPaths(deploy, job))}
    marker = f"SLURM_JOB_ID={job}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        exe = os.path.basename(argv[0].decode(errors="replace"))
        engine_node = next((label for module, label in ENGINE_NODES.items() if module.encode() in argv), None)
        if engine_node is not None and _environ_has(pid, marker):
            found[pid] = engine_node  # the llmapi workflow's engine processes (their step's environment)
            continue
        # on llmapi tritonserver runs without the job's variables (launcher/contracts/llmapi.py): known by its
        # endpoint record's pid, and its stubs by their parent
        if exe not in ("tritonserver", "triton_python_backend_stub"):
            continue
        if pid not in leaders and _parent(pid) not in leaders and not _environ_has(pid, marker):
            continue
        if exe == "tritonserver":
            found[pid] = f"replica {leaders[pid]} tritonserver" if pid in leaders else "tritonserver"
        else:  # the stub's first argument is its model's model.py: .../<model>/1/model.py
            model = Path(argv[1].decode(errors="replace")).parent.parent.name if len(argv) > 1 else "?"
            found[pid] = f"stub {model}"
    for pid, label in list(found.items()):  # a stub: name the replica of its tritonserver (its parent)
        if label.startswith("stub"):
            parent = _parent(pid)
            if parent in leaders:
                found[pid] = f"replica {leaders[parent]} {label}"
    return found


#: the llmapi workflow's engine processes, by the module they run (launcher/contracts/llmapi.py)
ENGINE_NODES = {LEADER_NODE_MODULE: "leader node", WORKER_NODE_MODULE: "worker node"}


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


class Memory:
    """RSS samples per (job, pid): the first and the last are what the report compares."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, int], tuple[str, float, int]] = {}
        self.last: dict[tuple[str, int], tuple[str, float, int]] = {}

    def sample(self, key: str, processes: dict[int, str], at: float) -> None:
        for pid, label in processes.items():
            kib = rss_kib(pid)
            if kib is None:
                continue
            self.first.setdefault((key, pid), (label, at, kib))
            self.last[(key, pid)] = (label, at, kib)  # the last label: a leader is named once it published

    def report(self) -> list[dict[str, Any]]:
        rows = []
        for (key, pid), (_, at0, kib0) in sorted(self.first.items(), key=lambda kv: (kv[0][0], self.last[kv[0]][0])):
            label, at1, kib1 = self.last[(key, pid)]
            rows.append(
                {"job": key, "pid": pid, "process": label, "start_s": round(at0, 1), "end_s": round(at1, 1),
                 "start_mib": round(kib0 / 1024, 1), "end_mib": round(kib1 / 1024, 1),
                 "growth_mib": round((kib1 - kib0) / 1024, 1)}
            )  # fmt: skip
        return rows


def sacct(jobs: list[str]) -> dict[str, str]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", ",".join(jobs), "-o", "JobID,State"], capture_output=True, text=True
    ).stdout
    return {job: state.split()[0] for job, state in (line.split("|") for line in out.splitlines() if "|" in line)}


#: tritonserver's words at its exit timeout: requests it still counts in flight (the last count is what it left)
IN_FLIGHT = re.compile(r"Model '([^']+)' \(version \d+\) has (\d+) in-flight inferences")


def rank_ends(deploy: Path, job: str) -> list[dict[str, Any]]:
    """How each rank of the job ended (its exit record), and what its tritonserver still counted in flight when
    it stopped (its log), so a FAILED job of the chain says why."""
    paths = JobPaths(deploy, job)
    logs = {int(m.group(1)): p for p in paths.rank_logs("err") if (m := re.search(r"_(\d+)_log\.err$", p.name))}
    ends = []
    for record in read_rank_records(paths):
        counts = IN_FLIGHT.findall(logs[record.rank].read_text(errors="replace")) if record.rank in logs else []
        ends.append(
            {"rank": record.rank, "exit_code": record.exit_code, "signal": record.signal,
             "in_flight_at_exit": {counts[-1][0]: int(counts[-1][1])} if counts else {}}
        )  # fmt: skip
    return ends
