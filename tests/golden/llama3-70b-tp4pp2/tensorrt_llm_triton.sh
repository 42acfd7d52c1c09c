#!/bin/bash
# Per-rank script for llama3-70b-tp4pp2: `srun --mpi=pmix` runs one copy per rank, and each starts one
# tritonserver. Inside salloc, by hand:  srun --mpi=pmix bash <TMP>/deploy/llama3-70b-tp4pp2/tensorrt_llm_triton.sh
set -euo pipefail
# Open MPI inside the python backend stubs needs the hash GDS under PMIx (tensorrtllm_backend#553).
export PMIX_MCA_gds=hash
export NCCL_DEBUG=WARN
export UCX_UD_TIMEOUT=120s
export PYTHONPATH=<SRC>"${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m launcher <TMP>/deploy/llama3-70b-tp4pp2
