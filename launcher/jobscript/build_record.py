"""What built an engine folder: the record a build job leaves in it, and the identity of a checkpoint.

Why here (stdlib, shipped to the compute nodes): the build job writes the record on the node, after its steps,
with the identity of the checkpoint *as it was read* (a checkpoint `model.init` created in the same job
included), and `hpc-serve build/submit` reads the same records on the login side to decide whether a spec's
engine is already built (hpc/jobs/build_plan.py). One definition of "the same inputs" for both.

Identity of a checkpoint folder: every file's relative path, size and modification time (what `make` trusts,
cheap for a 100 GB checkpoint), plus the SHA-256 of its config.json (a config edited in place within one mtime
tick still counts). Usage in a build job: ``python -m launcher.jobscript.build_record finish REQUEST STAGING`` — write
the record into STAGING, then move STAGING to the engine folder REQUEST names; an engine folder that is already
there (another build of the same request finished first) is kept, never overwritten.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from launcher.contracts.build_records import BUILD_STARTED_ENV, BuildRecord, BuildRequest, checkpoint_identity
from launcher.contracts.layout import BUILD_RECORD_NAME
from launcher.contracts.rank import given_job_id
from launcher.contracts.workflows import rank_backend


def tool_version(backend: str) -> str | None:
    """The version of the tool that built the engine, as installed where the job ran (None if unknown)."""
    found = rank_backend(backend)
    if found is None or not found.tool_packages:
        return None
    from importlib import metadata

    for name in found.tool_packages:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def finish(request_file: Path, staging: Path) -> Path:
    """Record what built `staging` and move it to its engine folder; the engine folder that serves."""
    request = BuildRequest.read(request_file)
    if request is None or not request.engine_dir:
        raise SystemExit(f"{request_file}: not a build request (written by hpc-serve build/submit)")
    engine_dir = Path(request.engine_dir)
    source = Path(request.source)
    BuildRecord(
        key=request.key,
        request=request.request,
        inputs=checkpoint_identity(source),
        init=request.init,
        source=str(source),
        tool_version=tool_version(str(request.request.get("backend", ""))),
        job_id=given_job_id(),
        built_at=time.time(),
        started_at=float(os.environ.get(BUILD_STARTED_ENV, "0") or 0) or None,
    ).write(staging / BUILD_RECORD_NAME)
    if (engine_dir / BUILD_RECORD_NAME).exists():  # a build of the same request got there first: keep it
        shutil.rmtree(staging, ignore_errors=True)
        return engine_dir
    engine_dir.parent.mkdir(parents=True, exist_ok=True)
    os.rename(staging, engine_dir)  # atomic on one filesystem; the staging folder is a sibling
    return engine_dir


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "finish":
        print("usage: python -m launcher.jobscript.build_record finish REQUEST_JSON STAGING_DIR", file=sys.stderr)
        return 2
    engine = finish(Path(argv[1]), Path(argv[2]))
    print(f"hpc-serve build: engine {engine}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
