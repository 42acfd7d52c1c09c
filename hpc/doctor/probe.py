"""`hpc-serve doctor --probe`: a tiny job on the spec's partition that checks what only a compute node can tell.

The job (one node, one task, a couple of minutes) runs the spec's modules, setup lines and environment, then
one srun step with the spec's srun flags and container wrapper (hpc/render/jobfiles.py's, so it is the job's own), in
which `node.py` (carried in the script itself with the rank-side code, and unpacked into a node-local folder,
so it runs whether or not the workdir is shared) checks that the python that runs the ranks is new enough and
imports the launcher and the python models, resolves tritonserver as the launcher does and runs `--help`, counts
GPUs, and reads the installed TensorRT-LLM version. The workdir is shared when the job sees a file written here before it was
submitted, and this node sees the one the job wrote. The verdict comes back twice: as JSON in the probe folder,
and as bits of the job's exit code, so a workdir that is not shared still yields every verdict.

The job is cancelled when the wait runs out or on Ctrl-C. Every value from the spec that reaches the script is
shell-quoted; the #SBATCH lines take only values the spec's schema already restricts to Slurm words.
"""

from __future__ import annotations

import base64
import io
import json
import secrets
import shlex
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from backend.llmapi_repository import CPU_LLMAPI_MODULE
from backend.repository import CPU_ENGINE_MODULE, PYTHON_MODEL_MODULES
from hpc.doctor import node
from hpc.doctor.login import Facts, sbatch_options
from hpc.doctor.report import Check, fail, ok, skip
from hpc.render.jobfiles import _srun_and_wrapper
from hpc.scheduler import slurm
from hpc.spec import Spec
from hpc.spec.checks import slurm_time_seconds
from launcher.contracts.layout import SHIPPED_PACKAGES, SOURCE_ROOT
from launcher.contracts.llmapi import IMAGE_MODEL_DIR, LLMAPI

PROBE_TIME_S = 120
WORKDIR_BIT, STEP_BIT = 1, 16
#: the probe folder's files
FROM_LOGIN, FROM_NODE, RESULTS, JOB_OUT, SCRIPT = "from-login", "from-node", "node.json", "job.out", "probe.sub"
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


def probe_time(facts: Facts) -> str:
    """A couple of minutes, or the partition's MaxTime when that is shorter."""
    record = facts.partition_record(facts.partition) or {}
    limit = slurm_time_seconds(record.get("MaxTime", "UNLIMITED"))
    seconds = PROBE_TIME_S if limit is None else max(60, min(PROBE_TIME_S, limit))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def node_bundle() -> str:
    """node.py and the python code of the rank-side packages render ships (launcher/, backend/), as base64 of a
    tar.gz: the job script carries them, so the node-side checks run even where the workdir is not shared, and
    import the very code the ranks will (about 180 kB)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(node.__file__, arcname="node.py")
        for package in SHIPPED_PACKAGES:
            for path in sorted((SOURCE_ROOT / package).rglob("*.py")):
                tar.add(path, arcname=f"python/{path.relative_to(SOURCE_ROOT)}")
    return base64.b64encode(buffer.getvalue()).decode()


def model_modules(spec: Spec) -> list[str]:
    """The modules tritonserver's python stubs import when the spec's models start (backend/repository.py's and
    backend/llmapi_repository.py's; with TensorRT-LLM on llmapi, the image's own model.py, not ours)."""
    cpu = spec.model.backend == "cpu"
    if spec.model.workflow == LLMAPI:
        return [CPU_LLMAPI_MODULE] if cpu else []
    return [*PYTHON_MODEL_MODULES.values(), *([CPU_ENGINE_MODULE] if cpu else [])]


def python_label(spec: Spec) -> str:
    """How the report names the python that runs the ranks."""
    if spec.container.type == "none":
        return f"{sys.executable} on the node"
    return f"{spec.container.python} in the container"


def node_exits() -> str:
    """node.py's exit codes, for the script's `case`: every sum of its bits."""
    bits = list(node.BITS.values())
    sums = {sum(b for i, b in enumerate(bits) if mask >> i & 1) for mask in range(1 << len(bits))}
    return "|".join(str(n) for n in sorted(sums))


def write_probe(spec: Spec, facts: Facts, folder: Path, nonce: str) -> Path:
    """The probe folder (the file the job must see, the job script) and the script, which unpacks node.py into a
    node-local folder and runs it there, mounted into the container at the same path."""
    folder.mkdir(parents=True)
    (folder / FROM_LOGIN).write_text(nonce + "\n")
    local = Path(f"/tmp/hpc-serve-doctor-{nonce}")  # on the node; mounted into the container as it is
    srun, wrapper = _srun_and_wrapper(spec, local)
    python = sys.executable if spec.container.type == "none" else spec.container.python
    node_args = [str(local / RESULTS), "--python-label", python_label(spec)]
    node_args += [arg for module in model_modules(spec) for arg in ("--import", module)]
    if spec.triton.server:
        node_args += ["--server", spec.triton.server]
    if spec.slurm.gpus_per_node:
        node_args += ["--gpus", str(spec.slurm.gpus_per_node)]
    if version := engine_version(spec):
        node_args += ["--trtllm", version]
    elif spec.model.backend == "tensorrtllm":
        node_args += ["--workflow", str(spec.model.workflow)]
    if spec.model.workflow == LLMAPI:
        node_args += ["--checkpoint", str(spec.model.checkpoint_dir)]
        if spec.model.model_files_from is not None:
            node_args += ["--llmapi-files", str(spec.model.model_files_from)]
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# hpc-serve doctor --probe for {spec.name}: checks on a compute node, then exits.",
        "#SBATCH --job-name=hpc-serve-doctor",
        "#SBATCH --output=/dev/null",  # a workdir the node lacks must not keep the job from starting
        "#SBATCH --chdir=/",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        *(f"#SBATCH {opt}" for opt in sbatch_options(spec, time=probe_time(facts))),
        "set -u",
        f"PROBE={q(str(folder))}",
        f"LOCAL={q(str(local))}",
        f"NONCE={q(nonce)}",
        "rc=0",
        'mkdir -p "$PROBE" 2>/dev/null && exec >"$PROBE/' + JOB_OUT + '" 2>&1',
        f'if [ "$(cat "$PROBE/{FROM_LOGIN}" 2>/dev/null)" != "$NONCE" ]; then',
        f'  echo "the login node\'s $PROBE/{FROM_LOGIN} is not here"; rc={WORKDIR_BIT}',
        "fi",
        f'echo "$NONCE ${{SLURMD_NODENAME:-$(hostname)}}" >"$PROBE/{FROM_NODE}"',
        "trap 'rm -rf \"$LOCAL\"' EXIT",
        'mkdir -p "$LOCAL" && base64 -d <<\'BUNDLE\' | tar -xzf - -C "$LOCAL"',
        node_bundle(),
        "BUNDLE",
        *(f"module load {q(m)}" for m in spec.slurm.modules),
        *spec.slurm.setup,  # the spec's own shell lines, run as written (as the .sub does)
        *(f"export {k}={q(v)}" for k, v in spec.slurm.env.items()),
        " ".join(
            ["srun --nodes=1 --ntasks=1", *map(q, srun), *map(q, wrapper), q(python), '"$LOCAL/node.py"']
            + [q(a) for a in node_args]
        ),
        "step=$?",
        f'cp "$LOCAL/{RESULTS}" "$PROBE/{RESULTS}" 2>/dev/null',
        # node.py's exit is a sum of its bits; anything else means the step itself failed (srun, the container)
        f'case $step in {node_exits()}) ;; *) echo "node step exited $step"; step={STEP_BIT} ;; esac',
        "exit $((rc | step))",
    ]
    script = folder / SCRIPT
    script.write_text("\n".join(lines) + "\n")
    return script


def _state(job_id: str) -> tuple[str, int | None, str, str]:
    """(state, exit code, reason, node) from scontrol, else sacct (the job ended MinJobAge ago)."""
    record = slurm.default.scontrol_jobs([job_id]).get(job_id)
    if record is None:
        rows = slurm.default.sacct([job_id], ["JobID", "State", "ExitCode", "NodeList"])
        row = next((r for r in rows if r.get("JobID") == job_id), None)
        if row is None:
            return "UNKNOWN", None, "", ""
        record = {"JobState": row["State"].split(" ")[0], "ExitCode": row["ExitCode"], "NodeList": row["NodeList"]}
    code = record.get("ExitCode", "")
    exit_code = int(code.split(":")[0]) if code.split(":")[0].isdigit() else None
    return record.get("JobState", "UNKNOWN"), exit_code, record.get("Reason", ""), record.get("NodeList", "")


def run_probe(
    spec: Spec,
    facts: Facts,
    timeout_s: float,
    *,
    say: Callable[[str], None] = print,
    poll_s: float = 0.5,
) -> tuple[list[Check], Path]:
    """Submit the probe job, wait for it (cancelled past `timeout_s` or on Ctrl-C), and read its verdicts. The
    probe folder is returned; the caller removes it when everything passed."""
    nonce = secrets.token_hex(8)
    folder = Path(spec.workdir).expanduser() / ".doctor" / f"{time.strftime('%Y%m%d-%H%M%S')}-{nonce[:6]}"
    try:
        script = write_probe(spec, facts, folder, nonce)
    except OSError as exc:
        return [
            fail("probe job", f"cannot write the probe folder: {exc}", "set workdir to a folder you can write")
        ], folder
    try:
        job = ProbeJob(slurm.default.sbatch(script))
    except slurm.SlurmError as exc:
        return [fail("probe job", f"sbatch refused it: {exc}", "change the slurm: field Slurm's message names")], folder
    try:  # from here on, Ctrl-C cancels the job
        say(f"probe job {job.job_id} submitted to {facts.partition} (waiting at most {timeout_s:g} s; {folder})")
        late = _wait(job, timeout_s, poll_s)
    except KeyboardInterrupt:
        slurm.default.scancel(job.job_id)
        say(f"probe job {job.job_id} cancelled")
        raise
    except slurm.SlurmError as exc:
        fix = f"`scancel {job.job_id}` if it still runs, and check that the controller answers (`scontrol ping`)"
        return [fail("probe job", f"lost track of job {job.job_id}: {exc}", fix)], folder
    if late:
        return [late], folder
    _read_back(job, folder, nonce)
    return verdicts(spec, job, folder), folder


def _wait(job: ProbeJob, timeout_s: float, poll_s: float) -> Check | None:
    """Poll the job until it ends (None) or `timeout_s` passes: then cancel it and return the failure."""
    start = time.monotonic()
    while True:
        job.state, job.exit_code, reason, job.node = _state(job.job_id)
        job.elapsed_s = time.monotonic() - start
        if slurm.ended(job.state):
            return None
        if job.elapsed_s > timeout_s:
            slurm.default.scancel(job.job_id)
            waited = f"{job.state}" + (f" ({reason})" if reason and reason != "None" else "")
            return fail(
                "probe job",
                f"job {job.job_id} still {waited} after {timeout_s:g} s; cancelled",
                "try again with a longer --probe-timeout, or a partition with idle nodes (sinfo)",
            )
        time.sleep(poll_s)


def _read_back(job: ProbeJob, folder: Path, nonce: str, wait_s: float = 5.0) -> None:
    """The job's file and results, given a few seconds to appear (NFS caches attributes)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            job.saw_node_file = (folder / FROM_NODE).read_text().split()[:1] == [nonce]
        except OSError:
            job.saw_node_file = False
        try:
            job.results = json.loads((folder / RESULTS).read_text())
        except (OSError, ValueError):
            job.results = {}
        if (job.saw_node_file and job.results) or time.monotonic() > deadline:
            return
        time.sleep(0.5)


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
            f"the job sees fewer GPUs than slurm.gpus_per_node {spec.slurm.gpus_per_node}: check the partition's "
            "GRES (`sinfo -o %G`) and that the container gets the GPUs (pyxis: enroot's nvidia hook; apptainer --nv)"
        )
        checks.append(_node_check(spec, job, "gpus", node.BITS["gpus"], gpu_fix))
    else:
        checks.append(skip("gpus", "slurm.gpus_per_node is 0"))
    checks.append(_trtllm_check(spec, job))
    if spec.model.workflow == LLMAPI:
        checks += _llmapi_checks(spec, job)
    return checks


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
    rc = job.exit_code or 0
    found = job.results.get(name)
    if found:
        detail = f"{found['detail']} (on {job.results.get('node') or job.node})"
        if found.get("skip"):
            return skip(name, detail)
        return ok(name, detail) if found["ok"] else fail(name, detail, fix)
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
