"""`hpc-serve doctor --probe`: a tiny job on the spec's partition that checks what only a compute node can tell.

The job (one node, one task, a couple of minutes) runs the spec's modules, setup lines and environment, then
one srun step with the spec's srun flags and container wrapper (hpc/render/jobfiles.py's, so it is the job's own), in
which `node.py` (carried in the script itself with the rank-side code, and unpacked into a node-local folder,
so it runs whether or not the workdir is shared) checks that the python that runs the ranks is new enough and
imports the launcher and the python models, resolves tritonserver as the launcher does and runs `--help`, counts
GPUs, and reads the installed TensorRT-LLM version. The workdir is shared when the job sees a file written here before it was
submitted, and this node sees the one the job wrote. The verdict comes back twice: as JSON in the probe folder,
and as bits of the job's exit code, so a workdir that is not shared still yields every verdict.

The script is rendered by hpc/render/probe.py (templates/probe.sub.j2, its #SBATCH lines hpc/render/sbatch.py's);
every value from the spec that reaches it is shell-quoted, and the #SBATCH lines take only values the spec's
schema already restricts to Slurm words. The job is a job kind (hpc/jobs/kinds.py `DoctorProbeJob`): its state
is read through the process's throttled watcher, and its exit code and node once it ended. It is cancelled when
the wait runs out or on Ctrl-C.
"""

from __future__ import annotations

import base64
import io
import json
import secrets
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from hpc.doctor import node
from hpc.doctor.facts import Facts
from hpc.doctor.report import Check, fail
from hpc.doctor.verdicts import (
    FROM_LOGIN,
    FROM_NODE,
    JOB_OUT,
    RESULTS,
    STEP_BIT,
    WORKDIR_BIT,
    ProbeJob,
    engine_version,
    model_import_targets,
    verdicts,
)
from hpc.jobs.kinds import DoctorProbeJob
from hpc.render.probe import render_probe_script
from hpc.scheduler import slurm
from hpc.scheduler.index import JobRef
from hpc.scheduler.watch import watcher
from hpc.spec import Spec
from hpc.spec.checks import slurm_time_seconds
from launcher.contracts.layout import SHIPPED_PACKAGES, SOURCE_ROOT

#: the probe job's time limit: its checks take seconds, and the model imports (node.IMPORT_TIMEOUT_S, run side
#: by side) add at most their bound
PROBE_TIME_S = 120


def probe_time(facts: Facts, seconds: float = PROBE_TIME_S) -> str:
    """A couple of minutes (`seconds`), or the partition's MaxTime when that is shorter."""
    record = facts.partition_record(facts.partition) or {}
    limit = slurm_time_seconds(record.get("MaxTime", "UNLIMITED"))
    seconds = int(seconds if limit is None else max(60, min(seconds, limit)))
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
    return spec.workflow_strategy.model_modules(spec.backend_strategy)


def python_label(spec: Spec) -> str:
    """How the report names the python that runs the ranks."""
    if spec.container.type == "none":
        return f"{sys.executable} on the node"
    return f"{spec.container.python} in the container"


def node_exits() -> str:
    """node.py's exit codes, for the script's `case`: every sum of its bits (a bit two checks share, once)."""
    bits = sorted(set(node.BITS.values()))
    sums = {sum(b for i, b in enumerate(bits) if mask >> i & 1) for mask in range(1 << len(bits))}
    return "|".join(str(n) for n in sorted(sums))


def write_probe(spec: Spec, facts: Facts, folder: Path, nonce: str) -> Path:
    """The probe folder (the file the job must see, the job script) and the script, which unpacks node.py into a
    node-local folder and runs it there, mounted into the container at the same path."""
    folder.mkdir(parents=True)
    (folder / FROM_LOGIN).write_text(nonce + "\n")
    local = Path(f"/tmp/hpc-serve-doctor-{nonce}")  # on the node; mounted into the container as it is
    python = sys.executable if spec.container.type == "none" else spec.container.python
    node_args = [str(local / RESULTS), "--python-label", python_label(spec)]
    node_args += [arg for module in model_modules(spec) for arg in ("--import", module)]
    if spec.triton.server:
        node_args += ["--server", spec.triton.server]
    if spec.slurm.gpus_per_node:
        node_args += ["--gpus", str(spec.slurm.gpus_per_node)]
    node_args += ["--mpi", spec.slurm.mpi]
    if version := engine_version(spec):
        node_args += ["--trtllm", version]
    elif spec.backend_strategy.imports_tensorrt_llm:
        node_args += ["--workflow", str(spec.model.workflow)]
    if spec.workflow_strategy.serves_checkpoint:
        node_args += ["--checkpoint", str(spec.model.checkpoint_dir)]
        if spec.model.model_files_from is not None:
            node_args += ["--llmapi-files", str(spec.model.model_files_from)]
    imports = model_import_targets(spec)
    node_args += [arg for target in imports for arg in ("--model-import", *target)]
    seconds = PROBE_TIME_S + (node.IMPORT_TIMEOUT_S if imports else 0)
    values = {
        "folder": str(folder),
        "nonce": nonce,
        "python": python,
        "node_args": node_args,
        "bundle": node_bundle(),
        "node_exits": node_exits(),  # node.py's exit is a sum of its bits; anything else: the step itself failed
        "job_out": JOB_OUT,
        "from_login": FROM_LOGIN,
        "from_node": FROM_NODE,
        "results": RESULTS,
        "workdir_bit": WORKDIR_BIT,
        "step_bit": STEP_BIT,
    }
    text = render_probe_script(spec, time=probe_time(facts, seconds), local=local, values=values)
    script = folder / DoctorProbeJob.script
    script.write_text(text)
    return script


def _outcome(job_id: str) -> tuple[int | None, str]:
    """(exit code, node) of the ended job: scontrol, else sacct (it ended MinJobAge ago). Asked once, after the
    watcher saw the end; the state itself is the watcher's."""
    record = slurm.default.scontrol_jobs([job_id]).get(job_id)
    if record is None:
        rows = slurm.default.sacct([job_id], ["JobID", "ExitCode", "NodeList"])
        row = next((r for r in rows if r.get("JobID") == job_id), None)
        record = {"ExitCode": row["ExitCode"], "NodeList": row["NodeList"]} if row is not None else {}
    code = record.get("ExitCode", "").split(":")[0]
    return (int(code) if code.isdigit() else None), record.get("NodeList", "")


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
    watcher().arm(job.job_id)  # just submitted: asked about now, then at 2, 4, 8 … s
    try:  # from here on, Ctrl-C cancels the job
        say(f"probe job {job.job_id} submitted to {facts.partition} (waiting at most {timeout_s:g} s; {folder})")
        late = _wait(job, DoctorProbeJob(JobRef(job.job_id, folder)), timeout_s, poll_s)
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
    facts.trtllm_version = (job.results.get("tensorrt_llm") or {}).get("version")
    return verdicts(spec, job, folder), folder


def _wait(job: ProbeJob, kind: DoctorProbeJob, timeout_s: float, poll_s: float) -> Check | None:
    """Wait for the job to end (None), reading its state through the watcher (which asks Slurm only as often as
    its schedule says), or until `timeout_s` passes: then cancel it and return the failure."""
    start = time.monotonic()
    while True:
        status = kind.status()
        job.state, reason = status.scheduler_state or "UNKNOWN", status.reason
        job.elapsed_s = time.monotonic() - start
        if slurm.ended(job.state):
            job.exit_code, job.node = _outcome(job.job_id)
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
