"""Per-rank launcher: ``python -m launcher DIR`` runs this rank's tritonserver from ``DIR/launch.json``.

Standard library only: it may run inside a container where only the source tree is on PYTHONPATH. Importing
the package is cheap (``main`` loads the launcher on first call): ``launcher.contracts.layout``, ``launcher.contracts.records`` and
``launcher.contracts.rank`` are imported by ``hpc`` and by the models, on paths where start-up time counts.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m launcher DIR`` as a function: ``launcher.main(["DIR"])`` returns the exit code."""
    from launcher.node.run import main as run_main

    return run_main(argv)


__all__ = ["main"]
