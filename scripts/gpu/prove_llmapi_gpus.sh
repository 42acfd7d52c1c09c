#!/usr/bin/env bash
# llmapi GPU visibility, proven on a machine with ≥ 2 GPUs (scripts/gpu/prove_llmapi_gpus.py says what).
# Needs: python3 with torch; tritonserver from the nvidia-pytriton wheel, installed or as a wheel in
# ${PYTRITON_WHEEL_DIR:-.whl} (the device tool's way, as for prove_gpu_binding.sh).
# numpy ≥ 2 breaks every output tensor of tritonserver 2.51's python stub ("output tensor shape does not match size
# of output", seen on the device, DEVELOPERS.md "One GPU per rank"), and the launcher's warm-up needs text_output.
# If that wheel folder also holds a numpy 1.x wheel, it is installed to /tmp/numpy1 and put first on sys.path of
# the python stub alone (the stub ignores PYTHONPATH; a .pth that acts only in triton_python_backend_stub,
# removed on exit). Usage: scripts/gpu/prove_llmapi_gpus.sh   (results: $OUT or /tmp/llmapi-gpu-proof)
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT="${OUT:-/tmp/llmapi-gpu-proof}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
wheels=${PYTRITON_WHEEL_DIR:-.whl}
if ! python3 -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec("pytriton") is None)'; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheels"/nvidia_pytriton-*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
numpy1=$(ls "$wheels"/numpy-1.*.whl 2>/dev/null | head -1 || true)
if [ -n "$numpy1" ] && python3 -c 'import numpy,sys; sys.exit(int(numpy.__version__.split(".")[0]) < 2)'; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/numpy1 "$numpy1"
    pth="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/00-llmapi-proof-stub-numpy1.pth"
    trap 'rm -f "$pth"' EXIT
    echo 'import os, sys; os.readlink("/proc/self/exe").endswith("triton_python_backend_stub") and sys.path.insert(0, "/tmp/numpy1")' >"$pth"
    echo "python stub: numpy from /tmp/numpy1 ($(basename "$numpy1")); others: $(python3 -c 'import numpy; print(numpy.__version__)')"
fi
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "GPUs", torch.cuda.device_count())'
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.used --format=csv
python3 scripts/gpu/prove_llmapi_gpus.py
