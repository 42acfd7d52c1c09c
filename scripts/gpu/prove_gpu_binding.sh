#!/usr/bin/env bash
# One GPU per rank, proven on a machine with ≥ 2 GPUs (DEVELOPERS.md "One GPU per rank").
# Needs: python3 with torch and numpy; tritonserver from the nvidia-pytriton wheel, either installed or as a
# wheel in .whl/ (the device tool's way: `pip download nvidia-pytriton==0.7.0` for cp312 manylinux x86_64).
# Usage: scripts/gpu/prove_gpu_binding.sh   (results: $OUT or /tmp/gpu-proof: gpu_binding.json, rank logs)
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT="${OUT:-/tmp/gpu-proof}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if ! python3 -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec("pytriton") is None)'; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ${PYTRITON_WHEEL_DIR:-.whl}/nvidia_pytriton-*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.used --format=csv
python3 scripts/gpu/prove_gpu_binding.py
