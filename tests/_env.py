"""What the test environment has, and the one rule for when it lacks something.

On CI (`CI=true`) a missing cluster, tritonserver or mpirun is a failure, not a skip: `.ci/run` installs and
starts them, so their absence there is a broken setup that must not pass as green. Elsewhere the test skips
with the reason.
"""

from __future__ import annotations

import os

import pytest

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Fail on CI, skip elsewhere; never returns."""
    if ON_CI:
        pytest.fail(f"{reason} (CI installs and starts it in .ci/run; this is a broken setup)")
    pytest.skip(reason)
