"""Hostile strings in every spec field that reaches a script.

For each (field, value): either validation rejects it with a problem naming that field, or it renders and then
* `bash -n` and `shellcheck -S warning` pass on both scripts;
* EXECUTING both scripts, with recording stubs for srun/sbatch/module/apptainer/python3/sudo/nvidia-smi first on
  PATH, creates no `PWNED` file anywhere, and the value arrives intact as ONE argv element (or one environment
  value, one launch.json string, one pbtxt string) where it is passed on.

The stubs record argv NUL-separated (`<call>.argv0`, exact even for arguments containing newlines) and one per line
(`<call>.argv`, for humans), plus their environment (`<call>.env`, NUL-separated).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from hpc.render import jobfiles as R
from hpc.spec import SpecError, load_spec
from launcher.contracts.layout import JobPaths

HOSTILE = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "; touch PWNED",
    "a\ntouch PWNED",
    "'",
    '"',
    "\\",
    "$HOME",
    "&& touch PWNED",
    "| touch PWNED",
]
# What the shell would expand if a value were left unquoted: globs, braces, tilde, comments, history, printf.
SHELLY = ["*", "{a,b}", "~root", "#x", "!x", "%s", "a(b)"]
IDS = {v: f"h{i}" for i, v in enumerate(HOSTILE + SHELLY)}
STUBS = ("srun", "sbatch", "module", "apptainer", "python3", "sudo", "nvidia-smi")
SHELLCHECK = shutil.which("shellcheck")

STUB = """#!/bin/bash
f="$STUB_LOG/call.$$"
printf '%s\\0' "${0##*/}" "$@" > "$f.argv0"
printf '%s\\n' "${0##*/}" "$@" > "$f.argv"
env -0 > "$f.env"
"""


# --------------------------------------------------------------------------------------------- the world
@dataclass
class Call:
    argv: list[str]  # argv[0] is the stub's name
    env: dict[str, str]


@dataclass
class World:
    tmp: Path
    spec_dir: Path
    home: Path
    bin: Path
    log: Path
    cwd: Path
    deploy: Path

    def stub(self, name: str) -> None:
        path = self.bin / name
        path.write_text(STUB)
        path.chmod(0o755)

    def calls(self, name: str | None = None) -> list[Call]:
        out = []
        for f in sorted(self.log.glob("call.*.argv0")):
            argv = f.read_bytes().decode().split("\0")[:-1]
            env_raw = f.with_name(f.name.removesuffix(".argv0") + ".env").read_bytes().decode()
            env = dict(item.split("=", 1) for item in env_raw.split("\0") if "=" in item)
            if name is None or argv[0] == name:
                out.append(Call(argv, env))
        return out

    def run(self, script: Path) -> subprocess.CompletedProcess:
        env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "HOME": str(self.home),
            "SLURM_JOB_ID": "1",
            "STUB_LOG": str(self.log),
            "LANG": "C.UTF-8",
        }
        return subprocess.run(["bash", str(script)], cwd=self.cwd, env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture()
def world(tmp_path: Path, monkeypatch) -> World:
    w = World(
        tmp=tmp_path,
        spec_dir=tmp_path / "spec",
        home=tmp_path / "home",
        bin=tmp_path / "bin",
        log=tmp_path / "calls",
        cwd=tmp_path / "cwd",
        deploy=tmp_path / "deploy",
    )
    for d in (w.spec_dir, w.home, w.bin, w.log, w.cwd):
        d.mkdir()
    for name in STUBS:
        w.stub(name)
    monkeypatch.setenv("HOME", str(w.home))  # `$HOME` / `~` in path fields expand to the tmp home
    monkeypatch.delenv("HPC_SERVE_HOME", raising=False)
    return w


def base_spec(w: World, kind: str = "cpu", container: str = "pyxis") -> dict:
    """A valid spec; with a container so the .sh runs the `python3` stub (container.python), never the launcher."""
    data: dict = {"name": "hostile", "slurm": {"nodes": 1}}
    if kind == "cpu":
        (w.spec_dir / "ckpt").mkdir(exist_ok=True)
        data["model"] = {"backend": "cpu", "workflow": "engine", "checkpoint_dir": "ckpt"}
    else:
        (w.spec_dir / "engine").mkdir(exist_ok=True)
        (w.spec_dir / "tok").mkdir(exist_ok=True)
        data["slurm"]["gpus_per_node"] = 1
        data["model"] = {"backend": "tensorrtllm", "engine_dir": "engine", "tokenizer_dir": "tok"}
    if container == "pyxis":
        data["container"] = {"type": "pyxis", "image": "nvcr.io#nvidia/tritonserver:24.08"}
    elif container == "apptainer":
        data["container"] = {"type": "apptainer", "image": "docker://nvcr.io/nvidia/tritonserver:24.08"}
    return data


def hostile_dir(w: World, value: str) -> str:
    """A folder literally named `value` beside the spec (relative path fields resolve there); `$HOME` expands."""
    (w.spec_dir / value).mkdir(parents=True, exist_ok=True)
    return value


def expanded(w: World, value: str) -> str:
    """What a path field holds after load_spec: `$HOME`/`~` expanded, relative to the spec folder."""
    return str((w.spec_dir / os.path.expanduser(os.path.expandvars(value))).resolve())


# ------------------------------------------------------------------------------------ per-field arrival checks
def srun(w: World) -> list[str]:
    steps = [c.argv for c in w.calls("srun") if "--mpi=pmix" in c.argv]
    assert len(steps) == 1, [c.argv for c in w.calls()]
    return steps[0]


def python_call(w: World) -> Call:
    calls = [c for c in w.calls() if c.argv[1:3] == ["-m", "launcher"]]
    assert len(calls) == 1, [c.argv for c in w.calls()]
    assert calls[0].argv[3:] == [str(w.deploy)]
    return calls[0]


def launch(w: World) -> dict:
    return json.loads((w.deploy / "launch.json").read_text())


def pbtxt(w: World, model: str) -> mc.ModelConfig:
    path = w.deploy / "triton_model_repo" / model / "config.pbtxt"
    return text_format.Parse(path.read_text(encoding="utf-8"), mc.ModelConfig())


def mounts_of(argv: list[str]) -> list[str]:
    if "apptainer" in argv:
        return [argv[i + 1] for i, a in enumerate(argv) if a == "-B"]
    (flag,) = [a for a in argv if a.startswith("--container-mounts=")]
    return flag.removeprefix("--container-mounts=").split(",")


@dataclass
class Field:
    """How to put a value into the spec (`put`) and how to see that it arrived intact (`arrived`)."""

    path: str  # the field path a rejection must name (prefix)
    put: Callable[[World, dict, str], None]
    arrived: Callable[[World, str], None] | None = None
    accept: Callable[[str], bool | None] = lambda v: None  # True: must render, False: must be rejected, None: either
    kind: str = "any"  # the model backend the field needs: "gpu" (tensorrtllm), "cpu" or any
    container: str = "any"  # the container type the field needs, or any
    sub: str = ""  # path fields: the folder under the spec's folder that holds the hostile-named one

    def applies(self, kind: str, container: str) -> bool:
        return self.kind in ("any", kind) and self.container in ("any", container)


def _set(dotted: str, transform: Callable[[str], object] = lambda v: v):
    def put(w: World, data: dict, value: str) -> None:
        *parents, last = dotted.split(".")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = transform(value)

    return put


def _path_field(dotted: str, sub: str = ""):
    def put(w: World, data: dict, value: str) -> None:
        _set(dotted)(w, data, hostile_dir(w, sub + value))

    return put


def _arrives_in_srun(prefix: str):
    def check(w: World, value: str) -> None:
        assert f"{prefix}{value}" in srun(w)

    return check


def _module_arrived(w: World, value: str) -> None:
    loads = [c.argv[1:] for c in w.calls("module")]
    assert loads == [["load", value]]


def _env_value_arrived(w: World, value: str) -> None:
    assert python_call(w).env["HOSTILE_VALUE"] == value


def _image_arrived(w: World, value: str) -> None:
    argv = srun(w)
    image = os.path.expandvars(os.path.expanduser(value))  # container.image expands ~ and $VARS at load time
    if "apptainer" in argv:
        assert argv[-3:] == [image, "bash", f"{w.deploy}/tensorrt_llm_triton.sh"]
    else:
        assert f"--container-image={image}" in argv


def _mount_arrived(w: World, value: str) -> None:
    assert mounts_of(srun(w))[0] == expanded(w, "m/" + value)


def _workdir_arrived(w: World, value: str) -> None:
    argv = srun(w)
    if "apptainer" in argv:
        assert argv[argv.index("--pwd") + 1] == value
    else:
        assert f"--container-workdir={value}" in argv


def _python_arrived(w: World, value: str) -> None:
    (call,) = [c for c in w.calls() if c.argv[0] == value]
    assert call.argv[1:] == ["-m", "launcher", str(w.deploy)]


def _model_path_arrived(param: str, model: str, sub: str = ""):
    def check(w: World, value: str) -> None:
        path = expanded(w, sub + value)
        assert f"{path}:{path}" in mounts_of(srun(w))
        assert pbtxt(w, model).parameters[param].string_value == path

    return check


def _server_arrived(w: World, value: str) -> None:
    assert launch(w)["tritonserver"] == value


def _server_arg_arrived(w: World, value: str) -> None:
    assert launch(w)["server_args"][-1] == f"--hostile={value}"


def _parameter_arrived(w: World, value: str) -> None:
    assert pbtxt(w, "tensorrt_llm").parameters["medusa_choices"].string_value == value


def never(v: str) -> bool | None:
    """Unquotable places (#SBATCH lines, identifiers): every HOSTILE value is rejected; SHELLY ones may pass."""
    return False if v in HOSTILE else None


def one_line(v: str) -> bool:
    return "\n" not in v


def option_value(v: str) -> bool:
    """sbatch/srun options: `--name=value` without spaces, quotes or shell characters."""
    return not set(v) & set(" \t'\"`$\\;&|<>\n")


def mountable(v: str) -> bool:
    """Mounted folders: quoted, so anything but a newline or a ',' (pyxis and apptainer split mount lists)."""
    return "\n" not in v and "," not in v


def sub_mountable(v: str) -> bool | None:
    """Like mountable, for a folder below a sub-folder of the spec's (`t/<value>`, `m/<value>`): `t/$HOME` expands to
    `t//home/...`, which does not exist, and a newline is rejected in mounts but allowed in model folders."""
    if v == "$HOME" or "\n" in v:
        return None
    return mountable(v)


def rejected(v: str) -> bool:
    return False


FIELDS: dict[str, Field] = {
    "name": Field("name", _set("name"), accept=rejected),
    # workdir holds deployment folders, baked into `#SBATCH -o`: only plain paths ($HOME, ~user expand to one)
    "workdir": Field("workdir", _set("workdir"), accept=lambda v: v in ("$HOME", "~root")),
    **{
        f"slurm.{k}": Field(f"slurm.{k}", _set(f"slurm.{k}"), accept=never)
        for k in ("partition", "account", "qos", "constraint", "reservation", "gres", "time", "mem")
    },
    "slurm.sbatch_args": Field(
        "slurm.sbatch_args", _set("slurm.sbatch_args", lambda v: [f"--comment={v}"]), accept=option_value
    ),
    "slurm.sbatch_args(raw)": Field("slurm.sbatch_args", _set("slurm.sbatch_args", lambda v: [v]), accept=rejected),
    "slurm.srun_args": Field(
        "slurm.srun_args",
        _set("slurm.srun_args", lambda v: [f"--comment={v}"]),
        _arrives_in_srun("--comment="),
        accept=option_value,
    ),
    "slurm.srun_args(raw)": Field("slurm.srun_args", _set("slurm.srun_args", lambda v: [v]), accept=rejected),
    "slurm.modules": Field("slurm.modules", _set("slurm.modules", lambda v: [v]), _module_arrived, accept=one_line),
    "slurm.env(key)": Field("slurm.env", _set("slurm.env", lambda v: {v: "x"}), accept=rejected),
    "slurm.env(value)": Field(
        "slurm.env", _set("slurm.env", lambda v: {"HOSTILE_VALUE": v}), _env_value_arrived, accept=one_line
    ),
    **{
        f"container.image[{c}]": Field(
            "container.image", _set("container.image"), _image_arrived, accept=one_line, container=c
        )
        for c in ("pyxis", "apptainer")
    },
    **{
        f"container.mounts[{c}]": Field(
            "container.mounts",
            lambda w, d, v: d["container"].update(mounts=[hostile_dir(w, "m/" + v)]),
            _mount_arrived,
            accept=sub_mountable,
            container=c,
        )
        for c in ("pyxis", "apptainer")
    },
    **{
        f"container.workdir[{c}]": Field(
            "container.workdir", _set("container.workdir"), _workdir_arrived, accept=one_line, container=c
        )
        for c in ("pyxis", "apptainer")
    },
    "container.name": Field("container.name", _set("container.name"), accept=rejected),
    **{
        f"container.python[{c}]": Field(
            "container.python", _set("container.python"), _python_arrived, accept=one_line, container=c
        )
        for c in ("pyxis", "apptainer")
    },
    **{
        f"model.engine_dir[{c}]": Field(
            "model.engine_dir",
            _path_field("model.engine_dir"),
            _model_path_arrived("gpt_model_path", "tensorrt_llm"),
            kind="gpu",
            accept=lambda v: "," not in v,
            container=c,
        )
        for c in ("pyxis", "apptainer")
    },
    "model.tokenizer_dir": Field(
        "model.tokenizer_dir",
        _path_field("model.tokenizer_dir", "t/"),
        _model_path_arrived("tokenizer_dir", "preprocessing", "t/"),
        kind="gpu",
        accept=sub_mountable,
    ),
    "model.checkpoint_dir": Field(
        "model.checkpoint_dir",
        _path_field("model.checkpoint_dir"),
        _model_path_arrived("gpt_model_path", "tensorrt_llm"),
        kind="cpu",
        accept=lambda v: "," not in v,
    ),
    "triton.server": Field("triton.server", _set("triton.server"), _server_arrived, accept=one_line),
    "triton.server_args": Field(
        "triton.server_args",
        _set("triton.server_args", lambda v: [f"--hostile={v}"]),
        _server_arg_arrived,
        accept=one_line,
    ),
    "triton.server_args(raw)": Field("triton.server_args", _set("triton.server_args", lambda v: [v]), accept=rejected),
    "triton.parameters": Field(
        "triton.parameters",
        _set("triton.parameters", lambda v: {"medusa_choices": v}),
        _parameter_arrived,
        accept=one_line,
    ),
}

CASES = [pytest.param(name, value, id=f"{name}-{IDS[value]}") for name in FIELDS for value in HOSTILE + SHELLY]


def check_scripts(w: World) -> None:
    sub, sh = w.deploy / R.SUB_NAME, w.deploy / R.SH_NAME
    for script in (sub, sh):
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    if SHELLCHECK:
        result = subprocess.run(
            [SHELLCHECK, "-S", "warning", "-s", "bash", str(sub), str(sh)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout
    for script in (sub, sh):
        result = w.run(script)
        assert result.returncode == 0, (script.name, result.stderr)
    assert w.calls("sbatch") == []
    job = JobPaths(w.deploy, "1")
    assert job.endpoints_dir.is_dir() and job.ranks_dir.is_dir()
    assert (w.home / ".hpc-serve" / "jobs" / "1").resolve() == job.folder, "the .sub's HPC_SERVE_INDEX= default"


def assert_not_pwned(w: World) -> None:
    pwned = [p for p in w.tmp.rglob("PWNED")] + [p for p in R.SOURCE_ROOT.glob("PWNED")]
    assert pwned == []


def single_field_spec(w: World, field: str, value: str) -> tuple[Path, dict]:
    f = FIELDS[field]
    kind = f.kind if f.kind != "any" else "cpu"
    container = f.container if f.container != "any" else "pyxis"
    data = base_spec(w, kind, container)
    f.put(w, data, value)
    spec_file = w.spec_dir / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    return spec_file, data


@pytest.mark.parametrize("field,value", CASES)
def test_hostile_value_is_rejected_naming_the_field_or_accepted(world, field, value):
    """Validation only (fast): the decided outcome for each field and value; a rejection names that field."""
    f = FIELDS[field]
    spec_file, _ = single_field_spec(world, field, value)
    expected = f.accept(value)
    try:
        spec = load_spec(spec_file)
    except SpecError as exc:
        assert expected is not True, f"{field}={value!r} should be accepted, got:\n{exc}"
        assert exc.problems and all(p.path.startswith(f.path) for p in exc.problems), str(exc)
        return
    assert expected is not False, f"{field}={value!r} should have been rejected"
    assert spec is not None


COMBOS = [("gpu", "pyxis"), ("gpu", "apptainer"), ("cpu", "pyxis"), ("cpu", "apptainer")]


@pytest.mark.slow
@pytest.mark.parametrize("kind,container", COMBOS)
@pytest.mark.parametrize("value", [pytest.param(v, id=IDS[v]) for v in HOSTILE + SHELLY])
def test_hostile_value_renders_safely(world, value, kind, container):
    """Every field that accepts `value` gets it at once (one render per value and backend/container kind); then
    bash -n, shellcheck, executing both scripts with stubs, and each field's arrival check."""
    w = world
    data = base_spec(w, kind, container)
    included = []
    for name, f in FIELDS.items():
        if not f.applies(kind, container):
            continue
        expected = f.accept(value)
        if expected is None:  # either outcome allowed: include it if it loads on its own
            trial = base_spec(w, kind, container)
            f.put(w, trial, value)
            (w.spec_dir / "trial.yaml").write_text(yaml.safe_dump(trial))
            try:
                load_spec(w.spec_dir / "trial.yaml")
                expected = True
            except SpecError:
                pass
        if expected:
            f.put(w, data, value)
            included.append(name)
            if f.path == "container.python" and "/" not in value:
                w.stub(value)  # so `exec <python>` finds a recorder under exactly that name
    spec_file = w.spec_dir / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    spec = load_spec(spec_file)
    R.render(spec, w.deploy)
    check_scripts(w)
    for name in included:
        if FIELDS[name].arrived:
            FIELDS[name].arrived(w, value)
    assert_not_pwned(w)
    if value == "$(touch PWNED)":  # the fields that must carry it do
        assert {"slurm.modules", "slurm.env(value)", "triton.server", "triton.parameters"} <= set(included)


# ---------------------------------------------------------------------------------------------- specifics
def test_workdir_rejects_shell_characters_but_expands_home(world):
    w = world
    for value in HOSTILE:
        data = base_spec(w)
        data["workdir"] = value
        (w.spec_dir / "spec.yaml").write_text(yaml.safe_dump(data))
        if value == "$HOME":
            assert load_spec(w.spec_dir / "spec.yaml").workdir == w.home
            continue
        with pytest.raises(SpecError) as info:
            load_spec(w.spec_dir / "spec.yaml")
        assert [p.path for p in info.value.problems] == ["workdir"], value


def test_model_paths_with_shell_characters_render_quoted(world):
    """Model folders may be named anything (they are quoted in scripts and escaped in pbtxt); checked above per
    value. This pins down that a folder literally named `$(touch PWNED)` is accepted, not silently expanded."""
    w = world
    data = base_spec(w, "gpu")
    data["model"]["engine_dir"] = hostile_dir(w, "$(touch PWNED)")
    (w.spec_dir / "spec.yaml").write_text(yaml.safe_dump(data))
    spec = load_spec(w.spec_dir / "spec.yaml")
    assert spec.model.engine_dir == w.spec_dir / "$(touch PWNED)"
    sub = R.render_scripts(spec, w.deploy)[R.SUB_NAME]
    assert "'--container-mounts=" in sub and "$(touch PWNED)" in sub


@pytest.mark.slow
def test_setup_is_verbatim_but_one_line_per_item(world):
    """`slurm.setup` is the user's own shell, run as written, like the lines of a hand-written sbatch script: the
    spec author already controls the job, so quoting it would only break legitimate `source x && export Y=$Z`
    lines. What validation guarantees is one item = one line, so an item cannot smuggle in a second line that
    looks like a separate, reviewed entry (or an #SBATCH directive)."""
    w = world
    data = base_spec(w)
    data["slurm"]["setup"] = ["echo ok", "a\ntouch PWNED"]
    (w.spec_dir / "spec.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        load_spec(w.spec_dir / "spec.yaml")
    assert [p.path for p in info.value.problems] == ["slurm.setup"]
    assert "single line" in info.value.problems[0].message
    # and verbatim really means verbatim: the shell runs it (here, harmlessly, in the tmp cwd)
    data["slurm"]["setup"] = ['export FROM_SETUP="$HOME/x"', "touch SETUP_RAN"]
    (w.spec_dir / "spec.yaml").write_text(yaml.safe_dump(data))
    R.render(load_spec(w.spec_dir / "spec.yaml"), w.deploy)
    assert w.run(w.deploy / R.SUB_NAME).returncode == 0
    assert (w.cwd / "SETUP_RAN").exists()


def test_stubs_really_record(world):
    """The harness can fail: an unquoted value WOULD be caught (guards against a stub that records nothing)."""
    w = world
    script = w.tmp / "bad.sh"
    script.write_text("#!/bin/bash\nmodule load $(touch PWNED)\nsrun --mpi=pmix x\n")
    assert w.run(script).returncode == 0
    assert (w.cwd / "PWNED").exists()
    assert [c.argv for c in w.calls("module")] == [["module", "load"]]
    assert srun(w) == ["srun", "--mpi=pmix", "x"]
