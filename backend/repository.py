"""Write the Triton model repository (ensemble, preprocessing, tensorrt_llm, postprocessing, tensorrt_llm_bls).

This is upstream `tools/fill_template.py` done right (docs/decisions.md "The engine workflow's model repository"):

* keys are the upstream fill keys (`KNOWN_PARAMETERS`); an unknown key is a ValueError with a did-you-mean,
  not a silent no-op;
* values are typed: bools render `true`/`false`, numbers are checked, strings are escaped for pbtxt so a
  quote, backslash or newline cannot break the file, and nothing needs `\\,` escaping;
* structural fields (max_batch_size, decoupled, dtypes, instance counts, queue settings) are required
  (`required_parameters()`), optional `parameters {}` entries that were not given are omitted — the output
  never contains `${`;
* the repository is built in a temporary sibling directory and renamed into place.

The tensor tables live in `backend/templates/tables.py` (`MODELS`; the engine side's three in `engine_tables.py`) and the parameter table in `backend/parameters.py`;
this module only renders them.
Only the standard library is imported (the `hpc` side calls this at render time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from backend.parameters import (  # re-exported: the repository's callers import the table from here too
    BACKENDS,
    CPU_ENGINE_MODULE,
    HPC_SERVE_PARAMETERS,
    KNOWN_PARAMETERS,
    REPOSITORY_BACKENDS,
    REQUIRED_PARAMETERS,
    UPSTREAM_DEFAULTS,
    Backend,
    choices,
    normalize_parameter,
    required_parameters,
    validate_parameters,
)
from backend.templates.table_types import ModelTable, Tensor
from backend.templates.tables import MODELS
from launcher.contracts import model_names

# Which python module each python model's `1/model.py` shim re-exports `TritonPythonModel` from.
PYTHON_MODEL_MODULES: dict[str, str] = {
    model_names.PREPROCESSING: "backend.models.preprocessing",
    model_names.POSTPROCESSING: "backend.models.postprocessing",
    model_names.TENSORRT_LLM_BLS: "backend.models.bls",
}
MARKER_FILE = ".hpc-serve-repository.json"


# ------------------------------------------------------------------------------------------------ rendering
def pbtxt_string(text: str) -> str:
    """Quote `text` as a protobuf text-format string literal (C escapes; non-ASCII as octal UTF-8 bytes)."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch in "\"'\\":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif byte < 0x20 or byte >= 0x7F:
            out.append(f"\\{byte:03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# A resolver maps a fill key to its rendered text, or None when the key was not given.
Resolver = Callable[[str], "str | None"]


def _dims(dims: tuple[int, ...]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]" if dims else "[ ]"


def _tensor_block(t: Tensor, dtype: Callable[[str], str]) -> str:
    lines = [f'    name: "{t.name}"', f"    data_type: {dtype(t.dtype)}", f"    dims: {_dims(t.dims)}"]
    if t.reshape is not None:
        lines.append(f"    reshape: {{ shape: {_dims(t.reshape)} }}")
    if t.optional:
        lines.append("    optional: true")
    if t.ragged:
        lines.append("    allow_ragged_batch: true")
    return "  {\n" + "\n".join(lines) + "\n  }"


def render_config(
    model: ModelTable, scalar: Resolver, string: Resolver, fixed_overrides: Mapping[str, str] | None = None
) -> str:
    """Render one config.pbtxt. `scalar(key)` gives an unquoted token (number, bool, enum), `string(key)`
    a quoted pbtxt string; both return None for keys that were not given (the entry is then omitted).
    `fixed_overrides` replaces upstream's hard-coded parameter values (Triton key → value).
    Required keys are validated before rendering, so a None for a structural key is a bug → KeyError."""

    def need(resolve: Resolver, key: str) -> str:
        text = resolve(key)
        if text is None:
            raise KeyError(f"{model.name}: structural key {key!r} has no value")
        return text

    def dtype(spec: str) -> str:
        return need(scalar, spec[1:]) if spec.startswith("$") else spec

    out = [f'name: "{model.name}"']
    if model.kind == "ensemble":
        out.append('platform: "ensemble"')
    elif model.kind == "python":
        out.append('backend: "python"')
    else:
        out.append(f"backend: {need(string, 'triton_backend')}")
    out.append(f"max_batch_size: {need(scalar, 'triton_max_batch_size')}")
    if model.decoupled_key:
        out.append(f"\nmodel_transaction_policy {{\n  decoupled: {need(scalar, model.decoupled_key)}\n}}")
    if model.dynamic_batching == "empty":
        out.append("\ndynamic_batching {\n}")
    elif model.dynamic_batching == "queue":
        mbs = need(scalar, "triton_max_batch_size")
        out.append(
            "\ndynamic_batching {\n"
            f"  preferred_batch_size: [ {mbs} ]\n"
            f"  max_queue_delay_microseconds: {need(scalar, 'max_queue_delay_microseconds')}\n"
            f"  default_queue_policy: {{ max_queue_size: {need(scalar, 'max_queue_size')} }}\n"
            "}"
        )
    out.append("\ninput [\n" + ",\n".join(_tensor_block(t, dtype) for t in model.inputs) + "\n]")
    out.append("output [\n" + ",\n".join(_tensor_block(t, dtype) for t in model.outputs) + "\n]")
    if model.steps:
        steps = []
        for step in model.steps:
            lines = [f'      model_name: "{step.model_name}"', "      model_version: -1"]
            lines += [f'      input_map {{ key: "{k}" value: "{v}" }}' for k, v in step.input_map]
            lines += [f'      output_map {{ key: "{k}" value: "{v}" }}' for k, v in step.output_map]
            steps.append("    {\n" + "\n".join(lines) + "\n    }")
        out.append("\nensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}")
    if model.instance_count is not None:
        count = (
            str(model.instance_count) if isinstance(model.instance_count, int) else need(scalar, model.instance_count)
        )
        out.append(f"\ninstance_group [\n  {{\n    count: {count}\n    kind: KIND_CPU\n  }}\n]")
    for param in model.parameters:
        fixed = (fixed_overrides or {}).get(param.key, param.fixed)
        value = pbtxt_string(fixed) if fixed is not None else string(param.source or "")
        if value is None:
            continue
        out.append(f'\nparameters: {{\n  key: "{param.key}"\n  value: {{\n    string_value: {value}\n  }}\n}}')
    return "\n".join(out) + "\n"


def _filled(values: Mapping[str, str]) -> tuple[Resolver, Resolver]:
    return (values.get, lambda k: pbtxt_string(values[k]) if k in values else None)


def _placeholders() -> tuple[Resolver, Resolver]:
    return (lambda k: "${" + k + "}", lambda k: '"${' + k + '}"')


def render_templates() -> dict[str, str]:
    """model name → config.pbtxt with upstream `${key}` placeholders (the files in backend/templates/)."""
    return {m.name: render_config(m, *_placeholders()) for m in MODELS}


def render_repository(backend: Backend, params: Mapping[str, object]) -> dict[str, str]:
    """Validate `params` and return relative path → file text for the whole repository (no disk access)."""
    values = validate_parameters(backend, params)
    scalar, string = _filled(values)
    files: dict[str, str] = {}
    for model in MODELS:
        module = PYTHON_MODEL_MODULES.get(model.name)
        overrides: dict[str, str] = {}
        if model.name == model_names.TENSORRT_LLM:  # the backend's python model, if it has one (its table)
            module, overrides = REPOSITORY_BACKENDS[backend].module, dict(REPOSITORY_BACKENDS[backend].overrides)
        files[f"{model.name}/config.pbtxt"] = render_config(model, scalar, string, overrides)
        # Every model needs a version directory; TensorRT-LLM's stays empty (engine via gpt_model_path).
        files[f"{model.name}/1/"] = ""
        if module is not None:
            files[f"{model.name}/1/model.py"] = shim(model.name, module)
    files[MARKER_FILE] = json.dumps({"backend": backend, "parameters": values}, indent=2, sort_keys=True) + "\n"
    return files


def shim(model_name: str, module: str) -> str:
    """The model.py of a python model: it imports the real code from the hpc-serve tree the launcher put on
    PYTHONPATH (the deployment's shipped copy, `D/python`). The python backend's stub embeds Python without
    honouring PYTHONPATH (docs/decisions.md "Python stubs ignore PYTHONPATH": the variable is in its
    environment, not in sys.path), so the shim puts the entries there itself; without this the stubs import hpc-serve only where
    it is pip-installed, and a cluster running from source, or a container given only the deployment folder,
    fails with `No module named 'backend'`."""
    return (
        f'"""{model_name}: written by hpc-serve (backend/repository.py). The code lives in {module};\n'
        'tritonserver must run with the hpc-serve source tree on PYTHONPATH (the launcher sets it)."""\n'
        "import os\n"
        "import sys\n"
        "\n"
        "# The stub's embedded Python ignores PYTHONPATH: honour it here, first, as python itself would.\n"
        'for _entry in reversed([e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]):\n'
        "    if _entry in sys.path:\n"
        "        sys.path.remove(_entry)\n"
        "    sys.path.insert(0, _entry)\n"
        "\n"
        f"from {module} import TritonPythonModel  # noqa: E402,F401\n"
    )


# ------------------------------------------------------------------------------------------------- writing
def check_replaceable(out_dir: Path) -> None:
    """Refuse to replace `out_dir` unless it is missing, empty, or a repository this module wrote (it carries
    `.hpc-serve-repository.json`): never someone's unrelated folder.  Also used by render before its swap."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    if any(out_dir.iterdir()) and not (out_dir / MARKER_FILE).is_file():
        raise FileExistsError(
            f"{out_dir} is not empty and is not an hpc-serve model repository "
            f"(no {MARKER_FILE}); refusing to replace it"
        )


def write_model_repository(out_dir: Path, backend: Backend, params: Mapping[str, object]) -> None:
    """Write the five-model repository to `out_dir`, replacing a previous one atomically.

    Everything is validated before the disk is touched. The tree is built in a temporary sibling
    directory, then swapped in with two renames (old → trash, new → out_dir), so tritonserver never sees
    a half-written repository. An existing `out_dir` is only replaced if it is empty or was written by
    this function (it carries `.hpc-serve-repository.json`) — never someone's unrelated folder.
    """
    write_repository_files(out_dir, render_repository(backend, params))


def write_repository_files(out_dir: Path, files: Mapping[str, str]) -> None:
    """Write `files` (relative path → text; a path ending in "/" is a folder) as the repository `out_dir`, swapped
    in whole (see write_model_repository). `files` must hold MARKER_FILE, so the next write may replace it."""
    out_dir = Path(out_dir).absolute()
    check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    trash: Path | None = None
    try:
        for rel, text in files.items():
            path = tmp / rel
            if rel.endswith("/"):
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        tmp.chmod(0o755)
        if out_dir.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            trash.rmdir()
            os.rename(out_dir, trash)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if trash is not None and trash.exists() and not out_dir.exists():
            os.rename(trash, out_dir)
        raise
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def write_templates(directory: Path | None = None) -> None:
    """Regenerate backend/templates/<model>/config.pbtxt (upstream-style `${key}` templates)."""
    directory = Path(directory) if directory else Path(__file__).parent / "templates"
    for name, text in render_templates().items():
        (directory / name).mkdir(parents=True, exist_ok=True)
        (directory / name / "config.pbtxt").write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """`python -m backend.repository --write-templates` or `OUT --backend cpu --params params.json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path)
    parser.add_argument("--backend", choices=BACKENDS, default="cpu")
    parser.add_argument("--params", type=Path, help="JSON object of fill keys")
    parser.add_argument("--write-templates", action="store_true")
    args = parser.parse_args(argv)
    if args.write_templates:
        write_templates()
        return
    if args.out_dir is None or args.params is None:
        parser.error("out_dir and --params are required unless --write-templates")
    write_model_repository(args.out_dir, args.backend, json.loads(args.params.read_text()))


__all__ = [
    "BACKENDS",
    "CPU_ENGINE_MODULE",
    "HPC_SERVE_PARAMETERS",
    "KNOWN_PARAMETERS",
    "REPOSITORY_BACKENDS",
    "REQUIRED_PARAMETERS",
    "UPSTREAM_DEFAULTS",
    "Backend",
    "check_replaceable",
    "choices",
    "normalize_parameter",
    "render_repository",
    "required_parameters",
    "shim",
    "validate_parameters",
    "write_model_repository",
    "write_repository_files",
]


if __name__ == "__main__":
    main()
