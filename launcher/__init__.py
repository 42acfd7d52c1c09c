"""Per-rank launcher: ``python -m launcher DIR`` runs this rank's tritonserver from ``DIR/launch.json``.

Standard library only: it may run inside a container where only the source tree is on PYTHONPATH.
"""

from .run import main

__all__ = ["main"]
