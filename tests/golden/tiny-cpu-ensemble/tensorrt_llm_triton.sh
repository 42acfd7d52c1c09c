#!/bin/bash
# Per-rank script for tiny-cpu-ensemble: `srun --mpi=pmix` runs one copy per rank, and each starts one
# tritonserver. Inside salloc, by hand:  srun --mpi=pmix bash <TMP>/deploy/tiny-cpu-ensemble/tensorrt_llm_triton.sh
set -euo pipefail
export PYTHONPATH=<TMP>/deploy/tiny-cpu-ensemble/python"${PYTHONPATH:+:$PYTHONPATH}"
exec <PYTHON> -m launcher <TMP>/deploy/tiny-cpu-ensemble
