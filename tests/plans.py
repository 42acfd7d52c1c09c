"""A deployment's launch plan for tests that fake one: made through its one schema (launcher/contracts/plan.py), never as a
hand-typed dict that could drift from what render writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.contracts.layout import Deployment
from launcher.contracts.plan import LaunchPlan


def make_plan(deploy: Path, *, replicas: int = 1, world_size_per_replica: int = 1, **keys: Any) -> LaunchPlan:
    """The plan of folder `deploy` for `replicas` replicas of `world_size_per_replica` ranks (`keys`: the rest)."""
    keys.setdefault("model_repository", str(Deployment(deploy).model_repository))
    return LaunchPlan(deployment_dir=deploy, replicas=replicas, world_size_per_replica=world_size_per_replica, **keys)


def write_plan(deploy: Path, **keys: Any) -> LaunchPlan:
    """`make_plan`'s plan, written to `deploy/launch.json` (the folder created)."""
    plan = make_plan(deploy, **keys)
    deploy.mkdir(parents=True, exist_ok=True)
    plan.write(Deployment(deploy).launch)
    return plan
