"""Prove on a machine with ≥ 2 GPUs that hpc-serve's llmapi launch never hides the GPU a TensorRT-LLM worker opens
(docs/decisions.md "One GPU per rank").

TensorRT-LLM's PyTorch worker picks ``global_rank % torch.cuda.device_count()`` itself. For each ``gpu_binding``
("none", then "per-rank") this writes a deployment folder (launch.json through LaunchPlan: workflow llmapi, backend
tensorrtllm, tp 2, one replica of 2 ranks, model_files_from = the stand-in model.py/helpers.py), starts
``python -m launcher D`` twice with what ``srun`` sets for one node of 2 GPUs (SLURM_PROCID 0/1, SLURM_LOCALID,
SLURM_NTASKS=2, CUDA_VISIBLE_DEVICES=0,1), with the stand-in ``tensorrt_llm.llmapi.mgmn_{leader,worker}_node``
(scripts/gpu/llmapi_standin/) first on PYTHONPATH. So the launcher runs on rank 0 the leader node and tritonserver
(whose stand-in model connects to the leader node over the proxy address and says what environment it got) and on
rank 1 the worker node, exactly as on a cluster; only TensorRT-LLM is a stand-in. Once rank 0 is READY (the
launcher's warm-up went through the model to the leader node), ``nvidia-smi --query-compute-apps`` shows on which GPU
each process holds memory. Then rank 0 gets SIGTERM: the ordered stop ends both ranks.

Prints one JSON summary (also $OUT/llmapi_gpus.json) and exits 1 unless, with gpu_binding "none", rank 0's leader
node sits on GPU 0 only and rank 1's worker node on GPU 1 only, the model saw the proxy variables and no MPI/Slurm
variable, and a request came back through it. Run by scripts/gpu/prove_llmapi_gpus.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STANDIN = HERE / "llmapi_standin"
sys.path[:0] = [str(REPO), str(STANDIN), str(HERE)]

from prove_gpu_binding import comm, descendants, smi, srun_env  # noqa: E402
from tensorrt_llm.llmapi import standin  # noqa: E402

from launcher.contracts import model_names  # noqa: E402
from launcher.contracts.layout import LAUNCH_NAME, JobPaths  # noqa: E402
from launcher.contracts.llmapi import LLMAPI, MODEL_YAML, MPI_ENV_PREFIXES  # noqa: E402
from launcher.contracts.plan import LaunchPlan  # noqa: E402
from launcher.contracts.records import EndpointRecord, read_endpoints, read_rank_records  # noqa: E402
from launcher.contracts.trtllm_versions import LEADER_NODE_MODULE, WORKER_NODE_MODULE  # noqa: E402
from launcher.node.warmup import LLMAPI_BODY, Warmup, WarmupFailed, send  # noqa: E402

BACKEND = "tensorrtllm"
TP, GPUS_PER_NODE = 2, 2
READY_S, STOP_S = 240.0, 90.0
MODEL_FILES = STANDIN / "model"
#: the llmapi model's interface, the part the stand-in model and the launcher's warm-up use (upstream's names:
#: triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt; no max_batch_size, as upstream)
CONFIG = f"""name: "{model_names.TENSORRT_LLM}"
backend: "python"
model_transaction_policy {{ decoupled: false }}
instance_group [{{ count: 1, kind: KIND_CPU }}]
input [
  {{ name: "text_input", data_type: TYPE_STRING, dims: [ -1 ] }},
  {{ name: "streaming", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "sampling_param_max_tokens", data_type: TYPE_INT32, dims: [ 1 ], optional: true }}
]
output [{{ name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] }}]
"""
MODEL_YAML_TEXT = f"""model: /nonexistent/stand-in  # the stand-in model loads no checkpoint
backend: pytorch
tensor_parallel_size: {TP}
pipeline_parallel_size: 1
gpus_per_node: {GPUS_PER_NODE}
triton_config:
  max_batch_size: 0
  decoupled: false
"""
T = TypeVar("T")


def deployment(root: Path, binding: str) -> Path:
    """``root/llmapi-<binding>/``: launch.json, models/tensorrt_llm/{config.pbtxt,1/model.yaml}."""
    dep = root / f"llmapi-{binding}"
    model = dep / "models" / model_names.TENSORRT_LLM
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / MODEL_YAML).write_text(MODEL_YAML_TEXT)
    plan = LaunchPlan(
        name=f"llmapi-gpus-{binding}",
        deployment_dir=dep,
        model_repository="models",
        tp_size=TP,
        replicas=1,
        world_size_per_replica=TP,
        ready_timeout_s=READY_S,
        gpu_binding=binding,
        workflow=LLMAPI,
        backend=BACKEND,
        model_files_from=str(MODEL_FILES),
    )
    plan.write(dep / LAUNCH_NAME)
    assert LaunchPlan.read(dep).to_dict() == {**plan.to_dict(), "model_repository": str(dep / "models")}
    return dep


def rank_env(job: str, rank: int, reports: Path) -> dict[str, str]:
    """What srun sets for task ``rank`` of 2 on one node of 2 GPUs, the stand-in package on PYTHONPATH, and the
    stand-ins' two variables."""
    env = srun_env(job, rank, [str(REPO), str(STANDIN)])
    return {**env, standin.REPORT_DIR_VAR: str(reports), standin.GPUS_PER_NODE_VAR: str(GPUS_PER_NODE)}


def wait_for(what: str, get: Callable[[], T | None], ranks: list[subprocess.Popen[bytes]], timeout: float) -> T:
    """``get()`` once it returns something; RuntimeError when a rank ended first or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = get()
        if value is not None:
            return value
        ended = {r: p.returncode for r, p in enumerate(ranks) if p.poll() is not None}
        if ended:
            raise RuntimeError(f"waiting for {what}: rank(s) ended {ended}")
        time.sleep(0.5)
    raise RuntimeError(f"no {what} after {timeout:g} s")


def endpoint_of(paths: JobPaths) -> EndpointRecord | None:
    found = read_endpoints(paths)
    return found[0] if found else None


def processes(ranks: list[subprocess.Popen[bytes]], reports: dict[str, Any], server_pid: int) -> list[dict[str, Any]]:
    """Every process that holds GPU memory: pid, rank, what it is, MiB per GPU index."""
    gpus = {uuid: int(idx) for idx, uuid in smi("index,uuid", "gpu")}
    names = {r["pid"]: f"{r['role']} (rank {r['global_rank']})" for r in reports.values() if "role" in r}
    names[server_pid] = "tritonserver (rank 0)"
    rank_of = {pid: rank for rank, p in enumerate(ranks) for pid in descendants(p.pid)}
    stub = set(descendants(server_pid)) - {server_pid}
    table: dict[int, dict[str, Any]] = {}
    for pid, mib, uuid in smi("pid,used_memory,gpu_uuid", "compute-apps"):
        row = table.setdefault(
            int(pid),
            {
                "pid": int(pid),
                "rank": rank_of.get(int(pid)),
                "process": names.get(int(pid))
                or ("python stub of tensorrt_llm" if int(pid) in stub else comm(int(pid))),
                "MiB": {},
            },
        )
        row["MiB"][f"GPU{gpus.get(uuid, uuid)}"] = int(mib)
    return sorted(table.values(), key=lambda r: (99 if r["rank"] is None else r["rank"], r["pid"]))


def stop(ranks: list[subprocess.Popen[bytes]], paths: JobPaths) -> dict[str, Any]:
    """SIGTERM to rank 0's launcher (the ordered stop a cancelled job gets), then wait; kill what is left."""
    started = time.monotonic()
    if ranks[0].poll() is None:
        os.kill(ranks[0].pid, signal.SIGTERM)
    deadline = started + STOP_S
    while time.monotonic() < deadline and any(p.poll() is None for p in ranks):
        time.sleep(0.2)
    killed = []
    for rank, proc in enumerate(ranks):
        if proc.poll() is None:
            killed.append(rank)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    records = {
        r.rank: {"exit_code": r.exit_code, "signal": r.signal, "error": r.error} for r in read_rank_records(paths)
    }
    return {
        "exit_codes": [p.returncode for p in ranks],
        "rank_records": records,
        "seconds": round(time.monotonic() - started, 1),
        "killed": killed,
    }


def run_mode(root: Path, binding: str, logs: Path) -> dict[str, Any]:
    dep = deployment(root, binding)
    reports_dir = dep / "reports"
    shutil.rmtree(reports_dir, ignore_errors=True)  # an earlier run's reports
    os.environ[standin.REPORT_DIR_VAR] = str(reports_dir)  # for standin.report_path here; rank_env passes it on
    job = f"llmapi-{binding}-{os.getpid()}"
    paths = JobPaths(dep, job)
    ranks = []
    for rank in (0, 1):
        out = open(logs / f"llmapi_{binding}_rank{rank}.log", "w")
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-m", "launcher", str(dep)],
                cwd=REPO,
                env=rank_env(job, rank, reports_dir),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    result: dict[str, Any] = {"gpu_binding": binding, "launch": LaunchPlan.read(dep).to_dict()}
    try:
        endpoint = wait_for("rank 0 READY (endpoint record)", lambda: endpoint_of(paths), ranks, READY_S)
        reports = {}
        for name, role, rank in (
            ("leader", standin.LEADER, 0),
            ("worker", standin.WORKER, 1),
            ("model", standin.MODEL, None),
        ):
            path = standin.report_path(role, rank)
            reports[name] = wait_for(f"the {name} report {path}", lambda p=path: standin.read_report(p), ranks, 60)
        reports["model"]["mpi_slurm_vars"] = mpi_vars(reports["model"])
        result["reports"] = reports
        body = {**LLMAPI_BODY, "text_input": "Which GPU are you on?", "sampling_param_max_tokens": 2}
        try:
            result["generate"] = {
                "text_output": send(Warmup(model_names.TENSORRT_LLM, 60.0, None, body), endpoint.http_port)
            }
        except WarmupFailed as exc:
            result["generate"] = {"error": str(exc)}
        result["processes"] = processes(ranks, reports, endpoint.pid)
        result["gpus"] = {int(idx): uuid for idx, uuid in smi("index,uuid", "gpu")}
    except Exception as exc:  # the other mode still runs: one device call gives both
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        result["stop"] = stop(ranks, paths)
    return result


def mpi_vars(model: dict[str, Any]) -> list[str]:
    """The MPI/Slurm job variables (trtllm-llmapi-launch's list, launcher/contracts/llmapi.py) the model saw."""
    return [name for name in model.get("env_names", []) if name.startswith(MPI_ENV_PREFIXES)]


def check_none(result: dict[str, Any]) -> list[str]:
    """What gpu_binding "none" must give on llmapi; the problems found."""
    if "error" in result:
        return [result["error"]]
    problems = []
    uuid_of = {int(i): u for i, u in result["gpus"].items()}
    reports = result["reports"]
    for name, rank in (("leader", 0), ("worker", 1)):
        rep = reports[name]
        if rep.get("error"):
            problems.append(f"{name} node: {rep['error']}")
            continue
        if rep["global_rank"] != rank or rep["device_index"] != rank or rep["uuid"] != uuid_of.get(rank):
            problems.append(f"{name} node: rank {rep['global_rank']} opened cuda:{rep['device_index']} {rep['uuid']}")
        rows = [p for p in result["processes"] if p["pid"] == rep["pid"]]
        held = rows[0]["MiB"] if rows else {}
        if list(held) != [f"GPU{rank}"] or held[f"GPU{rank}"] < standin.HELD_MIB:
            problems.append(f"{name} node (rank {rank}, pid {rep['pid']}): memory {held}, expected only on GPU{rank}")
        if "error" in rep.get("mapping", {}):
            problems.append(f"{name} node: Mapping's local_rank ordinal failed: {rep['mapping']['error']}")
    for row in result["processes"]:
        if row["rank"] == 1 and set(row["MiB"]) != {"GPU1"}:
            problems.append(f"rank 1's {row['process']} (pid {row['pid']}) holds {row['MiB']}")
    model = reports["model"]
    if not all(model["proxy"].values()):
        problems.append(f"the model lacked proxy variables: {model['proxy']}")
    if mpi_vars(model):
        problems.append(f"tritonserver kept MPI/Slurm variables: {mpi_vars(model)}")
    if "text_output" not in result.get("generate", {}):
        problems.append(f"generate through the model failed: {result.get('generate')}")
    return problems


def placement(result: dict[str, Any]) -> str:
    """One line per node process of a mode, from its report and nvidia-smi: what it opened, where its memory is."""
    if "reports" not in result:
        return result.get("error", "no result")
    parts = []
    for name in ("leader", "worker"):
        rep = result["reports"][name]
        rows = [p for p in result.get("processes", []) if p["pid"] == rep.get("pid")]
        mapping = rep.get("mapping", {})
        parts.append(
            f"rank {rep['global_rank']} {rep['role']} pid {rep.get('pid')}: device_count {rep.get('device_count')}, "
            f"opened cuda:{rep.get('device_index')} ({rep.get('uuid', rep.get('error'))}), memory "
            f"{rows[0]['MiB'] if rows else {}}; Mapping local_rank {mapping.get('local_rank')} (gpus_per_node "
            f"{mapping.get('gpus_per_node')}): {mapping.get('error') or mapping.get('opened')}"
        )
    return "; ".join(parts)


def verdict(results: dict[str, dict[str, Any]], problems: list[str]) -> str:
    """The conclusion, from what was measured: which binding hpc-serve must use on llmapi."""
    per_rank = results.get("per-rank", {}).get("reports", {})
    mapping_failed = any("error" in per_rank.get(n, {}).get("mapping", {}) for n in ("leader", "worker"))
    return (
        ("gpu_binding none holds on llmapi" if not problems else "gpu_binding none did NOT hold on llmapi")
        + (
            "; per-rank hides the GPU TensorRT-LLM's Mapping opens (local_rank = rank % gpus_per_node as a CUDA "
            "ordinal fails where each process sees one GPU)"
            if mapping_failed
            else ""
        )
        + (
            ": hpc-serve must resolve gpu_binding to none on the llmapi workflow"
            if not problems and mapping_failed
            else ""
        )
        + "."
    )


def main() -> int:
    root = Path(os.environ.get("PROOF_DIR", "/tmp/llmapi-gpu-proof")).absolute()
    logs = Path(os.environ.get("OUT", root))
    root.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    assert LEADER_NODE_MODULE.startswith("tensorrt_llm.llmapi.") and WORKER_NODE_MODULE.startswith(
        "tensorrt_llm.llmapi."
    ), "the stand-in package must provide the launcher's modules"
    results = {binding: run_mode(root, binding, logs) for binding in ("none", "per-rank")}
    problems = check_none(results["none"])
    summary = {
        "verdict": verdict(results, problems),
        "none_problems": problems,
        "placement": {b: placement(r) for b, r in results.items()},
        "table": {
            b: [(p["pid"], p["rank"], p["process"], p["MiB"]) for p in r.get("processes", [])]
            for b, r in results.items()
        },
        "results": results,
    }
    text = json.dumps(summary, indent=1)
    print(text)
    (logs / "llmapi_gpus.json").write_text(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
