#!/bin/bash
# Per-rank script for llama3-70b-tp8pp2: `srun --mpi=pmix` runs one copy per rank, and each starts one
# tritonserver. Inside salloc, by hand:  srun --mpi=pmix bash <TMP>/deploy/llama3-70b-tp8pp2/tensorrt_llm_triton.sh
set -euo pipefail
export NCCL_DEBUG=WARN
export PYTHONPATH=<TMP>/deploy/llama3-70b-tp8pp2/python"${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m launcher <TMP>/deploy/llama3-70b-tp8pp2
