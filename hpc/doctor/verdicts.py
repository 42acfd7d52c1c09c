"""The probe job's verdicts (hpc/doctor/probe.py runs the job): one `Check` per thing the node checked, each
failure with its fix, read from the node's RESULTS (node.py) or, when the workdir is not shared and RESULTS
cannot be read here, from the bits of the job's exit code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from hpc.doctor import node
from hpc.doctor.report import Check, fail, ok, skip
from hpc.spec import Spec
from launcher.contracts.llmapi import IMAGE_MODEL_DIR, LLMAPI

#: the job's exit bits beside node.py's (node.BITS): the job did not see the login node's file; the srun step
#: did not run node.py
WORKDIR_BIT, STEP_BIT = 1, 16
#: the probe folder's files
FROM_LOGIN, FROM_NODE, RESULTS, JOB_OUT, SCRIPT = "from-login", "from-node", "node.json", "job.out", "probe.sub"
#: what to do when srun --mpi=pmix gives a step no PMIx
PMIX_FIX = (
    "the site's Slurm has no working PMIx plugin for srun --mpi={mpi}: pick one that `srun --mpi=list` shows "
    "(slurm.mpi: pmix_v4, pmix_v5, ...), or ask the admins for Slurm's mpi/pmix plugin"
)
SHARED_FIX = (
    "set workdir to a folder on a filesystem the login node and the compute nodes share ($HOME, $SCRATCH, a "
    "project space; not /tmp or a node-local disk): `df -h WORKDIR` on both shows the same filesystem"
)


@dataclass
class ProbeJob:
    """What became of the probe job."""

    job_id: str
    state: str = "UNKNOWN"
    exit_code: int | None = None
    node: str = ""
    elapsed_s: float = 0.0
    results: dict = field(default_factory=dict)
    saw_node_file: bool = False


def engine_version(spec: Spec) -> str | None:
    """The TensorRT-LLM version trtllm-build wrote into the engine's config.json (`version`), if any."""
    if spec.model.backend != "tensorrtllm" or spec.model.engine_dir is None:
        return None
    try:
        config = json.loads((Path(spec.model.engine_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    version = config.get("version") if isinstance(config, dict) else None
    return str(version) if version else None


def verdicts(spec: Spec, job: ProbeJob, folder: Path) -> list[Check]:
    """The probe's checks from what came back: the results file where this node can read it, else the exit
    code's bits."""
    rc = job.exit_code if job.exit_code is not None else -1
    where = f"job {job.job_id} on {job.node or '?'}"
    checks: list[Check] = []
    if job.state not in ("COMPLETED", "FAILED") or rc < 0:
        checks.append(
            fail(
                "probe job",
                f"{where} ended {job.state} (exit {job.exit_code})",
                f"read `scontrol show job {job.job_id}` / sacct -j {job.job_id}; the node's log is {folder / JOB_OUT}",
            )
        )
        return checks
    checks.append(ok("probe job", f"{where}: {job.state}, exit {rc}, {job.elapsed_s:.1f} s"))
    node_missing = not (rc & WORKDIR_BIT)
    if job.saw_node_file and node_missing:
        checks.append(ok("shared workdir", f"{spec.workdir}: the job and this node see each other's files"))
    else:
        seen = [
            *(["the job did not see the file written here"] if rc & WORKDIR_BIT else []),
            *(["the job's file is not seen here"] if not job.saw_node_file else []),
        ]
        checks.append(
            fail("shared workdir", f"{spec.workdir} on {job.node or 'the node'}: {'; '.join(seen)}", SHARED_FIX)
        )
    if rc & STEP_BIT:
        fix = "read the node's log, " + str(folder / JOB_OUT) + " (srun or the container failed to start)"
        return [*checks, fail("node step", f"srun step of {where} did not run node.py", fix)]
    checks.append(_node_check(spec, job, "python", node.BITS["python"], _python_fix(spec, job)))
    checks.append(_node_check(spec, job, "tritonserver", node.BITS["tritonserver"], _server_fix(spec)))
    if spec.slurm.gpus_per_node:
        gpu_fix = (
            f"the job sees fewer GPUs than {_gpus_why(spec)}: check the partition's GRES (`sinfo -o %G`) "
            "and that the container gets the GPUs (pyxis: enroot's nvidia hook; apptainer --nv)"
        )
        checks.append(_node_check(spec, job, "gpus", node.BITS["gpus"], gpu_fix))
    else:
        checks.append(skip("gpus", "slurm.gpus_per_node is 0"))
    checks.append(_node_check(spec, job, "pmix", 0, PMIX_FIX.format(mpi=spec.slurm.mpi)))
    checks.append(_trtllm_check(spec, job))
    if spec.model.workflow == LLMAPI:
        checks += _llmapi_checks(spec, job)
    return checks


def _gpus_why(spec: Spec) -> str:
    """Why the node needs slurm.gpus_per_node GPUs: on TensorRT-LLM, rank r opens GPU r % gpus_per_node (the spec
    already holds a node's ranks to at most that many), so a node showing fewer puts ranks on missing GPUs."""
    why = f"slurm.gpus_per_node {spec.slurm.gpus_per_node}"
    if spec.model.backend == "tensorrtllm":
        why += (
            f", for the node's {spec.tasks_per_node} ranks (tp_size {spec.model.tp_size} × pp_size "
            f"{spec.model.pp_size} × replicas {spec.replicas} over {spec.slurm.nodes} node(s)), rank r on GPU r % "
            f"{spec.slurm.gpus_per_node}"
        )
    return why


def _trtllm_check(spec: Spec, job: ProbeJob) -> Check:
    """The image's TensorRT-LLM against the engine's version, else against the spec's workflow."""
    version = engine_version(spec)
    if spec.model.backend != "tensorrtllm":
        return skip("tensorrt_llm", f"model.backend {spec.model.backend}: no TensorRT-LLM")
    if version is not None:
        fix = f"use an image with tensorrt_llm {version}, or rebuild the engine with the image's TensorRT-LLM"
    elif spec.model.workflow == LLMAPI:
        fix = (
            f"use an image with TensorRT-LLM {node.FIRST_LLMAPI} or newer (NGC tritonserver 25.09+ -trtllm-python-py3), "
            "or serve a trtllm-build engine with model.workflow: engine"
        )
    else:
        fix = (
            f"the engine workflow needs TensorRT-LLM {node.LAST_ENGINE} or older (NGC tritonserver up to 25.xx "
            "-trtllm-python-py3 with TensorRT-LLM 1.2); or serve the Hugging Face checkpoint with model.workflow: llmapi"
        )
    return _node_check(spec, job, "tensorrt_llm", node.BITS["tensorrt_llm"], fix)


def _llmapi_checks(spec: Spec, job: ProbeJob) -> list[Check]:
    """On llmapi: the checkpoint readable from the node, and (TensorRT-LLM) the image's model files."""
    checkpoint_fix = (
        f"put model.checkpoint_dir ({spec.model.checkpoint_dir}) on a filesystem the compute nodes mount (and the "
        "container: container.mounts), readable by the job's user"
    )
    checks = [_node_check(spec, job, "checkpoint", node.BITS["checkpoint"], checkpoint_fix)]
    if spec.model.backend != "tensorrtllm":
        checks.append(skip("llmapi_files", "model.backend cpu serves hpc-serve's own llmapi model"))
        return checks
    files_fix = (
        f"set model.model_files_from to the folder of the image's all_models/llmapi/tensorrt_llm/1 (model.py, "
        f"helpers.py); NGC images keep it at {IMAGE_MODEL_DIR}"
    )
    checks.append(_node_check(spec, job, "llmapi_files", node.BITS["llmapi_files"], files_fix))
    return checks


def _node_check(spec: Spec, job: ProbeJob, name: str, bit: int, fix: str) -> Check:
    """The node's verdict on `name`: from RESULTS, else from its `bit` of the exit code (0: a check with no bit,
    known only from RESULTS)."""
    rc = job.exit_code or 0
    found = job.results.get(name)
    if found:
        detail = f"{found['detail']} (on {job.results.get('node') or job.node})"
        if found.get("skip"):
            return skip(name, detail)
        return ok(name, detail) if found["ok"] else fail(name, detail, fix)
    if not bit:
        return skip(name, f"the node's results are not readable here (on {job.node})")
    if rc & bit:
        return fail(name, f"failed on {job.node} (details in the node's results, not readable here)", fix)
    return ok(name, f"passed on {job.node} (from the job's exit code)")


def _python_fix(spec: Spec, job: ProbeJob) -> str:
    needed = ".".join(map(str, node.NEEDED))
    found = job.results.get("python") or {}
    old = tuple(int(n) for n in str(found.get("version") or "0").split(".")[:2]) < node.NEEDED
    if spec.container.type == "none":
        newer = f"install hpc-serve with Python {needed} or newer, on a filesystem the nodes see"
        imports = "install what the error names into the environment hpc-serve runs from"
    else:
        newer = (
            f"use an image whose {spec.container.python} is Python {needed} or newer (NGC tritonserver 24.xx images "
            f"have 3.10), or set container.python to such a python in the image"
        )
        imports = f"use an image whose {spec.container.python} has what the error names (numpy for the python models)"
    if found and not found.get("ok"):
        return newer if old else imports
    return f"{newer}; or {imports}"


def _server_fix(spec: Spec) -> str:
    where = "in the image" if spec.container.type != "none" else "on the nodes"
    return f"set triton.server to the tritonserver binary {where} (or $TRITONSERVER in slurm.env)" + (
        ", or `pip install nvidia-pytriton` for the Python that runs the ranks" if spec.container.type == "none" else ""
    )
