#!/bin/bash
# Per-rank script for gpt2-medium-tp4: `srun --mpi=pmix` runs one copy per rank, and each starts one
# tritonserver. Inside salloc, by hand:  srun --mpi=pmix bash <TMP>/deploy/gpt2-medium-tp4/tensorrt_llm_triton.sh
set -euo pipefail
export PYTHONPATH=<TMP>/deploy/gpt2-medium-tp4/python"${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m launcher <TMP>/deploy/gpt2-medium-tp4
