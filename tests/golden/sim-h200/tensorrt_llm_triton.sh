#!/bin/bash
# Per-rank script for sim-h200: `srun --mpi=pmix` runs one copy per rank, and each starts one
# tritonserver. Inside salloc, by hand:  srun --mpi=pmix bash <TMP>/deploy/sim-h200/tensorrt_llm_triton.sh
set -euo pipefail
export PYTHONPATH=<TMP>/deploy/sim-h200/python"${PYTHONPATH:+:$PYTHONPATH}"
exec <PYTHON> -m launcher <TMP>/deploy/sim-h200
