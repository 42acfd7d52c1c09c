#!/usr/bin/env bash
# The test command: install everything, start the one-machine Slurm test cluster, run every test
# (unit, tritonserver, and end-to-end on the cluster).   Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh --test
bash ci/cluster/up.sh
# shellcheck source=/dev/null
source ci/cluster/env.sh
exec python3 -m pytest -ra "$@"
