"""`doctor --serve`'s command-line defaults and choices, apart from the run itself (hpc/doctor/serve.py), which
imports tritonclient and numpy: the CLI builds its parser from here and stays light."""

from __future__ import annotations

from launcher.contracts.llmapi import IMAGE_MODEL, OWN_MODEL

#: `--serve-timeout`'s default: the queue, then a GPU model's load (minutes for a large checkpoint) and warm-up
SERVE_TIMEOUT_S = 900.0
#: `--models`: the spec's own llmapi model, either one, or both in turn
MODEL_CHOICES = ("spec", OWN_MODEL, IMAGE_MODEL, "both")
