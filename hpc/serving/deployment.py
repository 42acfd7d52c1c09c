"""A deployment and its published replicas: every job of it (same spec `name` in the same workdir), read
from the endpoint records its leaders publish (launcher/contracts/records.py). Synchronous and without network I/O, so
the gateway (which adds health checks, hpc/serving/discovery.py) and the Python client share it.

Also what a TARGET names (`resolve`): every command about a deployment (`gateway`, `token`, `status`,
`endpoints`) takes a spec file, a deployment folder, a deployment name or job ids, and reads them one way.
A name is looked up in the job index because that is the one list of deployments a user has, wherever their
workdirs are; the same name in two workdirs is refused, listing both, rather than guessed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from hpc.serving.balancer import Replica
from launcher.contracts.job_index import entries, entry_name, index_dir
from launcher.contracts.layout import SPEC_NAME, Deployment, JobPaths
from launcher.contracts.records import EndpointRecord, read_endpoints

if TYPE_CHECKING:
    from hpc.scheduler.index import JobRef
    from hpc.spec.schema import ModelSpec, Spec


@dataclass(frozen=True)
class Target:
    """A deployment: every folder under `workdir` rendered from a spec called `name`."""

    workdir: Path
    name: str
    tokenizer_dir: Path
    #: a folder of the deployment named outright (`render -o DIR`, then `sbatch` by hand) whose name need not
    #: follow render's `<name>-<time>`; counted with the others
    named_folder: Path | None = field(default=None, compare=False)
    #: its spec's model section (where its engine or checkpoint is); None for a Target made by hand
    model: ModelSpec | None = field(default=None, compare=False)
    #: its spec's `llm_api.max_seq_len` (the llmapi workflow's cap below the checkpoint's positions), if set
    max_seq_len: int | None = field(default=None, compare=False)
    #: its spec's `autoscale.hold_s`: how long a gateway holds a request that finds no replica (0: none, 503 at once)
    hold_s: float = field(default=0.0, compare=False)
    #: its spec has `autoscale:` (a controller's record to show in the gateway's metrics)
    autoscaled: bool = field(default=False, compare=False)


def target_of_spec(spec: Spec, workdir: Path, named_folder: Path | None = None) -> Target:
    """The deployment of a loaded spec, with what the gateway reads of it (the model, the sequence cap)."""
    max_seq_len = spec.llm_api.max_seq_len if spec.llm_api is not None else None
    hold_s = spec.autoscale.hold_s if spec.autoscale is not None else 0.0
    return Target(
        workdir,
        spec.name,
        Path(spec.model.tokenizer),
        named_folder,
        spec.model,
        max_seq_len,
        hold_s,
        autoscaled=spec.autoscale is not None,
    )


#: the YAML loader: libyaml's where PyYAML was built with it (much faster than the pure-Python one)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: spec file → ((mtime_ns, size), its `name`): see `spec_name`
_names: dict[Path, tuple[tuple[int, int], str | None]] = {}


def spec_name(folder: Path) -> str | None:
    """The `name` in a deployment folder's resolved spec. Cached by the file's modification time and size. Why:
    a gateway asks for every folder of its workdir that could be its deployment's at each discovery refresh
    (every few seconds, for days), on a thread that holds the GIL while it parses, stalling the event loop that
    relays every stream (docs/decisions.md "The gateway's own time"). Render writes the file once."""
    path = folder / SPEC_NAME
    try:
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        if (cached := _names.get(path)) is not None and cached[0] == key:
            return cached[1]
        data = yaml.load(path.read_text(), Loader=_LOADER)  # noqa: S506 - a safe loader
    except (OSError, yaml.YAMLError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    _names[path] = (key, name if isinstance(name, str) else None)
    return _names[path][1]


class TargetError(LookupError):
    """TARGET names no deployment (`ambiguous` False: not found), or more than one (True: say which)."""

    def __init__(self, message: str, ambiguous: bool = False):
        super().__init__(message)
        self.ambiguous = ambiguous


#: what a scheduler's job id looks like (Slurm: 123, 123_4 array task, 123+1 het component; local-<hex>)
_JOB_ID = re.compile(r"^(\d+([_+]\d+)?|local-[0-9a-f]+)$")


def target_of_folder(deploy_dir: Path) -> Target:
    """The deployment a rendered folder belongs to, from the resolved spec render wrote there (absolute paths).
    Files are not checked: a model folder removed since does not hide the deployment from `status` or `cancel`."""
    from hpc.spec import load_spec

    spec = load_spec(Deployment(deploy_dir).spec, check_files=False)
    return target_of_spec(spec, deploy_dir.parent.resolve(), deploy_dir.resolve())


def deployments_named(name: str) -> dict[Path, Path]:
    """Workdir → its newest deployment folder, for every workdir where a job of a deployment called `name` is in
    the job index (job_index.index_dir: every job `submit` or a `.sub` ran). Newest job first decides nothing here:
    the folder names sort by time (render names them `<name>-<time>[-n]`)."""
    from hpc.scheduler.index import list_jobs

    found: dict[Path, Path] = {}
    seen: set[Path] = set()
    for ref in list_jobs():
        folder = ref.deploy_dir
        if folder in seen:
            continue
        seen.add(folder)
        if spec_name(folder) == name:
            workdir = folder.parent.resolve()
            found[workdir] = max(found.get(workdir, folder), folder, key=lambda d: d.name)
    return found


def names_indexed_job(text: str) -> bool:
    """`text` is a job folder, or a job id in the job index: a job before anything else it might also name."""
    path = Path(text).expanduser()
    if path.is_dir():
        return JobPaths.is_job_folder(path)
    return bool(entries(text))


def _resolve_one(text: str) -> tuple[Target, JobRef | None]:
    from hpc.scheduler.index import JobNotFound, find_job
    from hpc.spec import load_spec

    path = Path(text).expanduser()
    if path.is_file():
        spec = load_spec(path, check_files=False)
        return target_of_spec(spec, spec.workdir.resolve()), None
    if path.is_dir():
        if JobPaths.is_job_folder(path):
            ref = find_job(str(path))
            return target_of_folder(ref.deploy_dir), ref
        if Deployment(path).spec.is_file():
            return target_of_folder(path.resolve()), None
        raise TargetError(f"{text}: a folder, but neither a deployment folder (no {SPEC_NAME}) nor a job folder")
    if entries(text):  # `33`, or `33@cluster` (launcher/contracts/job_index.py)
        ref = find_job(text)
        return target_of_folder(ref.deploy_dir), ref
    named = deployments_named(text) if os.sep not in text else {}
    if len(named) > 1:
        listing = "\n".join(f"  {workdir}  (newest: {folder.name})" for workdir, folder in sorted(named.items()))
        raise TargetError(
            f"{text}: deployments of that name run in {len(named)} workdirs:\n{listing}\n"
            "pass the spec file, a deployment folder or a job id instead",
            ambiguous=True,
        )
    if named:
        (folder,) = named.values()
        return target_of_folder(folder), None
    if _JOB_ID.fullmatch(text):
        try:
            ref = find_job(text)  # a job submitted by hand and not indexed yet: scontrol / sacct know its folder
        except JobNotFound as exc:
            raise TargetError(str(exc)) from None
        return target_of_folder(ref.deploy_dir), ref
    raise TargetError(
        f"{text}: not a spec file, a deployment or job folder, a job id, or the name of a deployment with a job "
        f"in {index_dir()}{_did_you_mean(text)}"
    )


def indexed_names() -> set[str]:
    """The name of every deployment with a job in the job index."""
    from hpc.scheduler.index import list_jobs

    return {name for name in (spec_name(folder) for folder in {ref.deploy_dir for ref in list_jobs()}) if name}


def _did_you_mean(text: str) -> str:
    """`; did you mean 'tiny-cpu'?` for a mistyped deployment name, or a spec file of that name here."""
    import difflib

    close = difflib.get_close_matches(text, sorted(indexed_names()), n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    for suffix in (".yaml", ".yml"):
        if Path(text + suffix).is_file():
            return f"; did you mean the spec file {text + suffix}?"
    return ""


def resolve(targets: Sequence[str]) -> tuple[Target, list[JobRef]]:
    """TARGET as every command that takes one reads it: a spec file, a deployment folder, a deployment name
    (looked up in the job index), or one or more job ids / job folders, which must all belong to one deployment.
    Returns the deployment and the jobs named (none for the other forms). Raises SpecError, TargetError."""
    if not targets:
        raise TargetError("no TARGET: give a spec file, a deployment name, or job ids")
    resolved = [_resolve_one(t) for t in targets]
    first = resolved[0][0]
    others = {(t.workdir, t.name) for t, _ in resolved} - {(first.workdir, first.name)}
    if others:
        listing = "\n".join(
            f"  {text}: {t.name} in {t.workdir}" for text, (t, _) in zip(targets, resolved, strict=True)
        )
        raise TargetError(f"the TARGETs name more than one deployment:\n{listing}", ambiguous=True)
    return first, [ref for _, ref in resolved if ref is not None]


def resolve_target(*targets: str) -> Target:
    """The deployment TARGET names (see `resolve`)."""
    return resolve(targets)[0]


def deployment_folders(target: Target) -> list[Path]:
    """Every deployment folder of the target, oldest first (render names them `<name>-<time>[-n]`)."""
    if not target.workdir.is_dir():
        return []
    found = {
        d
        for d in target.workdir.iterdir()
        if d.name.startswith(f"{target.name}-") and d.is_dir() and spec_name(d) == target.name
    }
    if target.named_folder is not None and target.named_folder.is_dir():
        found.add(target.named_folder)
    return sorted(found, key=lambda d: d.name)


def job_folders(target: Target) -> Iterator[JobPaths]:
    """Every job of the deployment (its serving jobs and its gateway jobs), folder by folder, oldest first."""
    for folder in deployment_folders(target):
        jobs_dir = Deployment(folder).jobs_dir
        for job_dir in sorted(jobs_dir.iterdir()) if jobs_dir.is_dir() else []:
            yield JobPaths(folder, job_dir.name)


def published(target: Target) -> Iterator[EndpointRecord]:
    """The endpoint records of every job of the deployment that was not cancelled."""
    for paths in job_folders(target):
        if not paths.cancel_marker.exists():
            yield from read_endpoints(paths)


def replica_key(record: EndpointRecord) -> str:
    """`<job>/<replica>`, the job named as its index entry is (`33@twin/0`; a local job's id alone: `local-1a2b/0`):
    job ids are unique per Slurm cluster only, and one deployment's folders may hold job 33 of two clusters."""
    return f"{entry_name(record.job_id, record.cluster)}/{record.replica}"


def job_of_key(key: str) -> str:
    """The job of a replica key (`33@twin/0` → `33@twin`): what draining and tokens are keyed by
    (job_index.entry_name_of its folder)."""
    return key.rsplit("/", 1)[0]


def as_replica(record: EndpointRecord) -> Replica:
    return Replica(
        key=replica_key(record),
        http_url=record.http_url,
        grpc_url=record.grpc_url,
        workflow=record.workflow,
        decoupled=record.decoupled,
        llmapi_model=record.llmapi_model,
        restarts=record.restarts,
    )
