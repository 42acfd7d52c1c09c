"""`$VAR`, `${VAR}` and `${VAR:-default}` in spec paths, expanded on the submitting machine.

Why not `os.path.expandvars`: the example specs in `configs/` must validate on a fresh machine, so they give
their variables defaults (`${HPC_SERVE_MODELS:-~/models}`, the shell's syntax), which expandvars leaves as
they are; and a variable that is unset and has no default must be reported by name, not left in a path as a
literal `$`.
"""

from __future__ import annotations

import os
import re

_VAR = re.compile(r"\$(?:\{(?P<braced>\w+)(?::-(?P<default>[^}]*))?\}|(?P<bare>\w+))")


def expand(text: str, environ: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """`text` with its variables and then a leading `~` expanded; the names of unset variables without a default.

    Like the shell, `${VAR:-default}` takes the default when VAR is unset or empty; a default may start with
    `~` (expanded after substitution, so `${MODELS:-~/models}` means the user's home)."""
    env = os.environ if environ is None else environ
    missing: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        name = match["braced"] or match["bare"]
        value = env.get(name)
        if match["default"] is not None and not value:
            return match["default"]
        if value is None:
            missing.append(name)
            return match.group(0)
        return value

    return os.path.expanduser(_VAR.sub(substitute, text)), missing


def unset_message(name: str, where: str = "the spec") -> str:
    """What to tell the user about an unset variable: its name and both ways to fix it (`where`: the file that
    uses it, e.g. the site profile)."""
    return (
        f"uses ${name}, which is not set; export {name}=/some/path, or give it a default in {where}: "
        f"${{{name}:-/some/path}}"
    )
