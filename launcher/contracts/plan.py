"""launch.json ↔ LaunchPlan: the one schema of the launch plan (DEVELOPERS.md, "launch.json").

``hpc/render/jobfiles.py`` builds a LaunchPlan from the spec and writes ``plan.to_dict()``; every reader (the launcher,
the renewer, ``status``, the local executor, the gateway job) reads it with ``LaunchPlan.read(path)``. The
defaults of the optional keys are ``launcher/contracts/config.py``'s. Standard library only, Python 3.10.

What a plan must say: what it serves (``model_repository``) and the job's shape (``replicas`` of
``world_size_per_replica`` ranks). Render always wrote both; a plan without one (written by hand) is refused
with the file and the key, never read as "1 replica of 1 rank": ``status`` and the launcher would disagree on
how many ranks a replica has (tp × pp in leader mode, 1 in orchestrator mode). Every other key has a default
that a plan written by hand, or by an older hpc-serve, gets (``auth`` "none", ``gpu_binding`` "none", ...).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from launcher.contracts import model_names
from launcher.contracts.auth import MODES as AUTH_MODES
from launcher.contracts.auth import NONE as AUTH_NONE
from launcher.contracts.config import (
    DEFAULT_DRAIN_S,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_WARMUP_TIMEOUT_S,
    LEADER,
    MODES,
    RELEASE_WAIT_AFTER_DRAIN_S,
    STOP_GRACE_AFTER_DRAIN_S,
)
from launcher.contracts.gpu import NONE as GPU_NONE
from launcher.contracts.gpu import PER_RANK
from launcher.contracts.layout import LAUNCH_NAME
from launcher.contracts.llmapi import BACKENDS, ENGINE, IMAGE_MODEL, OWN_MODEL, WORKFLOWS
from launcher.contracts.records import write_json_atomic
from launcher.contracts.renew_plan import RenewPlan
from launcher.contracts.workflows import rank_backend, rank_workflow

#: launch.json's version: a plan of another version is refused (a reader cannot know what it means)
VERSION = 1
#: ``replica_policy``: a failed replica ends the job (the .sub stops the others in order), or the others serve on
FAIL_JOB, KEEP_SERVING, RESTART = "fail-job", "keep-serving", "restart"
REPLICA_POLICIES = (FAIL_JOB, KEEP_SERVING, RESTART)
GPU_BINDINGS = (PER_RANK, GPU_NONE)
#: the keys a plan must have (see the module's docstring)
REQUIRED = ("model_repository", "replicas", "world_size_per_replica")
#: keys written only when set: the ordered stop's bounds default from drain_s; renew only for a renewing spec
_OMITTED_WHEN_NONE = ("stop_grace_s", "release_wait_s", "renew", "model_files_from")


class PlanError(ValueError):
    """launch.json is missing or malformed: the message names the file and the key."""


def _auto_ports() -> dict[str, int | str]:
    return {"http": "auto", "grpc": "auto", "metrics": "auto"}


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """The launcher's only input. Optional keys beyond what render writes, the bounds of an ordered stop:

    - ``drain_s`` (default 10): the leader's tritonserver gets ``--exit-timeout-secs`` from it: on SIGTERM it stops
      taking requests, waits at most this long for those in flight, unloads (the CPU engine's finalize releases
      the followers) and exits, whatever is still running. A ``--exit-timeout-secs`` in ``server_args`` wins.
    - ``release_wait_s`` (default drain + 10): how long a follower waits after a stop signal for its leader's
      release before ending its tritonserver itself (launcher/node/stop.py).
    - ``stop_grace_s`` (default drain + 3): SIGTERM → SIGKILL of the leader's tritonserver group, a backstop: it
      exits by itself within the drain time, unless its model never finishes unloading (tritonserver then
      hangs in its own teardown after "Exit timeout expired").
    """

    version: int = VERSION
    name: str = ""
    #: where the records go: the folder the plan was read from (``read``), which is the rendered one unless the
    #: folder is mounted elsewhere (e.g. inside a container)
    deployment_dir: Path
    model_repository: str
    tp_size: int = 1
    pp_size: int = 1
    replicas: int
    #: ranks of one replica: tp × pp in leader mode, 1 in orchestrator mode (the spec's, hpc/spec/schema.py)
    world_size_per_replica: int
    mode: str = LEADER
    #: None: $TRITONSERVER → /opt/tritonserver/bin/tritonserver → nvidia-pytriton's (launcher/node/server.py)
    tritonserver: str | None = None
    ports: dict[str, int | str] = field(default_factory=_auto_ports)
    follower_models: tuple[str, ...] = (model_names.TENSORRT_LLM,)
    server_args: tuple[str, ...] = ()
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    #: how long the leader's warm-up request may take (launcher/node/warmup.py)
    warmup_timeout_s: float = DEFAULT_WARMUP_TIMEOUT_S
    env: dict[str, str] = field(default_factory=dict)
    #: "token": the leader's tritonserver requires the deployment's token (launcher/contracts/auth.py); a plan written
    #: without the key (by hand, or before there was one) serves without
    auth: str = AUTH_NONE
    #: "per-rank": each rank's tritonserver sees only its own GPU (launcher/contracts/gpu.py); render resolves the spec's
    #: slurm.gpu_binding into it; a plan without the key leaves CUDA_VISIBLE_DEVICES alone
    gpu_binding: str = GPU_NONE
    #: read by `status` and the local executor; the .sub acts on it (render passes it as `fail_job`)
    replica_policy: str = FAIL_JOB
    drain_s: float = DEFAULT_DRAIN_S
    stop_grace_s: float | None = None
    release_wait_s: float | None = None
    #: the renewer's plan (launcher/jobscript/renew.py), None: the job does not renew
    renew: RenewPlan | None = None
    #: "engine" (ensemble, C++ backend) or "llmapi" (launcher/contracts/llmapi.py); a plan without it: engine
    workflow: str = ENGINE
    #: llmapi: whose leader and worker node processes the ranks run: "tensorrtllm" or "cpu" (llmapi.BACKENDS)
    backend: str = "tensorrtllm"
    #: llmapi: the folder in the image holding the model's model.py and helpers.py, copied into
    #: `<model_repository>/tensorrt_llm/1/` when the replica starts; None: they are in the repository already
    model_files_from: str | None = None
    #: the generation model's transaction policy (the spec's triton.decoupled): False, an llmapi model serving
    #: one whole response a request (model.yaml `decoupled: false`), which clients ask with `streaming` false
    decoupled: bool = True

    @property
    def llmapi_model(self) -> str:
        """llmapi: which `tensorrt_llm` model serves: the image's when its files are copied in, else hpc-serve's;
        "" on the engine workflow."""
        if not rank_workflow(self.workflow).llmapi_launch:
            return ""
        return IMAGE_MODEL if self.model_files_from else OWN_MODEL

    @property
    def imports_standin(self) -> bool:
        """llmapi on backend cpu: the ranks' `import tensorrt_llm` is the CPU engine's stand-in (llmapi.STANDIN_ROOT
        on their PYTHONPATH)."""
        backend = rank_backend(self.backend)
        return rank_workflow(self.workflow).imports_tensorrt_llm and backend is not None and backend.standin

    @property
    def world_size(self) -> int:
        """Ranks of the whole job: every replica's."""
        return self.replicas * self.world_size_per_replica

    @property
    def exit_timeout_s(self) -> float:
        """tritonserver's effective exit timeout: the last ``--exit-timeout-secs`` of server_args, else drain_s."""
        value = self.drain_s
        args = list(self.server_args)
        for i, arg in enumerate(args):
            if arg == "--exit-timeout-secs" and i + 1 < len(args):
                arg = f"--exit-timeout-secs={args[i + 1]}"
            if arg.startswith("--exit-timeout-secs="):
                try:
                    value = float(arg.split("=", 1)[1])
                except ValueError:
                    pass
        return value

    @property
    def grace_s(self) -> float:
        """SIGTERM → SIGKILL of the leader's tritonserver group (``stop_grace_s``, default exit timeout + 3)."""
        return self.stop_grace_s if self.stop_grace_s is not None else self.exit_timeout_s + STOP_GRACE_AFTER_DRAIN_S

    @property
    def follower_wait_s(self) -> float:
        """How long a follower waits for its leader's release after a stop signal (see launcher/node/stop.py)."""
        return (
            self.release_wait_s if self.release_wait_s is not None else self.exit_timeout_s + RELEASE_WAIT_AFTER_DRAIN_S
        )

    def to_dict(self) -> dict[str, Any]:
        """launch.json's object (what render writes): JSON types only, keys in the dataclass's order."""
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in _OMITTED_WHEN_NONE:
                continue
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, RenewPlan):
                value = value.to_dict()
            data[f.name] = value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], folder: Path | None = None, source: str = LAUNCH_NAME) -> LaunchPlan:
        """The plan of launch.json's object. ``folder``: where it was read from (``deployment_dir``, and what a
        relative ``model_repository`` is relative to); None: its own ``deployment_dir``. ``source`` names the
        file in a PlanError."""
        return _Reader(data, source).plan(folder)

    def write(self, path: Path) -> None:
        """Write ``path`` (a launch.json) whole: a reader never sees half of it. Indented for a reader's eyes."""
        write_json_atomic(path, self.to_dict(), indent=2)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> LaunchPlan:
        """Read ``DIR/launch.json`` (or a launch.json path); PlanError names the file, and the key when one is
        missing or malformed. Records go under the directory actually given (``deployment_dir``)."""
        p = Path(path).expanduser().absolute()
        file = p if p.is_file() or p.name == LAUNCH_NAME else p / LAUNCH_NAME
        try:
            text = file.read_text()
        except FileNotFoundError:
            raise PlanError(f"{file} not found: not a rendered deployment folder") from None
        except OSError as exc:
            raise PlanError(f"{file}: cannot be read: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PlanError(f"{file}: invalid JSON: {exc}") from None
        return cls.from_dict(data, folder=file.parent, source=str(file))


class _Reader:
    """One launch.json object, checked key by key: every PlanError says which file and which key."""

    def __init__(self, data: object, source: str) -> None:
        if not isinstance(data, Mapping):
            raise PlanError(f"{source}: expected a version {VERSION} launch plan object, got {type(data).__name__}")
        self.data, self.source = data, source

    def error(self, key: str, what: str) -> PlanError:
        return PlanError(f"{self.source}: {key} {what}")

    def value(self, key: str, required: bool = False) -> Any:
        value = self.data.get(key)
        if value is None and required:
            raise self.error(key, f"is required ({', '.join(REQUIRED)} must be given)")
        return value

    def number(
        self, key: str, default: Any, kind: type = float, required: bool = False, least: float | None = None
    ) -> Any:
        value = self.value(key, required)
        if value is None:
            return default
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise self.error(key, f"must be a number, got {value!r}") from None
        if least is not None and number < least:
            raise self.error(key, f"must be at least {least}, got {value!r}")
        return number

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.value(key) or default
        if value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return str(value)

    def renew(self) -> RenewPlan | None:
        block = self.value("renew")
        if not block:
            return None
        if not isinstance(block, Mapping):
            raise self.error("renew", f"must be an object, got {block!r}")
        try:
            return RenewPlan.from_dict(block)
        except (KeyError, TypeError, ValueError) as exc:
            raise self.error("renew", f"is malformed: {exc}") from None

    def plan(self, folder: Path | None) -> LaunchPlan:
        version = self.number("version", VERSION, int)
        if version != VERSION:
            raise self.error("version", f"must be {VERSION} (this launcher's launch plan), got {version!r}")
        repo = str(self.value("model_repository", required=True))
        root = folder if folder is not None else Path(str(self.value("deployment_dir", required=True)))
        return LaunchPlan(
            version=version,
            name=str(self.value("name") or ""),
            deployment_dir=root,
            model_repository=repo if os.path.isabs(repo) or folder is None else str(folder / repo),
            tp_size=self.number("tp_size", 1, int, least=1),
            pp_size=self.number("pp_size", 1, int, least=1),
            replicas=self.number("replicas", None, int, required=True, least=1),
            world_size_per_replica=self.number("world_size_per_replica", None, int, required=True, least=1),
            mode=self.choice("mode", LEADER, MODES),
            tritonserver=self.value("tritonserver") or None,
            ports=dict(self.value("ports") or _auto_ports()),
            follower_models=tuple(str(m) for m in self.value("follower_models") or (model_names.TENSORRT_LLM,)),
            server_args=tuple(str(a) for a in self.value("server_args") or ()),
            ready_timeout_s=self.number("ready_timeout_s", DEFAULT_READY_TIMEOUT_S),
            warmup_timeout_s=self.number("warmup_timeout_s", DEFAULT_WARMUP_TIMEOUT_S),
            env={str(k): str(v) for k, v in (self.value("env") or {}).items()},
            auth=self.choice("auth", AUTH_NONE, AUTH_MODES),
            gpu_binding=self.choice("gpu_binding", GPU_NONE, GPU_BINDINGS),
            replica_policy=self.choice("replica_policy", FAIL_JOB, REPLICA_POLICIES),
            drain_s=self.number("drain_s", DEFAULT_DRAIN_S),
            stop_grace_s=self.number("stop_grace_s", None),
            release_wait_s=self.number("release_wait_s", None),
            renew=self.renew(),
            workflow=self.choice("workflow", ENGINE, WORKFLOWS),
            backend=self.choice("backend", "tensorrtllm", BACKENDS),
            model_files_from=self.value("model_files_from") or None,
            decoupled=self.value("decoupled") is not False,
        )
