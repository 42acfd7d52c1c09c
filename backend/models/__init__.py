"""Python models that run inside tritonserver's python backend.

Each module keeps its logic in plain functions/classes over numpy (unit-testable without Triton) and
imports `triton_python_backend_utils` only inside its `TritonPythonModel`, which the generated
`<model>/1/model.py` shims re-export.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TRUE = frozenset({"true", "1", "t", "y", "yes", "on"})
_FALSE = frozenset({"false", "0", "f", "n", "no", "off"})


def model_parameter(model_config: Mapping[str, Any], key: str) -> str | None:
    """A `parameters {}` string value from the model config JSON Triton hands to `initialize`.

    Missing, empty or an unfilled upstream placeholder (`${...}`, from a hand-filled template) → None.
    """
    entry = (model_config.get("parameters") or {}).get(key)
    value = entry.get("string_value") if isinstance(entry, Mapping) else None
    if not isinstance(value, str) or not value.strip() or value.strip().startswith("${"):
        return None
    return value


def parse_bool(value: str | None, default: bool, key: str = "value") -> bool:
    """Upstream accepts true/false/1/0/t/f/y/n/yes/no in any case; anything else is a config error."""
    if value is None:
        return default
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{key} must be a boolean, got {value!r}")
