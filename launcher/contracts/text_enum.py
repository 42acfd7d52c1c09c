"""`TextEnum`: the base of every state hpc-serve writes or prints by name (job states, readiness, phases).

A member is its word: `==` the string, and `str()`, f-strings and JSON give the bare value on every Python. A plain
`(str, Enum)` prints `Phase.LOADING` in an f-string from 3.11 on and `loading` on 3.10, so a record or a log line
would read differently by the container's Python. Standard library only, Python 3.10.
"""

from __future__ import annotations

from enum import Enum


class TextEnum(str, Enum):
    """A str-valued Enum whose text is its value, on 3.10 as on 3.11 and later."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
