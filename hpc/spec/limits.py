"""The gateway's bounds that its CLI, the spec's `gateway:` section, the app and the Python client share, in a module
that imports nothing at import time, so that the CLI and spec validation read them without loading the web stack."""

from __future__ import annotations

from typing import Any

#: the default bound of a request's body, in MiB (`hpc-serve gateway --max-body-mb`, the spec's
#: `gateway.max_body_mb`; hpc/gateway/bodylimit.py): far above any prompt a model's context holds (a million
#: tokens are ~4 MB of text), far below what would strain the gateway's memory
MAX_BODY_MB = 16
#: characters of the prompt that make its prefix key (hpc/serving/balancer.py says why characters)
PREFIX_CHARS = 256
#: requests in flight one replica is given before the gateway answers 429 (the CPU engine and TensorRT-LLM
#: batch up to `triton_max_batch_size`, 8-256 typically; beyond a few batches' worth a request only waits)
MAX_OUTSTANDING = 256


class Bound:
    """A sampling parameter's range: `low` itself in (`low_in`) or out, `high` in."""

    def __init__(self, low: float, high: float, low_in: bool = True) -> None:
        self.low, self.high, self.low_in = low, high, low_in

    def holds(self, value: float) -> bool:
        return (value >= self.low if self.low_in else value > self.low) and value <= self.high

    def words(self) -> str:
        return f"{'at least' if self.low_in else 'more than'} {self.low:g} and at most {self.high:g}"

    def field(self) -> Any:
        """An optional pydantic field of this range (imported here, by the gateway only: this module stays light)."""
        from pydantic import Field

        if self.low_in:
            return Field(default=None, ge=self.low, le=self.high)
        return Field(default=None, gt=self.low, le=self.high)


#: the float sampling parameters' ranges, OpenAI's names, as the gateway's bodies (hpc/gateway/bodies.py), the
#: Python client (before anything is sent, so its RequestError names the field) and `generate`'s flags take them
SAMPLING_BOUNDS = {
    "temperature": Bound(0.0, 2.0),
    "top_p": Bound(0.0, 1.0, low_in=False),
    "presence_penalty": Bound(-2.0, 2.0),
    "frequency_penalty": Bound(-2.0, 2.0),
    "repetition_penalty": Bound(0.0, 100.0, low_in=False),
    "length_penalty": Bound(-100.0, 100.0),
}
