"""launch.json → LaunchPlan.  The plan is written by ``hpc/render.py``; see DEVELOPERS.md for the contract."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


class PlanError(ValueError):
    """launch.json is missing or malformed."""


@dataclass(frozen=True)
class LaunchPlan:
    """The launcher's only input.  Optional keys beyond DEVELOPERS.md: ``stop_grace_s`` (default 40: tritonserver's
    own exit timeout is 30 s, so a graceful stop normally finishes before we escalate to SIGKILL)."""

    deployment_dir: Path
    model_repository: str
    tp_size: int = 1
    pp_size: int = 1
    replicas: int = 1
    world_size_per_replica: int | None = None
    mode: str = "leader"
    tritonserver: str | None = None
    ports: dict = field(default_factory=lambda: {"http": "auto", "grpc": "auto", "metrics": "auto"})
    follower_models: tuple[str, ...] = ("tensorrt_llm",)
    server_args: tuple[str, ...] = ()
    ready_timeout_s: float = 900.0
    env: dict = field(default_factory=dict)
    stop_grace_s: float = 40.0
    name: str = ""


def load(path: str | os.PathLike[str]) -> LaunchPlan:
    """Read ``DIR/launch.json`` (or a launch.json path).  Records go under the directory actually given, which
    is the same as ``deployment_dir`` unless the folder is mounted elsewhere (e.g. inside a container)."""
    p = Path(path).expanduser().absolute()
    file = p if p.is_file() else p / "launch.json"
    if not file.is_file():
        raise PlanError(f"{file} not found: `python -m launcher DIR` needs a rendered deployment folder")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise PlanError(f"{file}: invalid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version", 1) != 1:
        raise PlanError(f"{file}: expected a version 1 launch plan object")
    root = file.parent
    repo = data.get("model_repository")
    if not repo:
        raise PlanError(f"{file}: model_repository is required")
    repo_path = Path(repo) if os.path.isabs(repo) else root / repo
    mode = data.get("mode", "leader") or "leader"
    if mode not in ("leader", "orchestrator"):
        raise PlanError(f"{file}: mode must be \"leader\" or \"orchestrator\", got {mode!r}")

    def num(key: str, default: float, kind: type = int):
        value = data.get(key)
        if value is None:
            return default
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise PlanError(f"{file}: {key} must be a number, got {value!r}") from None

    wpr = data.get("world_size_per_replica")
    return LaunchPlan(
        deployment_dir=root,
        model_repository=str(repo_path),
        tp_size=num("tp_size", 1),
        pp_size=num("pp_size", 1),
        replicas=num("replicas", 1),
        world_size_per_replica=int(wpr) if wpr is not None else None,
        mode=mode,
        tritonserver=data.get("tritonserver") or None,
        ports=dict(data.get("ports") or {}),
        follower_models=tuple(data.get("follower_models") or ("tensorrt_llm",)),
        server_args=tuple(str(a) for a in data.get("server_args") or ()),
        ready_timeout_s=num("ready_timeout_s", 900.0, float),
        env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
        stop_grace_s=num("stop_grace_s", 40.0, float),
        name=str(data.get("name") or ""),
    )
