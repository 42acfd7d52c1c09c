"""Prove one GPU per rank on a machine with ≥ 2 GPUs: two ranks started by the real launcher.

For each ``gpu_binding`` (per-rank, then none) it writes a deployment folder (launch.json: tp 1 × 2 replicas, so
each rank is a leader and no MPI is needed) whose model repository holds one CUDA python model, starts
``python -m launcher`` twice with the variables ``srun --gres=gpu:2`` would set (SLURM_PROCID/LOCALID/NTASKS,
CUDA_VISIBLE_DEVICES=0,1), asks each rank's model where it computed (UUID, PCI bus id), and reads
``nvidia-smi --query-compute-apps`` to see on which GPUs each rank's tritonserver and python stub hold memory.
Prints one JSON summary (also to $OUT/gpu_binding.json) and exits 1 if per-rank binding did not hold.

Run by scripts/gpu/prove_gpu_binding.sh (needs tritonserver from nvidia-pytriton, torch on python3).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE_MARK = "gpu-probe-report:"
MODEL = """
import json, os
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


PROBE_MARK = "@PROBE_MARK@"  # filled in when written: the reader below parses what this model sends


class TritonPythonModel:
    def initialize(self, args):
        self.dev = torch.device("cuda", 0)  # the first GPU this process sees
        self.block = torch.ones(8192, 8192, device=self.dev)  # 256 MiB held while serving

    def execute(self, requests):
        out = []
        for request in requests:
            try:
                info = self.where()
            except Exception as exc:  # say what broke instead of an HTTP 500
                info = {"error": repr(exc)}
            # The report travels as the response's error text: any output tensor (BYTES, then UINT8 too) failed
            # in tritonserver 2.51's stub under the device's numpy 2.5 ("output tensor shape does not match
            # size of output"), and the report is what this model is for.
            out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(PROBE_MARK + json.dumps(info))))
        return out

    def where(self):
        x = torch.randn(2048, 2048, device=self.dev)
        y = (x @ x).sum().item()
        info = {"computed_on": self.dev.index, "name": torch.cuda.get_device_name(self.dev),
                "device_count": torch.cuda.device_count(), "result_finite": y == y,
                "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
        p = torch.cuda.get_device_properties(self.dev)
        uuid = str(getattr(p, "uuid", ""))
        info["uuid"] = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
        try:
            info["pci_bus_id"] = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
        except Exception as exc:
            info["pci_bus_id"] = repr(exc)
        return info
"""
CONFIG = """name: "gpu_probe"
backend: "python"
max_batch_size: 0
input [{ name: "X", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "INFO", data_type: TYPE_UINT8, dims: [ -1 ] }]  # declared, never sent (see MODEL)
instance_group [{ kind: KIND_CPU, count: 1 }]
"""


def deployment(root: Path, binding: str) -> Path:
    dep = root / f"dep-{binding}"
    model = dep / "models" / "gpu_probe"
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL.replace("@PROBE_MARK@", PROBE_MARK))
    plan = {
        "version": 1,
        "name": f"gpu-{binding}",
        "model_repository": "models",
        "tp_size": 1,
        "pp_size": 1,
        "replicas": 2,
        "world_size_per_replica": 1,
        "follower_models": [],
        "ready_timeout_s": 180,
        "gpu_binding": binding,
        "server_args": ["--log-verbose=0"],
    }
    (dep / "launch.json").write_text(json.dumps(plan, indent=2))
    return dep


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def smi(query: str, kind: str) -> list[list[str]]:
    text = subprocess.run(
        ["nvidia-smi", f"--query-{kind}={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


def infer(port: int) -> dict:
    body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/gpu_probe/infer", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(bytes(json.loads(r.read())["outputs"][0]["data"]))
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            message = json.loads(text)["error"]
        except (ValueError, KeyError):
            message = ""
        if message.startswith(PROBE_MARK):  # the model's report (see MODEL: it answers with it as its error)
            return json.loads(message[len(PROBE_MARK) :])
        return {"error": f"HTTP {exc.code}: {text}"}


def srun_env(job: str, rank: int, pythonpath: list[str]) -> dict[str, str]:
    """This environment plus what `srun --ntasks=2 --gres=gpu:2` on one node sets for task ``rank``, with
    ``pythonpath`` first on PYTHONPATH (also used by prove_llmapi_gpus.py)."""
    return dict(
        os.environ,
        SLURM_JOB_ID=job,
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NTASKS="2",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_NODEID="0",
        SLURMD_NODENAME="localhost",
        SLURM_JOB_NUM_NODES="1",
        CUDA_VISIBLE_DEVICES="0,1",
        PYTHONPATH=os.pathsep.join([*pythonpath, os.environ.get("PYTHONPATH", "")]),
    )


def run_mode(root: Path, binding: str, logs: Path) -> dict:
    dep = deployment(root, binding)
    job = f"proof-{binding}-{os.getpid()}"
    ranks = []
    for rank in (0, 1):
        env = srun_env(job, rank, [str(REPO)])
        out = open(logs / f"{binding}_rank{rank}.log", "w")
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-m", "launcher", str(dep)],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    endpoints = [dep / "jobs" / job / "endpoints" for _ in ranks]
    deadline, ports = time.time() + 180, {}
    while time.time() < deadline and len(ports) < 2:
        for f in endpoints[0].glob("*.json") if endpoints[0].is_dir() else []:
            rec = json.loads(f.read_text())
            ports[rec["replica"]] = rec["http_port"]
        if any(p.poll() is not None for p in ranks):
            break
        time.sleep(1)
    result: dict = {"binding": binding, "ready": sorted(ports)}
    try:
        if len(ports) < 2:
            raise RuntimeError(f"{binding}: ranks not ready: {ports}; see {logs}")
        result["model"] = {r: infer(ports[r]) for r in (0, 1)}
        time.sleep(2)
        gpus = {uuid: {"index": idx, "pci": pci} for idx, uuid, pci in smi("index,uuid,pci.bus_id", "gpu")}
        apps = smi("pid,used_memory,gpu_uuid", "compute-apps")
        result["gpus"] = gpus
        result["compute_apps"] = [
            {"pid": int(p), "comm": comm(int(p)), "MiB": int(m), "gpu": gpus.get(u, {}).get("index", u)}
            for p, m, u in apps
        ]
        per_rank = {}
        for rank, proc in enumerate(ranks):
            tree = set(descendants(proc.pid))
            holds: dict[str, dict[str, int]] = {}
            for p, m, u in apps:
                if int(p) in tree:
                    holds.setdefault(f"{comm(int(p))}[{p}]", {})[f"GPU{gpus[u]['index']}"] = int(m)
            per_rank[rank] = holds
        result["per_rank"] = per_rank
    finally:
        for proc in ranks:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in ranks:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    return result


def check(per_rank: dict, model: dict, gpus: dict) -> list[str]:
    """What per-rank binding promises: each rank's processes on one GPU, its own, where its model computed."""
    problems = []
    index_of = {u: g["index"] for u, g in gpus.items()}
    used = set()
    for rank, holds in per_rank.items():
        on = {gpu for proc in holds.values() for gpu in proc}
        if len(on) != 1:
            problems.append(f"rank {rank}: processes hold memory on {sorted(on)}")
        computed = f"GPU{index_of.get(model[rank].get('uuid', ''), '?')}"
        if on != {computed}:
            problems.append(f"rank {rank}: model computed on {computed}, memory on {sorted(on)}")
        used |= on
    if len(used) != len(per_rank):
        problems.append(f"ranks share GPUs: {used}")
    return problems


def main() -> int:
    root = Path(os.environ.get("PROOF_DIR", "/tmp/gpu-proof"))
    logs = Path(os.environ.get("OUT", root))
    root.mkdir(parents=True, exist_ok=True)
    results = []
    for binding in ("per-rank", "none"):
        try:
            results.append(run_mode(root, binding, logs))
        except Exception as exc:  # the other mode still runs: one call of the device tool gives both
            results.append({"binding": binding, "error": repr(exc)})
    first = results[0]
    ok = check(first["per_rank"], first["model"], first["gpus"]) if "per_rank" in first else [first["error"]]
    summary = {"results": results, "per_rank_problems": ok}
    text = json.dumps(summary, indent=1)
    print(text)
    (logs / "gpu_binding.json").write_text(text)
    return 1 if ok else 0


if __name__ == "__main__":
    sys.exit(main())
