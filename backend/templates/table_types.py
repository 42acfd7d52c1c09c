"""The shapes of the model tables (backend/templates/tables.py, engine_tables.py): a tensor, a parameter, an
ensemble step, a model. `tensor` is the compact constructor the tables use (imported there as `_t`).

Conventions: dims exclude the batch dimension (every model has `max_batch_size: ${triton_max_batch_size}`);
a dtype starting with `$` names the fill key that supplies it (e.g. `$logits_datatype`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Tensor:
    """One `input`/`output` entry. `reshape=()` renders `reshape: { shape: [ ] }` (upstream's scalar inputs)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False
    ragged: bool = False
    reshape: tuple[int, ...] | None = None


def tensor(name: str, dtype: str, dims: list[int], flags: str = "") -> Tensor:
    """Compact constructor: flags is a space-separated subset of `optional ragged reshape`."""
    words = set(flags.split())
    unknown = words - {"optional", "ragged", "reshape"}
    if unknown:
        raise ValueError(f"unknown tensor flags {sorted(unknown)} for {name}")
    dt = dtype if dtype.startswith("$") else f"TYPE_{dtype}"
    return Tensor(name, dt, tuple(dims), "optional" in words, "ragged" in words, () if "reshape" in words else None)


@dataclass(frozen=True)
class Param:
    """One `parameters {}` entry: Triton key, and the fill key supplying it (or a fixed value)."""

    key: str
    source: str | None = None
    fixed: str | None = None


@dataclass(frozen=True)
class Step:
    """One ensemble step: `input_map` is (model input, ensemble tensor), `output_map` (model output, ensemble tensor)."""

    model_name: str
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ModelTable:
    """Everything needed to render one config.pbtxt.

    kind: "ensemble" renders `platform: "ensemble"`; "python" `backend: "python"`; "llm" renders
    `backend: "${triton_backend}"` (tensorrtllm or python, chosen by the repository writer).
    dynamic_batching: None = absent, "empty" = `dynamic_batching {}`, "queue" = upstream's preferred
    size / queue delay / queue size block. instance_count: a fill key or a fixed int.
    """

    name: str
    kind: Literal["ensemble", "python", "llm"]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    parameters: tuple[Param, ...] = ()
    decoupled_key: str | None = None
    dynamic_batching: Literal["empty", "queue"] | None = None
    instance_count: str | int | None = None
    steps: tuple[Step, ...] = field(default=())
