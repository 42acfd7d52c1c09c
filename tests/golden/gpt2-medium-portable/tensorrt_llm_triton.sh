#!/bin/bash
# Per-rank script for gpt2-medium-portable: `srun --mpi=pmix` runs one copy per rank, and each starts one
# tritonserver. Inside salloc, by hand:  srun --mpi=pmix bash <TMP>/deploy/gpt2-medium-portable/tensorrt_llm_triton.sh
set -euo pipefail
export PYTHONPATH=<TMP>/deploy/gpt2-medium-portable/python"${PYTHONPATH:+:$PYTHONPATH}"
exec <PYTHON> -m launcher <TMP>/deploy/gpt2-medium-portable
