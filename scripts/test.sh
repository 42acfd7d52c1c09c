#!/usr/bin/env bash
# The test command: install everything, start the one-machine Slurm test cluster, run every test
# (unit, tritonserver, and end-to-end on the cluster).   Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh --test
bash ci/cluster/up.sh
# shellcheck source=/dev/null
source ci/cluster/env.sh
# Lint, format and types first: seconds, and a failure there says exactly what to fix (pyproject.toml).
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy
# Again at 3.10, pyproject's requires-python and NGC's tritonserver images' python3: typeshed knows what 3.10
# lacks (typing.Self, asyncio.timeout, tomllib); tests/test_python310.py runs the rank-side code under 3.10.
python3 -m mypy --python-version 3.10
exec python3 -m pytest -ra --durations=30 "$@"
