"""The llmapi workflow's contract: TensorRT-LLM's LLM API model `tensorrt_llm` (all_models/llmapi) and the way
NVIDIA launches it on Slurm (`srun --mpi=pmix ... trtllm-llmapi-launch tritonserver`). One definition for render,
the launcher, the CPU engine's stand-in processes and the tests. Standard library only, Python 3.10.

The process layout (docs/decisions.md "The llmapi launch without trtllm-llmapi-launch"; TensorRT-LLM's
`tensorrt_llm/llmapi/trtllm-llmapi-launch`): a replica's step has tp × pp tasks. Its rank 0 runs the *leader node*
(MPI rank 0 of the engine, a session server on a loopback IPC address) and tritonserver, whose `tensorrt_llm`
model reaches the leader node over that address instead of spawning MPI workers; tritonserver runs with the
MPI/Slurm job variables removed. Every other rank runs a *worker node*. hpc-serve does these steps itself rather
than call `trtllm-llmapi-launch`, so that each process is supervised (fail fast with rank, exit code and log
tail), the IPC port is one of the job's own free ports, and the stop is ordered.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Final

#: the spec's `model.workflow` and launch.json's `workflow`: the LLM API model (TensorRT-LLM 1.x, PyTorch
#: backend, Hugging Face checkpoints) or the TensorRT-engine path (ensemble, C++ backend; TensorRT-LLM <= 1.2.x)
LLMAPI, ENGINE = "llmapi", "engine"
WORKFLOWS = (LLMAPI, ENGINE)
#: the spec's `model.backend` and launch.json's `backend`: TensorRT-LLM, hpc-serve's CPU engine, or its simulated
#: GPU engine (backend/sim_engine/)
BACKENDS = ("tensorrtllm", "cpu", "sim")

#: rank 0 (leader node) and ranks > 0 (worker node) run TensorRT-LLM's modules (trtllm_versions.LEADER_NODE_MODULE,
#: WORKER_NODE_MODULE) for either backend: with `model.backend: cpu` they are the CPU engine's stand-in of the
#: library (STANDIN_ROOT put on PYTHONPATH), which keeps upstream's module names, arguments and process layout
#: the folder, relative to hpc-serve's source root (the deployment's `D/python`), that holds the stand-in package
#: `tensorrt_llm` (backend/standin/tensorrt_llm): on the ranks' PYTHONPATH for backend cpu only
STANDIN_ROOT = "backend/standin"
#: which release the stand-in behaves as (backend/standin/tensorrt_llm/version.py): this variable, else
#: the newest NGC image's
STANDIN_VERSION_VAR = "HPC_SERVE_TRTLLM_STANDIN_VERSION"
STANDIN_DEFAULT_VERSION = "1.2.1"
#: the ranks' process-count variable trtllm-llmapi-launch exports on every rank (its `tllm_mpi_size`)
MPI_SIZE_VAR = "tllm_mpi_size"

#: the CPU engine's leader node: the least time an engine step takes, in ms (its --min-step-ms), so that a test
#: counting engine steps sees a GPU's pace in a job (the spec's `slurm.env` sets it); no meaning to TensorRT-LLM
CPU_MIN_STEP_VAR = "HPC_SERVE_CPU_MIN_STEP_MS"
#: which engine the stand-in's leader and worker nodes run (backend/engines.py ENGINE_KINDS: a backend's name; unset:
#: the CPU engine) and, for the simulated one, which GPU it stands in for (backend/sim_engine/profiles.py GPUS):
#: launch.json's `env`, from the spec's model.backend and model.sim (hpc/spec/workflows.py `Backend.rank_env`)
ENGINE_VAR = "HPC_SERVE_STANDIN_ENGINE"
SIM_GPU_VAR = "HPC_SERVE_SIM_GPU"
#: how many times the GPU's time each simulated step takes (model.sim.slowdown; unset: 1, the GPU's pace)
SIM_SLOWDOWN_VAR = "HPC_SERVE_SIM_SLOWDOWN"

#: what TensorRT-LLM reads to connect the LLM inside tritonserver to the leader node (tensorrt_llm/executor/utils.py)
SPAWN_PROXY_VAR = "TLLM_SPAWN_PROXY_PROCESS"
IPC_ADDR_VAR = "TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR"
#: hex (TensorRT-LLM does bytes.fromhex); HMAC-signs every message on the IPC address
IPC_HMAC_KEY_VAR = "TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY"

#: removed from tritonserver's environment, as trtllm-llmapi-launch does: an MPI process must not spawn a child
#: that shares its MPI job (a second MPI_Init in the child is undefined behaviour)
MPI_ENV_PREFIXES = (
    "OMPI_",
    "PMIX_",
    "PMI_",
    "SLURM_",
    "MPI_",
    "UCX_",
    "I_MPI_",
    "HYDRA_",
    "KMP_",
    "MPICH_",
    "MV2_",
    "CRAY_",
)

#: the spec's `model.llmapi_model`: which `tensorrt_llm` Triton model serves: hpc-serve's own (backend/models/
#: llmapi.py, over the LLM API), or the image's model.py and helpers.py (NVIDIA's, copied at job start)
OWN_MODEL: Final = "hpc-serve"
IMAGE_MODEL: Final = "image"
LLMAPI_MODELS = (OWN_MODEL, IMAGE_MODEL)
#: the model's config file in `<repo>/tensorrt_llm/1/` (LLM_CONFIG_PATH overrides it upstream)
MODEL_YAML = "model.yaml"
LLM_CONFIG_PATH_VAR = "LLM_CONFIG_PATH"
#: the files that must match the image's TensorRT-LLM: copied at job start into `<repo>/tensorrt_llm/1/`
MODEL_FILES = ("model.py", "helpers.py")
#: where NGC `tritonserver:*-trtllm-python-py3` images keep them (tensorrtllm_backend's Dockerfile copies
#: triton_backend/all_models to /app/all_models)
IMAGE_MODEL_DIR = "/app/all_models/llmapi/tensorrt_llm/1"
#: model.yaml's `triton_config.cancellation_check_period_ms` default upstream: how often a cancelled call is seen
CANCELLATION_CHECK_PERIOD_MS = 100


def ipc_address(port: int) -> str:
    """The leader node's address: loopback, since tritonserver and the leader node share rank 0's node."""
    return f"tcp://127.0.0.1:{port}"


def new_hmac_key() -> str:
    """A fresh key per replica start, handed to the leader node and tritonserver through their environments only."""
    return secrets.token_hex(32)


def proxy_env(port: int, key: str) -> dict[str, str]:
    """The variables both the leader node and tritonserver get."""
    return {SPAWN_PROXY_VAR: "1", IPC_ADDR_VAR: ipc_address(port), IPC_HMAC_KEY_VAR: key}


def without_mpi(env: Mapping[str, str]) -> dict[str, str]:
    """`env` less every MPI/Slurm job variable: tritonserver's environment on this workflow."""
    return {k: v for k, v in env.items() if not k.startswith(MPI_ENV_PREFIXES)}


#: the LLM API model's perf outputs, in the order upstream appends them (backend/models/llmapi_io.py sends them,
#: hpc/serving/model_io.py reads them)
PERF_OUTPUTS = (
    "kv_cache_reused_block",
    "kv_cache_hit_rate",
    "kv_cache_alloc_new_blocks",
    "kv_cache_alloc_total_blocks",
    "kv_cache_missed_block",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
)
