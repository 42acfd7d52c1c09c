"""What an engine build job is doing, as records rather than log text: the step it runs (``jobs/<id>/build_step.json``,
written as each step starts) and the step that failed (``jobs/<id>/build_failed.json``, with its exit status).

Both are a ``BuildStep``, written by the build script's ``step`` function (hpc/render/templates/build.sub.j2) with the
printf formats render takes from here (``STEP_FORMAT``, ``FAILURE_FORMAT``: the record's own definition, so the
format is typed once) and read by ``hpc-serve status`` (hpc/jobs/build.py). The build log is only shown:
no state is read from its text. Standard library only (the build script's values come from here).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.contracts.records import VERSION, Record


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
