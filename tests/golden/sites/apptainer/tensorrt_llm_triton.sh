#!/bin/bash
# Per-rank script for gpt2-medium-portable: `srun --mpi=pmix` runs one copy per rank, and each starts one
# tritonserver. Inside salloc, by hand:  srun --mpi=pmix bash <TMP>/deploy/apptainer/tensorrt_llm_triton.sh
set -euo pipefail
export PYTHONPATH=<TMP>/deploy/apptainer/python"${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m launcher <TMP>/deploy/apptainer
