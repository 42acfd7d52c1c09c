"""Checks of single spec values that reach scripts (`#SBATCH` lines, shell lines, paths), and the base of every
section. Shared by the sections in `hpc.spec.schema` and `hpc.spec.gateway`, so a Slurm time or an extra
`#SBATCH` option is checked the same way wherever the spec asks for one."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

# Characters allowed in values that land in `#SBATCH` lines or paths baked into scripts. Slurm parses
# `#SBATCH` lines itself (not a shell), but a newline there would start a new directive, and a path with
# spaces or quotes would need quoting that `#SBATCH -o` does not do consistently across Slurm versions.
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:+@%=/\-\[\]]+$")
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:|&*()\[\]\-]+$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MPI = re.compile(r"^[a-z][a-z0-9_]*$")  # srun --mpi types: none, pmi2, pmix, pmix_v4, cray_shasta
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$|^(UNLIMITED|INFINITE)$")
_MEM = re.compile(r"^\d+[KMGT]?$")


def _no_newline(value: str) -> str:
    if "\n" in value or "\r" in value or "\x00" in value:
        raise ValueError("must be a single line (no newline or NUL characters)")
    return value


def _check(pattern: re.Pattern[str], what: str):
    def validate(value: str | None) -> str | None:
        if value is None:
            return None
        _no_newline(value)
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid {what}")
        return value

    return validate


def _time_not_a_number(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(
            f'got the number {value}: quote the time, e.g. time: "02:00:00" '
            "(YAML reads an unquoted 2:00:00 as the base-60 number 7200)"
        )
    return value


def _slurm_time(value: str | None) -> str | None:
    if value is None:
        return None
    _no_newline(value)
    if not _TIME.fullmatch(value):
        raise ValueError(f"{value!r} is not a Slurm time; use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    return value


def slurm_time_seconds(value: str) -> int | None:
    """Seconds of a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None for UNLIMITED/INFINITE."""
    if value in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:  # MM, MM:SS
        hours, (minutes, seconds) = 0, (parts + [0])[:2]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def _mem_as_text(value: Any) -> Any:
    # `mem: 0` (all of the node's memory) or `mem: 64000` (MB) are YAML ints; they mean the same as the string.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _slurm_mem(value: str | None) -> str | None:
    if value is not None and not _MEM.fullmatch(str(value)):
        raise ValueError(f"{value!r} is not a Slurm memory size; use e.g. 64G, 512000M or 0 (all)")
    return value


#: A Slurm time limit (`--time`): an unquoted YAML number refused with how to quote it, then the format checked.
#: One type for every section that asks for a job's time (slurm, gateway, build), so they accept the same values.
SlurmTime = Annotated[str, BeforeValidator(_time_not_a_number), AfterValidator(_slurm_time)]
#: A Slurm memory size (`--mem`): a YAML int (`0`, `64000`) read as its text, then the format checked.
SlurmMem = Annotated[str, BeforeValidator(_mem_as_text), AfterValidator(_slurm_mem)]


def _single_options(values: list[str]) -> list[str]:
    """Extra #SBATCH / srun options: one option each, nothing a shell or Slurm's parser would read further."""
    for value in values:
        _no_newline(value)
        if not re.fullmatch(r"^--?[A-Za-z][A-Za-z0-9\-]*(=[^\s'\"`$\\;&|<>]*)?$", value):
            raise ValueError(
                f"{value!r} is not a single option like --mail-type=END (no spaces, quotes or shell characters)"
            )
    return values


class _Section(BaseModel):
    """Base for every section: unknown keys are errors (with a did-you-mean), never silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


Port = int | Literal["auto"]


def _tcp_port(value: Port) -> Port:
    if value != "auto" and not 1 <= int(value) <= 65535:
        raise ValueError(f"{value} is not a TCP port (1-65535) or 'auto'")
    return value
