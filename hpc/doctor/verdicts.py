"""The probe job's verdicts (hpc/doctor/probe.py runs the job): one `Check` per thing the node checked, each
failure with its fix, read from the node's RESULTS (node.py) or, when the workdir is not shared and RESULTS
cannot be read here, from the bits of the job's exit code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from hpc.doctor import node
from hpc.doctor.report import Check, fail, ok, skip, warn
from hpc.spec import Spec
from launcher.contracts.llmapi import IMAGE_MODEL_DIR
from launcher.contracts.trtllm_versions import (
    LEADER_NODE_MODULE,
    WORKER_NODE_MODULE,
    Defect,
    known_defects,
    ngc_release,
)

#: the job's exit bits beside node.py's (node.BITS): the job did not see the login node's file; the srun step
#: did not run node.py
WORKDIR_BIT, STEP_BIT = 1, 16
#: the probe folder's files
FROM_LOGIN, FROM_NODE, RESULTS, JOB_OUT = "from-login", "from-node", "node.json", "job.out"
#: what to do when srun --mpi=pmix gives a step no PMIx
PMIX_FIX = (
    "the site's Slurm has no working PMIx plugin for srun --mpi={mpi}: pick one that `srun --mpi=list` shows "
    "(slurm.mpi: pmix_v4, pmix_v5, ...), or ask the admins for Slurm's mpi/pmix plugin"
)
#: the module of hpc-serve's own llmapi `tensorrt_llm` model (backend/llmapi_repository.py's shim imports it)
OWN_MODEL_MODULE = "backend.models.llmapi"
#: the report's names of the probe's imports (node.py `--model-import`), one check each
IMPORT_TRTLLM, IMPORT_LEADER, IMPORT_WORKER = "import tensorrt_llm", "import leader node", "import worker node"
IMPORT_IMAGE_MODEL, IMPORT_OWN_MODEL = "import image model.py", "import hpc-serve model"
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
    if not spec.backend_strategy.serves_built_engine or spec.model.engine_dir is None:
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
    if spec.workflow_strategy.serves_checkpoint:
        checks += _llmapi_checks(spec, job, folder)
    return checks


def _gpus_why(spec: Spec) -> str:
    """Why the node needs slurm.gpus_per_node GPUs: on TensorRT-LLM, rank r opens GPU r % gpus_per_node (the spec
    already holds a node's ranks to at most that many), so a node showing fewer puts ranks on missing GPUs."""
    why = f"slurm.gpus_per_node {spec.slurm.gpus_per_node}"
    if spec.backend_strategy.uses_gpus:
        why += (
            f", for the node's {spec.tasks_per_node} ranks (tp_size {spec.model.tp_size} × pp_size "
            f"{spec.model.pp_size} × replicas {spec.replicas} over {spec.slurm.nodes} node(s)), rank r on GPU r % "
            f"{spec.slurm.gpus_per_node}"
        )
    return why


def _trtllm_check(spec: Spec, job: ProbeJob) -> Check:
    """The image's TensorRT-LLM against the engine's version, else against the spec's workflow."""
    version = engine_version(spec)
    if not spec.backend_strategy.imports_tensorrt_llm:
        return skip("tensorrt_llm", f"model.backend {spec.model.backend}: no TensorRT-LLM")
    if version is not None:
        fix = f"use an image with tensorrt_llm {version}, or rebuild the engine with the image's TensorRT-LLM"
    else:
        fix = spec.workflow_strategy.trtllm_fix
    return _node_check(spec, job, "tensorrt_llm", node.BITS["tensorrt_llm"], fix)


def _llmapi_checks(spec: Spec, job: ProbeJob, folder: Path) -> list[Check]:
    """On llmapi: the checkpoint readable from the node, and (TensorRT-LLM) the image's model files."""
    checkpoint_fix = (
        f"put model.checkpoint_dir ({spec.model.checkpoint_dir}) on a filesystem the compute nodes mount (and the "
        "container: container.mounts), readable by the job's user"
    )
    checks = [_node_check(spec, job, "checkpoint", node.BITS["checkpoint"], checkpoint_fix)]
    if not spec.backend_strategy.runs_image_model:
        checks.append(skip("llmapi_files", f"model.backend {spec.model.backend} serves hpc-serve's own llmapi model"))
        return checks
    files_fix = (
        f"set model.model_files_from to the folder of the image's all_models/llmapi/tensorrt_llm/1 (model.py, "
        f"helpers.py); NGC images keep it at {IMAGE_MODEL_DIR}"
    )
    if image_model_served(spec):
        checks.append(_node_check(spec, job, "llmapi_files", node.BITS["llmapi_files"], files_fix))
    else:
        checks.append(skip("llmapi_files", "no model.model_files_from: hpc-serve's own model serves"))
    return checks + _import_checks(spec, job, folder)


def image_model_served(spec: Spec) -> bool:
    """The spec serves the image's model.py (model.model_files_from names its folder), not hpc-serve's."""
    return spec.model.model_files_from is not None


def model_import_targets(spec: Spec) -> list[tuple[str, str, str]]:
    """What tritonserver's stub and the replica's processes import on the llmapi workflow with TensorRT-LLM,
    as node.py `--model-import` (kind, label, target): tensorrt_llm's names the model imports, the leader node's
    module (and the worker node's, for a replica of more than one rank), the image's model.py when it serves,
    and hpc-serve's own model (imported either way: its verdict says whether the spec could switch to it)."""
    if not spec.workflow_strategy.chooses_model_py or not spec.backend_strategy.imports_tensorrt_llm:
        return []
    targets = [
        ("module", IMPORT_TRTLLM, "tensorrt_llm:LLM,SamplingParams"),
        ("module", IMPORT_LEADER, LEADER_NODE_MODULE),
    ]
    if spec.world_size_per_replica > 1:
        targets.append(("module", IMPORT_WORKER, WORKER_NODE_MODULE))
    if image_model_served(spec):
        targets.append(("file", IMPORT_IMAGE_MODEL, str(spec.model.model_files_from)))
    targets.append(("source", IMPORT_OWN_MODEL, OWN_MODEL_MODULE))
    return targets


def _image(spec: Spec) -> str | None:
    return spec.container.image if spec.container.type != "none" else None


def _defect_where(spec: Spec, version: str | None) -> str:
    release = ngc_release(_image(spec))
    trtllm = f"TensorRT-LLM {version}" if version else "its TensorRT-LLM"
    return f"NGC {release} ({trtllm})" if release else trtllm


def _defect_fix(defect: Defect, where: str) -> str:
    return f"known defect of {where}, {defect.name}: {defect.cause}. Fix: {defect.fix}"


def _import_checks(spec: Spec, job: ProbeJob, folder: Path) -> list[Check]:
    """One check per import the node made in a child process: the exception's type, message and last traceback
    lines when it failed, and for its fix the known defect of the image or version (launcher/contracts/
    trtllm_versions.py), else what to install. hpc-serve's model, when the spec serves the image's, only warns."""
    version = (job.results.get("tensorrt_llm") or {}).get("version")
    defects = known_defects(version, _image(spec))
    where = _defect_where(spec, version)
    found = job.results.get("imports")
    generic = (
        "the python that runs the ranks cannot import what the model imports: put what the error names into the "
        "image (a derived image: `FROM <image>` then `RUN pip install ...`, named in container.image); every line "
        f"the import printed: {folder / RESULTS} and {folder / JOB_OUT}"
    )
    fix = " | ".join(_defect_fix(d, where) for d in defects) or generic
    if not found:
        if job.results:  # readable results without imports: the node was not asked for them
            return []
        if (job.exit_code or 0) & node.BITS["imports"]:
            detail = (
                f"tensorrt_llm's version or an import failed on {job.node} (the node's results are not readable here)"
            )
            return [fail("model imports", detail, fix)]
        return [ok("model imports", f"passed on {job.node} (from the job's exit code)")]
    if found.get("skip"):
        return [skip("model imports", found["detail"])]
    on = job.results.get("node") or job.node
    checks = []
    for entry in found.get("imports", []):
        name = entry["label"]
        if entry["ok"]:
            checks.append(ok(name, f"{entry['target']}: imported in {entry.get('seconds', '?')} s (on {on})"))
            continue
        lines = " | ".join(entry.get("traceback") or [])
        detail = f"{entry['target']}: {entry['type']}: {entry['message']} (on {on})" + (f"; {lines}" if lines else "")
        if name == IMPORT_OWN_MODEL and image_model_served(spec):
            checks.append(
                warn(name, detail, f"the spec serves the image's model.py; hpc-serve's would fail here: {fix}")
            )
        else:
            checks.append(fail(name, detail, fix))
    if defects and all(c.status == "ok" for c in checks):
        names = ", ".join(d.name for d in defects)
        checks.append(ok("known defects", f"{names} of {where}: not seen here, every import passes (on {on})"))
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
