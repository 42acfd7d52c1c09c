#!/bin/bash
# Per-rank script for llama3-8b: `srun --mpi=pmix` runs one copy per rank, and each starts one
# tritonserver. Inside salloc, by hand:  srun --mpi=pmix bash <TMP>/deploy/llama3-8b/tensorrt_llm_triton.sh
set -euo pipefail
export PYTHONPATH=<TMP>/deploy/llama3-8b/python"${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m launcher <TMP>/deploy/llama3-8b
