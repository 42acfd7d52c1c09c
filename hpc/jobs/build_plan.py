"""What a spec's `build:` section builds, where it goes, and whether it is built already (the cache).

An engine folder is named by what built it: the source checkpoint's name, the backend and tp/pp, and a key,
the SHA-256 of the *request* (every argument that changes the engine, and the tool: the container image, or
the CPU engine's shard format) together with the *identity of the inputs* (launcher/contracts/build_records.py: every
checkpoint file's size and mtime and the config's hash; for a checkpoint `model.init` has yet to create, the
init arguments). So a changed spec or checkpoint builds into a new folder beside the old one, and an engine
that a running job reads is never written again.

Cached: an engine folder under `build.output_dir` whose record (written by the build job once every step
succeeded) has the same request and the same inputs — the inputs as they were when the job read them, so a
checkpoint that the first build created itself matches on the next submission too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc.spec import Spec
from hpc.spec.build import build_gpus_per_node, source_checkpoint
from launcher.contracts.build_records import SHARD_FORMAT, BuildRequest, checkpoint_identity, read_record
from launcher.contracts.layout import BUILD_RECORD_NAME


@dataclass(frozen=True)
class BuildPlan:
    """One spec's build: what it asks for, and the engine folder that is (or will be) the result."""

    source: Path
    request: dict[str, Any]
    inputs: dict[str, Any]
    init: dict[str, Any] | None
    key: str
    engine_dir: Path  # where this request's build goes
    cached: Path | None  # an engine already built from this request and these inputs

    @property
    def served_dir(self) -> Path:
        """The folder the serving job reads: the cached engine, or the one the build job will make."""
        return self.cached or self.engine_dir

    def request_file(self, steps: list[dict[str, str]]) -> BuildRequest:
        """What the build job's last step reads (launcher/jobscript/build_record.py `finish`), with its `steps`."""
        return BuildRequest(
            key=self.key,
            engine_dir=str(self.engine_dir),
            source=str(self.source),
            request=self.request,
            init=self.init,
            steps=steps,
        )


def build_request(spec: Spec) -> dict[str, Any]:
    """Every argument that changes the engine (not `workers`, the time limit or the partition), and the tool."""
    b, m = spec.build, spec.model
    assert b is not None
    request: dict[str, Any] = {"backend": m.backend, "tp_size": m.tp_size, "pp_size": m.pp_size}
    if m.backend_strategy.makes_checkpoints:  # its build writes hpc-serve shards
        request["tool"] = {"name": "hpc-serve shards", "format": SHARD_FORMAT}
        return request
    request.update(
        {
            "dtype": b.dtype,
            "quantization": b.quantization,
            "kv_cache_dtype": b.kv_cache_dtype,
            "calib_size": b.calib_size,
            "gpus_per_node": build_gpus_per_node(spec),
            "plugins": b.plugin_flags(),
            "max_batch_size": b.max_batch_size or spec.triton.triton_max_batch_size,
            "max_input_len": b.max_input_len,
            "max_seq_len": b.max_seq_len,
            "max_num_tokens": b.max_num_tokens,
            "script": b.quantize_script if b.quantization else b.convert_script,
            "args": [*(b.quantize_args if b.quantization else b.convert_args), "|", *b.build_args],
            "tool": {"container": spec.container.type, "image": spec.container.image},
        }
    )
    return request


def init_request(spec: Spec) -> dict[str, Any] | None:
    """The `model.init` arguments when the build creates the checkpoint (backend cpu), else None."""
    init = spec.model.init if spec.model.backend_strategy.makes_checkpoints else None
    return (
        init.model_dump(mode="json", exclude_none=True) if init is not None else None
    )  # an unset field stays out: a cached build keeps its key


def input_identity(source: Path, init: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint's identity now; one `model.init` will create: its arguments."""
    if (source / "config.json").is_file():
        return checkpoint_identity(source)
    return {"init": init}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def plan_build(spec: Spec) -> BuildPlan:
    """The spec's build, and the engine already built for it if there is one (reads the records under
    `build.output_dir`; creates nothing)."""
    b = spec.build
    assert b is not None
    source = source_checkpoint(spec)
    request, init = build_request(spec), init_request(spec)
    inputs = input_identity(source, init)
    key = _digest({"request": request, "inputs": inputs})[:12]
    name = f"{source.name}-{spec.model.backend}-tp{spec.model.tp_size}pp{spec.model.pp_size}-{key}"
    engine_dir = b.output_dir / name
    return BuildPlan(source, request, inputs, init, key, engine_dir, find_cached(b.output_dir, request, inputs, init))


def find_cached(
    root: Path, request: dict[str, Any], inputs: dict[str, Any], init: dict[str, Any] | None
) -> Path | None:
    """The newest engine under `root` built from `request` with these inputs (or, for a checkpoint not there yet,
    from the same `model.init` arguments)."""
    if not root.is_dir():
        return None
    found: list[tuple[float, Path]] = []
    for record_path in root.glob(f"*/{BUILD_RECORD_NAME}"):
        record = read_record(record_path.parent)
        if record is None or record.request != request:
            continue
        same_inputs = record.inputs == inputs
        same_init = "init" in inputs and init is not None and record.init == init
        if same_inputs or same_init:
            found.append((record.built_at, record_path.parent))
    return max(found)[1] if found else None


def served_spec(spec: Spec, engine_dir: Path) -> Spec:
    """The spec the serving job runs: the built engine in place of the build (no `build:`, no `model.init`), so
    the deployment folder is an ordinary one for a fixed engine."""
    m = spec.model
    if m.backend_strategy.serves_built_engine:
        model = m.model_copy(update={"engine_dir": engine_dir})
    else:  # the sharded folder carries the tokenizer files; a tokenizer_dir of the spec's own stays
        model = m.model_copy(update={"checkpoint_dir": engine_dir, "init": None})
    return spec.model_copy(update={"model": model, "build": None})
