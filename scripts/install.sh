#!/usr/bin/env bash
# Install hpc-serve and what the embedded default needs on this machine (Debian/Ubuntu or any box with
# Open MPI already present): Open MPI for multi-rank jobs, then the package with the embedded
# tritonserver (nvidia-pytriton) and mpi4py.  Usage: bash scripts/install.sh [--test]
#   --test  also the test dependencies (pytest, torch CPU, transformers) and shellcheck
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
extras="local"
apt_packages=(openmpi-bin libopenmpi-dev libpmix2)
if [[ ${1:-} == --test ]]; then
    extras="local,test"
    apt_packages+=(shellcheck procps iproute2 curl)
fi

missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "install.sh: please install ${missing[*]} (as root: apt-get install ${missing[*]})" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ $extras == *test* ]]; then
    # The CPU build of torch; a plain `torch` would pull several GB of CUDA packages.
    "$PYTHON" -m pip install -q "torch==2.13.0"
fi
"$PYTHON" -m pip install -q -e ".[$extras]"
echo "hpc-serve installed: $(command -v hpc-serve)"
