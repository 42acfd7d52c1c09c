"""An engine build's records, each a typed ``Record`` (one schema for every writer and reader):

- ``D/build_request.json`` (``BuildRequest``): what the build job builds, written by `hpc-serve build/submit`
  (hpc/jobs/build_script.py), read by its last step (launcher/jobscript/build_record.py ``finish``) and by `status`;
- ``<engine>/hpc_serve_build.json`` (``BuildRecord``): what built an engine folder, written by that last step, read
  to find an engine already built for a spec (hpc/jobs/build_plan.py);
- ``<output_dir>/.building/<key>.<job>`` (``BuildingMarker``): which job builds an engine now (hpc/jobs/build.py);
- what the job is doing, as records rather than log text: the step it runs (``jobs/<id>/build_step.json``,
  written as each step starts) and the step that failed (``jobs/<id>/build_failed.json``, with its exit status).

Both are a ``BuildStep``, written by the build script's ``step`` function (hpc/render/templates/build.sub.j2) with the
printf formats render takes from here (``STEP_FORMAT``, ``FAILURE_FORMAT``: the record's own definition, so the
format is typed once) and read by ``hpc-serve status`` (hpc/jobs/build.py). The build log is only shown:
no state is read from its text. Standard library only (the build script's values come from here).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.contracts.layout import BUILD_RECORD_NAME
from launcher.contracts.records import VERSION, Record

#: the epoch second the build job's script started its steps (build.sub sets it: render passes this name)
BUILD_STARTED_ENV = "HPC_SERVE_BUILD_STARTED"
#: the CPU engine's sharded layout (backend/cpu_engine/shards.py writes it into each folder): part of a build's
#: request, so a new layout never matches engines cut in an older one
SHARD_FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class BuildStep(Record):
    """Step ``step`` (its number in the build request's ``steps``, from 0) named ``name``; ``exit_code``: how the
    step that failed ended (None while it runs)."""

    version: int = VERSION
    step: int
    name: str
    exit_code: int | None = None

    def describe(self) -> str:
        """`step 1 (trtllm-build)`: how `status` names it."""
        return f"step {self.step} ({self.name})"


#: the build script's printf formats: a step that starts (its number and name), one that failed (and its status)
STEP_FORMAT = BuildStep.shell_format(["step", "name"])
FAILURE_FORMAT = BuildStep.shell_format(["step", "name", "exit_code"])


@dataclass(frozen=True, kw_only=True)
class BuildRequest(Record):
    """What a build job builds: its cache ``key``, the ``engine_dir`` it makes from ``source``, the ``request`` (every
    argument that changes the engine), the ``init`` that creates the checkpoint when there is none, and each of
    its ``steps`` as {"name", "command"} (what `status` shows of the step it runs)."""

    version: int = VERSION
    key: str = ""
    engine_dir: str = ""
    source: str = ""
    request: dict[str, Any] = field(default_factory=dict)
    init: dict[str, Any] | None = None
    steps: list[dict[str, str]] = field(default_factory=list)

    def command(self, number: int) -> str | None:
        """Step ``number``'s command line (None for a step the request does not list)."""
        return self.steps[number].get("command") if 0 <= number < len(self.steps) else None


@dataclass(frozen=True, kw_only=True)
class BuildRecord(Record):
    """What built an engine folder: the request and the identity of its inputs as the job read them
    (``checkpoint_identity``), the tool's version, the job, and when."""

    version: int = VERSION
    key: str = ""
    request: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    init: dict[str, Any] | None = None
    source: str = ""
    tool_version: str | None = None
    job_id: str | None = None
    built_at: float = 0.0
    started_at: float | None = None

    @property
    def took_s(self) -> float | None:
        """How long the build's steps ran (None when the job did not say when they started)."""
        return self.built_at - self.started_at if self.started_at else None


@dataclass(frozen=True, kw_only=True)
class BuildingMarker(Record):
    """The job (``job_id``, its folder ``job_dir``) that builds an engine now."""

    version: int = VERSION
    job_id: str = ""
    job_dir: str = ""


def read_record(engine_dir: Path) -> BuildRecord | None:
    """The build record of an engine folder, or None (not built by hpc-serve, or unreadable)."""
    return BuildRecord.read(engine_dir / BUILD_RECORD_NAME)


def checkpoint_identity(folder: Path) -> dict[str, Any]:
    """{"files": [[path, size, mtime_ns], ...], "config_sha256": ...} of a checkpoint folder (hidden entries,
    such as a staging folder of ours, left out): what the build job records and `submit` compares, one
    definition of "the same inputs" for both."""
    files: list[list[Any]] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(root) / name
            stat = path.stat()
            files.append([str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns])
    config = folder / "config.json"
    digest = hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None
    return {"files": files, "config_sha256": digest}
