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
# Two pytests side by side, so the command takes the longer of the two, not their sum: beside, the tests that
# wait out Slurm time limits (marker `timelimit`: minutes of wall clock, little CPU) and those that run
# tritonserver on this machine without Slurm (`triton and not cluster`: CPU while the others wait on the cluster);
# in front, the rest (the times behind the split: docs/decisions.md "The test command's two pytests"). With
# arguments, one pytest runs what they name.
if (($#)); then
    exec python3 -m pytest -ra --durations=30 "$@"
fi
BESIDE="timelimit or (triton and not cluster)"
beside=$(mktemp -d)
python3 -m pytest -ra --durations=15 -m "$BESIDE" -p no:cacheprovider --basetemp="$beside/tmp" >"$beside/log" 2>&1 &
waiting=$!
trap 'kill "$waiting" 2>/dev/null || true' EXIT  # interrupted: the pytest beside ends too
rc=0
python3 -m pytest -ra --durations=30 -m "not ($BESIDE)" || rc=$?
beside_rc=0
wait "$waiting" || beside_rc=$?
echo "=== beside it: pytest -m \"$BESIDE\" (exit $beside_rc) ==="
cat "$beside/log"
rm -rf "$beside"
if ((rc == 0)); then
    rc=$beside_rc
fi
exit "$rc"
