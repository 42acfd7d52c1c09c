#!/usr/bin/env bash
# The test command (scripts/test.sh) N times in a row while two busy loops compete for the CPU: how a change is
# proven not to depend on timing luck (docs/decisions.md "The test command's two pytests"). Stops at the
# first failed run; prints each run's exit code and time.   Usage: bash scripts/test_contended.sh [N] [pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-3}
shift || true
busy=()
stop_busy() {
    if ((${#busy[@]})); then kill "${busy[@]}" 2>/dev/null || true; fi
}
trap stop_busy EXIT
for _ in 1 2; do
    python3 -c 'while True: pass' &
    busy+=($!)
done
for ((i = 1; i <= runs; i++)); do
    started=$(date +%s)
    rc=0
    bash scripts/test.sh "$@" || rc=$?
    echo "contended run $i of $runs: exit $rc after $(($(date +%s) - started)) s (commit $(git rev-parse --short HEAD))"
    ((rc == 0)) || exit "$rc"
done
