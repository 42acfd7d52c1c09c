"""The spec's schema: sections, defaults, and the checks that need no file system.

One spec describes one deployment: where it runs (`slurm`, `container`), what it serves (`model`), how
Triton serves it (`triton`) and how many copies (`mode`, `replicas`). The `model:` section is `hpc.spec.model`'s. Loading with line numbers lives in
`hpc.spec.load`, file-system checks in `hpc.spec.files`, the parameter table's spec side in `hpc.spec.parameters`,
the checks of single values that reach scripts in `hpc.spec.checks`, the `gateway:` section in `hpc.spec.gateway`,
the `renew:` section in `hpc.spec.renew`, the `autoscale:` section in `hpc.spec.autoscale`, the `build:` section in
`hpc.spec.build`.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from backend.repository import KNOWN_PARAMETERS, choices
from hpc.spec.autoscale import AutoscaleSpec
from hpc.spec.build import BuildSpec, check_build
from hpc.spec.checks import (
    _CONSTRAINT,
    _ENV_NAME,
    _MPI,
    _NAME,
    _SLURM_WORD,
    Port,
    SlurmMem,
    SlurmTime,
    _check,
    _no_newline,
    _Section,
    _single_options,
    _tcp_port,
    slurm_time_seconds,
)
from hpc.spec.gateway import GatewaySpec
from hpc.spec.llmapi import LlmApiSpec
from hpc.spec.model import ModelSpec
from hpc.spec.placement import PlacementError, replica_steps
from hpc.spec.renew import RenewSpec, format_duration
from hpc.spec.restart import RestartSpec
from hpc.spec.workflows import Backend, Workflow
from launcher.contracts.auth import MODES as AUTH_MODES
from launcher.contracts.auth import TOKEN as AUTH_TOKEN
from launcher.contracts.config import DEFAULT_READY_TIMEOUT_S, DEFAULT_WARMUP_TIMEOUT_S, RENEW_STARTUP_S, STOP_LEAD_S
from launcher.contracts.gpu import PER_RANK
from launcher.contracts.gpu import POLICIES as GPU_POLICIES
from launcher.contracts.llmapi import ENGINE

#: the start of the description of a `triton:` field that only the engine workflow's model repository reads (on
#: llmapi, setting one is an error naming its llm_api counterpart: hpc/spec/llmapi.py ENGINE_TRITON_FIELDS)
_ENGINE_ONLY = "engine workflow: "


class SlurmSpec(_Section):
    """What `#SBATCH` asks for. Names follow sbatch's long options."""

    partition: str | None = Field(None, description="--partition; default the cluster's default partition")
    account: str | None = Field(None, description="--account to charge; default your default account")
    qos: str | None = Field(None, description="--qos; default the account's")
    time: SlurmTime = Field(
        "01:00:00",
        description="--time, the job's time limit (quoted: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); "
        "renew: hands a longer service from job to job",
    )
    nodes: int = Field(1, ge=1, description="--nodes: nodes of the job, for all its replicas")
    gpus_per_node: int = Field(0, ge=0, description="GPUs requested per node (--gres=gpu:N); one rank per GPU")
    ntasks_per_node: int | None = Field(
        None, ge=1, description="ranks per node; default gpus_per_node, or world size / nodes on CPU"
    )
    cpus_per_task: int | None = Field(None, ge=1, description="--cpus-per-task: CPUs of each rank")
    mem: SlurmMem | None = Field(None, description="--mem per node, e.g. 64G or 512000M; 0: all of it; null: Slurm's")
    exclusive: bool = Field(False, description="--exclusive: no other job shares the job's nodes")
    constraint: str | None = Field(None, description="--constraint: the node features to ask for, e.g. h100")
    reservation: str | None = Field(None, description="--reservation to run in")
    gres: str | None = Field(None, description="a GRES string that replaces gpu:<gpus_per_node>")
    sbatch_args: list[str] = Field(default_factory=list, description="extra #SBATCH directives, e.g. --mail-type=END")
    srun_args: list[str] = Field(default_factory=list, description="extra srun options for the server step")
    modules: list[str] = Field(default_factory=list, description="`module load` each, quoted")
    setup: list[str] = Field(
        default_factory=list, description="shell lines run verbatim before srun (your own commands)"
    )
    env: dict[str, str] = Field(default_factory=dict, description="exported for every rank, values quoted")
    mpi: str = Field("pmix", description="srun --mpi=MPI for the ranks' steps (`srun --mpi=list`: pmix, pmi2, …)")
    gpu_clocks_mhz: int | None = Field(None, ge=100, le=5000, description="lock SM clocks: nvidia-smi -lgc N,N")
    gpu_binding: Literal[GPU_POLICIES] = Field(  # type: ignore[valid-type]
        "auto",
        description="per-rank: each rank sees only its own GPU (CUDA_VISIBLE_DEVICES); none: every GPU of its node; "
        "auto: per-rank unless ranks of one replica share a node (hpc/render/gpu_binding.py says why)",
    )

    _names = field_validator("partition", "account", "qos", "reservation", "gres")(_check(_SLURM_WORD, "Slurm name"))
    _mpi = field_validator("mpi")(_check(_MPI, "srun --mpi type (e.g. pmix, pmix_v4, pmi2; `srun --mpi=list`)"))
    _constraint = field_validator("constraint")(_check(_CONSTRAINT, "Slurm constraint expression"))
    _options = field_validator("sbatch_args", "srun_args")(_single_options)

    @field_validator("modules", "setup")
    @classmethod
    def _lines(cls, values: list[str]) -> list[str]:
        for value in values:
            _no_newline(value)
        return values

    @field_validator("env")
    @classmethod
    def _env(cls, values: dict[str, str]) -> dict[str, str]:
        for key, value in values.items():
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(f"{key!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            _no_newline(str(value))
        return {k: str(v) for k, v in values.items()}


class ContainerSpec(_Section):
    """How each rank's process is wrapped: nothing, pyxis (`srun --container-*`), or `apptainer exec --nv`."""

    type: Literal["none", "pyxis", "apptainer"] = Field(
        "none",
        description="none: the ranks run on the node itself; pyxis: `srun --container-image`; apptainer: "
        "`apptainer exec --nv`",
    )
    image: str | None = Field(
        None, description="the image (required with pyxis or apptainer), e.g. nvcr.io#nvidia/tritonserver:…"
    )
    mounts: list[str] = Field(default_factory=list, description="SRC:DST[:FLAGS]; the deployment folder is added")
    workdir: str | None = Field(
        None, description="working folder inside the container (pyxis --container-workdir, apptainer --pwd)"
    )
    name: str | None = Field(None, description="pyxis --container-name (reuse an unpacked image across steps)")
    python: str = Field("python3", description="python inside the container that runs the launcher")

    _one_line = field_validator("image", "workdir", "python")(lambda v: _no_newline(v) if v else v)
    _name = field_validator("name")(_check(_NAME, "container name"))

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, values: list[str]) -> list[str]:
        for value in values:
            _no_newline(value)
            parts = value.split(":")
            if not 1 <= len(parts) <= 3 or not all(parts[:2]):
                raise ValueError(f"{value!r} is not SRC[:DST[:FLAGS]]")
        return values

    @model_validator(mode="after")
    def _image_required(self) -> ContainerSpec:
        if self.type != "none" and not self.image:
            raise ValueError(f"@image: container.type {self.type} needs container.image")
        return self


class PortsSpec(_Section):
    """The ports each replica leader's tritonserver listens on (the other ranks have none). `auto`: free ports
    picked on the leader's node, and picked again if taken, so two deployments can share a node."""

    http: Port = Field("auto", description="tritonserver --http-port (HTTP/REST), or auto")
    grpc: Port = Field("auto", description="tritonserver --grpc-port, or auto")
    metrics: Port = Field("auto", description="tritonserver --metrics-port (Prometheus /metrics), or auto")

    _range = field_validator("http", "grpc", "metrics")(_tcp_port)

    @model_validator(mode="after")
    def _distinct(self) -> PortsSpec:
        named = [
            (n, p) for n, p in (("http", self.http), ("grpc", self.grpc), ("metrics", self.metrics)) if p != "auto"
        ]
        for i, (name, port) in enumerate(named):
            same = [other for other, p in named[i + 1 :] if p == port]
            if same:
                raise ValueError(f"@{same[0]}: {name} and {same[0]} are both port {port}; give each its own or 'auto'")
        return self


class TritonSpec(_Section):
    """tritonserver and the model repository's parameters (upstream fill_template names)."""

    server: str | None = Field(None, description="tritonserver binary; default $TRITONSERVER, NGC path, pytriton's")
    ports: PortsSpec = Field(default_factory=PortsSpec, description="each replica leader's ports")
    triton_max_batch_size: int = Field(
        64,
        ge=1,
        description=_ENGINE_ONLY + "max_batch_size of the model repository's models (llmapi: llm_api.max_batch_size)",
    )
    decoupled: bool = Field(True, description="decoupled_mode: needed for streaming and in-flight batching")
    # allowed values from the repository's one table of parameters (backend/repository.py)
    batching_strategy: Literal[choices("batching_strategy")] = Field(  # type: ignore[valid-type]
        "inflight_fused_batching",
        description=_ENGINE_ONLY + "the tensorrt_llm model's gpt_model_type (in-flight batching or V1)",
    )
    batch_scheduler_policy: Literal[choices("batch_scheduler_policy")] = Field(  # type: ignore[valid-type]
        "guaranteed_no_evict",
        description=_ENGINE_ONLY
        + "the engine's batch scheduler: guaranteed_no_evict admits a request only when its KV cache "
        "is sure to fit; max_utilization admits more and may pause some",
    )
    kv_cache_free_gpu_mem_fraction: float = Field(
        0.9, gt=0, le=1, description=_ENGINE_ONLY + "the share of free GPU memory (after the weights) for the KV cache"
    )
    max_tokens_in_paged_kv_cache: int | None = Field(
        None,
        ge=1,
        description=_ENGINE_ONLY + "at most this many tokens in the KV cache (not below the engine's max_seq_len)",
    )
    max_attention_window_size: int | None = Field(
        None, ge=1, description=_ENGINE_ONLY + "tokens of the attention window (not above the engine's max_seq_len)"
    )
    enable_kv_cache_reuse: bool = Field(
        False, description=_ENGINE_ONLY + "reuse the KV blocks of a shared prompt prefix"
    )
    exclude_input_in_output: bool = Field(
        True, description=_ENGINE_ONLY + "the output holds the generated tokens only, no prompt"
    )
    max_queue_delay_microseconds: int = Field(
        0, ge=0, description=_ENGINE_ONLY + "how long Triton's dynamic batching waits to fill a batch (config.pbtxt)"
    )
    max_queue_size: int = Field(
        0, ge=0, description=_ENGINE_ONLY + "requests Triton queues per model before it refuses more (0: no bound)"
    )
    preprocessing_instance_count: int = Field(
        1, ge=1, description=_ENGINE_ONLY + "instances of the preprocessing model"
    )
    postprocessing_instance_count: int = Field(
        1,
        ge=1,
        description=_ENGINE_ONLY + "instances of the postprocessing model (the ensemble's clean streaming needs 1)",
    )
    bls_instance_count: int = Field(1, ge=1, description=_ENGINE_ONLY + "instances of the tensorrt_llm_bls model")
    parameters: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description=_ENGINE_ONLY + "any other upstream tensorrt_llm parameter (fill_template names), checked against "
        "backend/repository.py's table; one a field above sets is refused",
    )
    log_verbose: int = Field(0, ge=0, le=6, description="tritonserver --log-verbose level on every rank")
    server_args: list[str] = Field(default_factory=list, description="extra tritonserver flags for every rank")
    ready_timeout_s: int = Field(
        DEFAULT_READY_TIMEOUT_S,
        ge=10,
        description="seconds a replica's tritonserver may take to load its models (/v2/health/ready) before the "
        "rank fails",
    )
    warmup_timeout_s: float = Field(
        DEFAULT_WARMUP_TIMEOUT_S,
        ge=1,
        description="seconds the first request (one token, after loading) may take; the replica is READY once it "
        "came back",
    )

    _server = field_validator("server")(lambda v: _no_newline(v) if v else v)

    @field_validator("parameters")
    @classmethod
    def _known(cls, values: dict[str, Any]) -> dict[str, Any]:
        for key, value in values.items():
            # "@key: ..." points the problem at the key's own line (see _problem_from_error).
            where = f"@{key}: " if re.fullmatch(r"\w+", key) else ""
            if key not in KNOWN_PARAMETERS:
                raise ValueError(f"{where}unknown tensorrt_llm parameter {key!r}{_did_you_mean(key, KNOWN_PARAMETERS)}")
            if isinstance(value, str) and ("\n" in value or "\r" in value or "\x00" in value):
                raise ValueError(f"{where}must be a single line (no newline or NUL characters)")
        return values

    @field_validator("server_args")
    @classmethod
    def _args(cls, values: list[str]) -> list[str]:
        for value in values:
            _no_newline(value)
            if not value.startswith("--"):
                raise ValueError(f"{value!r}: give each flag as one item, --name=value")
        return values


class Spec(_Section):
    """One deployment. Paths are resolved against the spec file's folder; `~` and `$VARS` are expanded."""

    name: str = Field(
        description="the deployment's name (letters, digits, '.', '_', '-'; 64 at most): the Slurm job name, the "
        "model name the gateway serves, and how a TARGET finds the deployment"
    )
    workdir: Path = Field(
        Path("runs"), description="deployment folders go here; on a cluster, a filesystem every node sees"
    )
    slurm: SlurmSpec = Field(default_factory=SlurmSpec, description="what the job asks Slurm for")
    container: ContainerSpec = Field(default_factory=ContainerSpec, description="what each rank runs in")
    model: ModelSpec = Field(description="what is served, by which engine and workflow")
    triton: TritonSpec = Field(default_factory=TritonSpec, description="tritonserver and the model repository")
    mode: Literal["leader", "orchestrator"] = Field(
        "leader",
        description="leader: every rank is a process of its own under srun; orchestrator: one process spawns the "
        "ranks (MPI_Comm_spawn; engine workflow, backend tensorrtllm, a single node)",
    )
    replicas: int = Field(
        1,
        ge=1,
        description="independent copies of the model in the job, each one srun step with its own endpoint; "
        "tp × pp × replicas must equal nodes × ntasks_per_node",
    )
    replica_policy: Literal["fail-job", "keep-serving", "restart"] = Field(
        "fail-job",
        description="when a replica dies without being asked: fail-job ends the job (every replica stops in order); "
        "keep-serving lets the others serve on (`status` shows the dead one); restart starts it again on the same "
        "nodes (bounded by restart:), the others serving meanwhile",
    )
    restart: RestartSpec | None = Field(
        None, description="replica_policy restart: how often and how soon (default: 3 in a row, from 10s, doubling)"
    )
    requeue: bool = Field(
        False,
        description="#SBATCH --requeue: Slurm restarts the job after a preemption or a node failure (same job id; "
        "the old run's endpoints are withdrawn at once, `status` counts the restarts)",
    )
    gateway: GatewaySpec | None = Field(None, description="run `hpc-serve gateway` as a Slurm job of its own")
    renew: RenewSpec | None = Field(None, description="a successor job takes over before the time limit")
    autoscale: AutoscaleSpec | None = Field(
        None, description="grow and shrink the number of serving jobs with the load (needs gateway:)"
    )
    build: BuildSpec | None = Field(None, description="build the engine as a job of its own before serving")
    llm_api: LlmApiSpec | None = Field(
        None, description="model.workflow llmapi: TensorRT-LLM LLM API arguments, written into model.yaml"
    )
    auth: Literal[AUTH_MODES] = Field(  # type: ignore[valid-type]
        AUTH_TOKEN,
        description="token: every replica (and the gateway) requires the deployment's token (`hpc-serve token`); "
        "none: anyone who reaches a port is served",
    )

    _name = field_validator("name")(_check(_NAME, "name (letters, digits, '.', '_', '-'; 64 at most)"))
    # where each value came from: the spec file, the site profile, or the default (hpc.spec.document.Provenance)
    _provenance: Any = PrivateAttr(None)

    @property
    def world_size_per_replica(self) -> int:
        """Ranks in one copy of the model: TP×PP in leader mode, one orchestrator process otherwise."""
        return 1 if self.mode == "orchestrator" else self.model.tp_size * self.model.pp_size

    @property
    def world_size(self) -> int:
        return self.world_size_per_replica * self.replicas

    @property
    def workflow_strategy(self) -> Workflow:
        """`model.workflow`'s strategy (hpc/spec/workflows.py): ask it, do not test the string."""
        return self.model.workflow_strategy

    @property
    def backend_strategy(self) -> Backend:
        """`model.backend`'s strategy (hpc/spec/workflows.py): ask it, do not test the string."""
        return self.model.backend_strategy

    @property
    def tasks_per_node(self) -> int:
        if self.slurm.ntasks_per_node is not None:
            return self.slurm.ntasks_per_node
        if self.slurm.gpus_per_node and self.backend_strategy.uses_gpus:
            return self.slurm.gpus_per_node
        return max(1, self.world_size // self.slurm.nodes)

    @model_validator(mode="before")
    @classmethod
    def _build_is_engine(cls, data: Any) -> Any:
        """A build: section makes a TensorRT engine: the workflow is engine unless the spec says otherwise."""
        if isinstance(data, dict) and data.get("build") is not None and isinstance(data.get("model"), dict):
            if "workflow" not in data["model"]:
                data = {**data, "model": {**data["model"], "workflow": ENGINE}}
        return data

    @property
    def restart_bounds(self) -> RestartSpec:
        """`restart:`, its defaults where the spec gives none (used with replica_policy restart)."""
        return self.restart or RestartSpec()

    @model_validator(mode="after")
    def _fits(self) -> Spec:
        s, m = self.slurm, self.model
        tasks = s.nodes * self.tasks_per_node
        if self.mode == "orchestrator":
            if s.nodes != 1:
                raise ValueError(
                    "@mode: mode orchestrator works on a single node only (MPI_Comm_spawn); use mode: leader"
                )
            if not self.backend_strategy.spawns_ranks:
                raise ValueError(
                    "@mode: mode orchestrator needs model.backend tensorrtllm; the CPU engine uses leader mode"
                )
            if not self.workflow_strategy.spawns_ranks:
                raise ValueError(
                    "@mode: mode orchestrator is the engine workflow's (the C++ backend spawns its ranks); "
                    "the llmapi workflow runs in leader mode"
                )
        if not self.workflow_strategy.per_rank_binding and s.gpu_binding == PER_RANK:
            raise ValueError(
                "@slurm.gpu_binding: per-rank binding breaks the llmapi workflow: TensorRT-LLM's PyTorch workers "
                "open cuda:<rank % gpus_per_node> (its Mapping), an invalid ordinal where a rank sees one GPU "
                "(measured: scripts/gpu/results/); use gpu_binding: auto or none (every rank sees its node's GPUs)"
            )
        if tasks != self.world_size:
            raise ValueError(
                f"@model.tp_size: tp_size {m.tp_size} × pp_size {m.pp_size} × replicas {self.replicas} = {self.world_size} ranks, "
                f"but slurm.nodes {s.nodes} × ntasks_per_node {self.tasks_per_node} = {tasks} tasks; "
                "make them equal"
            )
        try:  # one srun step per replica (hpc/spec/placement.py): its ranks fill whole nodes, or replicas fill a node
            replica_steps(self.replicas, self.world_size_per_replica, s.nodes, self.tasks_per_node)
        except PlacementError as exc:
            raise ValueError(f"@replicas: {exc}") from None
        if self.renew is not None:
            self._renew_fits()
        if self.autoscale is not None:
            self._autoscale_fits()
        if self.restart is not None and self.replica_policy != "restart":
            raise ValueError(
                f"@restart: restart: bounds replica_policy restart, but replica_policy is {self.replica_policy}; "
                "set replica_policy: restart, or drop restart:"
            )
        if m.serves_built_engine and m.engine_dir is None and self.build is None:
            raise ValueError(
                "@model.engine_dir: model.backend tensorrtllm needs model.engine_dir (the trtllm-build output), "
                "or a build: section that builds it"
            )
        if self.build is not None and self.workflow_strategy.builds_engines:  # else a finding (hpc/spec/llmapi.py)
            check_build(self)  # hpc/spec/build.py
        if self.backend_strategy.uses_gpus and self.mode == "leader":
            if s.gpus_per_node and self.tasks_per_node > s.gpus_per_node:
                raise ValueError(
                    f"@slurm.gpus_per_node: {self.tasks_per_node} ranks per node but slurm.gpus_per_node is {s.gpus_per_node}: "
                    "TensorRT-LLM runs one rank per GPU"
                )
            if not s.gpus_per_node:
                raise ValueError(
                    "@slurm.gpus_per_node: model.backend tensorrtllm needs slurm.gpus_per_node (one rank per GPU)"
                )
        return self

    @property
    def gpus_per_job(self) -> int:
        """GPUs one serving job asks Slurm for (slurm.nodes × slurm.gpus_per_node)."""
        return self.slurm.nodes * self.slurm.gpus_per_node

    def _autoscale_fits(self) -> None:
        """The controller runs in the gateway job and counts the budget in GPUs per job; its target must be
        reachable below the gateway's own admission bound."""
        scale = self.autoscale
        assert scale is not None
        if self.gateway is None or not self.gateway.enabled:
            raise ValueError(
                "@autoscale: autoscale: runs in the gateway job, but "
                + (
                    "the spec has no gateway: section; add `gateway: {}`"
                    if self.gateway is None
                    else "gateway.enabled is false; set it true"
                )
            )
        bound = self.gateway.max_outstanding
        if bound and scale.target_outstanding >= bound:
            raise ValueError(
                f"@autoscale.target_outstanding: {scale.target_outstanding:g} requests per replica is not below "
                f"gateway.max_outstanding {bound}: the gateway would answer 429 before the load reaches the target; "
                f"use a target below {bound}"
            )
        if scale.gpu_budget is not None:
            per_job = self.gpus_per_job
            if not per_job or self.slurm.gres is not None:
                raise ValueError(
                    "@autoscale.gpu_budget: the budget counts slurm.nodes × slurm.gpus_per_node per job, but "
                    + ("slurm.gres replaces them" if self.slurm.gres is not None else "slurm.gpus_per_node is 0")
                    + "; set slurm.gpus_per_node, or drop gpu_budget"
                )
            least = per_job * max(1, scale.min_jobs)
            if scale.gpu_budget < least:
                raise ValueError(
                    f"@autoscale.gpu_budget: {scale.gpu_budget} GPUs cannot hold "
                    f"{max(1, scale.min_jobs)} job(s) of {per_job} GPUs; use {least} or more"
                )

    def _renew_fits(self) -> None:
        """`renew.before` between the ordered stop's lead plus a successor's start-up, and slurm.time minus this
        job's start-up: earlier, the job would renew as soon as it starts (a chain of jobs that only start); later,
        its ordered stop would begin before a successor could serve."""
        assert self.renew is not None
        limit = slurm_time_seconds(self.slurm.time)
        before = self.renew.before_s
        if limit is None:
            raise ValueError(
                f"@renew: renew needs a time limit, but slurm.time is {self.slurm.time}; give slurm.time, or drop renew"
            )
        least, most = STOP_LEAD_S + RENEW_STARTUP_S, limit - RENEW_STARTUP_S
        if before < least:
            raise ValueError(
                f"@renew.before: {self.renew.before} is too short: the ordered stop begins {STOP_LEAD_S} s "
                f"before the time limit and a successor needs {RENEW_STARTUP_S:g} s at least to start; "
                f"use {format_duration(least)} or more (15m is a good start for large engines)"
            )
        if before > most:
            raise ValueError(
                f"@renew.before: {self.renew.before} must be shorter than slurm.time {self.slurm.time} "
                f"minus {RENEW_STARTUP_S:g} s of start-up, or the job would submit its successor as soon as it starts; "
                + (f"use {format_duration(most)} at most, or " if most >= least else "")
                + "a longer slurm.time"
            )
        if self.gateway is not None and self.gateway.enabled and self.gateway.time is not None:
            # the gateway job renews itself by the same `before` (hpc/jobs/renewal.py)
            gateway_limit = slurm_time_seconds(self.gateway.time)
            if gateway_limit is not None and before > gateway_limit - RENEW_STARTUP_S:
                raise ValueError(
                    f"@gateway.time: the gateway job renews itself {self.renew.before} before its time limit "
                    f"(renew.before), so gateway.time {self.gateway.time} must be longer than that plus "
                    f"{RENEW_STARTUP_S:g} s of start-up; use {format_duration(before + RENEW_STARTUP_S)} or more"
                )


def _did_you_mean(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
