"""`hpc-serve validate` and hpc/spec/: every problem listed as FILE:LINE: field.path: message, with the line
of the offending key; unknown keys with a did-you-mean; cross-field and file-system checks; path resolution."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpc.spec import Problem, SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------- helpers
def make_engine(path: Path, tp: int = 1, pp: int = 1, layout: str = "pretrained") -> Path:
    """An engine folder whose config.json says how it was built (new or legacy trtllm-build layout)."""
    path.mkdir(parents=True, exist_ok=True)
    if layout == "pretrained":
        config = {"pretrained_config": {"mapping": {"tp_size": tp, "pp_size": pp, "world_size": tp * pp}}}
    elif layout == "legacy":
        config = {"builder_config": {"tensor_parallel": tp, "pipeline_parallel": pp}}
    else:
        config = {"something": "else"}
    (path / "config.json").write_text(json.dumps(config))
    return path


def spec_text(body: str) -> str:
    return textwrap.dedent(body).lstrip("\n")


def write(tmp_path: Path, body: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(spec_text(body))
    return path


def line_of(path_or_text: Path | str, needle: str) -> int:
    """1-based line of the one line containing `needle` (asserted unique, so the test layout is explicit)."""
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def problems(path: Path) -> list[Problem]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value) == "\n".join(str(p) for p in info.value.problems)
    return info.value.problems


def one(path: Path, field: str) -> Problem:
    found = [p for p in problems(path) if p.path == field]
    assert len(found) == 1, [str(p) for p in problems(path)]
    return found[0]


def validate_cli(spec: Path, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hpc.cli.main", "validate", str(spec)],
        capture_output=True,
        text=True,
        cwd=cwd or spec.parent,
        env=full_env,
        timeout=60,
    )


GPU_SPEC = spec_text("""
    name: gpu-two
    slurm:
      partition: gpu
      nodes: 1
      gpus_per_node: 2
    model:
      backend: tensorrtllm
      engine_dir: engine
      tokenizer_dir: tok
      tp_size: 2
    """)

CPU_SPEC = spec_text("""
    name: cpu-one
    slurm:
      nodes: 1
    model:
      backend: cpu
      checkpoint_dir: ckpt
      workflow: engine
    """)


@pytest.fixture()
def gpu_dir(tmp_path: Path) -> Path:
    make_engine(tmp_path / "engine", tp=2)
    (tmp_path / "tok").mkdir()
    return tmp_path


@pytest.fixture()
def cpu_dir(tmp_path: Path) -> Path:
    (tmp_path / "ckpt").mkdir()
    return tmp_path


# --------------------------------------------------------------------------------------------- CLI contract
@pytest.mark.slow
def test_cli_validate_good_spec_exits_0(gpu_dir):
    spec = write(gpu_dir, GPU_SPEC)
    result = validate_cli(spec)
    assert result.returncode == 0, result.stderr
    # where Slurm answers (the test cluster has no `gpu` partition), a note, never a refusal
    assert all(line.startswith("note: on this cluster, slurm.partition") for line in result.stderr.splitlines())
    assert "ok" in result.stdout and "gpu-two" in result.stdout and "2 ranks" in result.stdout


@pytest.mark.slow
def test_cli_validate_lists_every_problem_with_its_line(gpu_dir):
    spec = write(
        gpu_dir,
        """
        name: gpu-two
        replica: 2
        slurm:
          partiton: gpu
          nodes: two
          gpus_per_node: 2
        model:
          backend: tensorrtllm
          engine_dir: engine
          tokenizer_dir: tok
          tp_szie: 2
        triton:
          ports:
            htp: 8000
        """,
    )
    result = validate_cli(spec)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    expected = [
        (line_of(spec, "replica:"), "replica", "unknown key 'replica'; did you mean 'replicas'?"),
        (line_of(spec, "partiton:"), "slurm.partiton", "unknown key 'partiton'; did you mean 'partition'?"),
        (line_of(spec, "nodes: two"), "slurm.nodes", "Input should be a valid integer"),
        (line_of(spec, "tp_szie:"), "model.tp_szie", "unknown key 'tp_szie'; did you mean 'tp_size'?"),
        (line_of(spec, "htp:"), "triton.ports.htp", "unknown key 'htp'; did you mean 'http'?"),
    ]
    assert len(lines) == len(expected), result.stderr
    for line, path, message in expected:
        prefix = f"{spec}:{line}: {path}: {message}"
        assert any(got.startswith(prefix) for got in lines), (prefix, lines)
    for got in lines:
        assert re.match(rf"^{re.escape(str(spec))}:\d+: [\w.]+: .+", got), got


@pytest.mark.slow
def test_cli_validate_filesystem_problems_all_listed(tmp_path):
    spec = write(tmp_path, GPU_SPEC)  # neither engine nor tok exist
    result = validate_cli(spec)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{spec}:{line_of(spec, 'engine_dir:')}: model.engine_dir: {tmp_path / 'engine'}")
    assert "does not exist" in lines[0]
    assert lines[1].startswith(f"{spec}:{line_of(spec, 'tokenizer_dir:')}: model.tokenizer_dir: ")


@pytest.mark.slow
def test_cli_validate_unreadable_and_non_yaml(tmp_path):
    missing = validate_cli(tmp_path / "nope.yaml", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"{tmp_path / 'nope.yaml'}:1: cannot read the spec")
    bad = write(tmp_path, "name: x\nmodel:\n  backend: cpu\n   checkpoint_dir: [\n")
    result = validate_cli(bad)
    assert result.returncode == 2
    assert re.match(rf"^{re.escape(str(bad))}:\d+: not valid YAML", result.stderr)
    scalar = write(tmp_path, "just a string\n", name="scalar.yaml")
    result = validate_cli(scalar)
    assert result.returncode == 2 and "must be a YAML mapping" in result.stderr


@pytest.mark.slow
def test_cli_relative_spec_path_is_reported_as_given(cpu_dir):
    (cpu_dir / "sub").mkdir()
    write(cpu_dir / "sub", CPU_SPEC.replace("checkpoint_dir: ckpt", "checkpoint_dir: ../missing"))
    result = validate_cli(Path("sub/spec.yaml"), cwd=cpu_dir)
    assert result.returncode == 2
    assert result.stderr.startswith("sub/spec.yaml:6: model.checkpoint_dir: ")


# ------------------------------------------------------------------------------------ unknown keys, types
@pytest.mark.parametrize(
    "section,indent_key,wrong,right",
    [
        ("", "", "replica", "replicas"),
        ("slurm", "  ", "gpus_per_nod", "gpus_per_node"),
        ("triton", "  ", "decoupeld", "decoupled"),
        ("model", "  ", "tokenizer_dri", "tokenizer_dir"),
        ("container", "  ", "imgae", "image"),
    ],
)
def test_unknown_key_with_did_you_mean(cpu_dir, section, indent_key, wrong, right):
    text = spec_text(CPU_SPEC)
    if section in ("slurm", "model"):
        text = text.replace(f"{section}:\n", f"{section}:\n{indent_key}{wrong}: 1\n", 1)
    elif section:
        text += f"{section}:\n{indent_key}{wrong}: 1\n"
    else:
        text = f"{wrong}: 1\n" + text
    spec = cpu_dir / "spec.yaml"
    spec.write_text(text)
    path = f"{section}.{wrong}" if section else wrong
    problem = one(spec, path)
    assert problem.line == line_of(spec, f"{wrong}:")
    assert problem.message == f"unknown key {wrong!r}; did you mean {right!r}?"


def test_unknown_key_in_ports_and_init(cpu_dir):
    spec = write(cpu_dir, CPU_SPEC + "  init: {famly: gpt2}\ntriton:\n  ports:\n    grcp: 9000\n")
    found = {p.path: p for p in problems(spec)}
    assert found["triton.ports.grcp"].message == "unknown key 'grcp'; did you mean 'grpc'?"
    assert found["triton.ports.grcp"].line == line_of(spec, "grcp:")
    assert found["model.init.famly"].message == "unknown key 'famly'; did you mean 'family'?"
    assert found["model.init.famly"].line == line_of(spec, "famly")


def test_unknown_key_without_close_match_has_no_suggestion(cpu_dir):
    spec = write(cpu_dir, CPU_SPEC + "  zzzqqq: 1\n")
    assert one(spec, "model.zzzqqq").message == "unknown key 'zzzqqq'"


@pytest.mark.parametrize(
    "snippet,field,words",
    [
        ("  nodes: two", "slurm.nodes", "valid integer"),
        ("  exclusive: maybe", "slurm.exclusive", "valid boolean"),
        ("  nodes: 0", "slurm.nodes", "greater than or equal to 1"),
        ("  sbatch_args: --mail-type=END", "slurm.sbatch_args", "valid list"),
        ("  env: [A, B]", "slurm.env", "valid dictionary"),
    ],
)
def test_wrong_types_in_slurm(cpu_dir, snippet, field, words):
    text = spec_text(CPU_SPEC).replace("  nodes: 1", snippet)
    spec = cpu_dir / "spec.yaml"
    spec.write_text(text)
    problem = one(spec, field)
    assert words in problem.message
    assert problem.line == line_of(spec, snippet.strip())


@pytest.mark.parametrize(
    "tail,field,words,needle",
    [
        ("replicas: [1]\n", "replicas", "valid integer", "replicas:"),
        ("triton: 5\n", "triton", "valid dictionary", "triton:"),
        ("triton:\n  ports:\n    http: 70000\n", "triton.ports.http", "not a TCP port", "http:"),
        ("triton:\n  ports: {http: 8000, grpc: 8000}\n", "triton.ports.grpc", "both port 8000", "ports:"),
        (
            "triton:\n  kv_cache_free_gpu_mem_fraction: 1.5\n",
            "triton.kv_cache_free_gpu_mem_fraction",
            "less than or equal",
            "kv_cache",
        ),
        ("mode: leeder\n", "mode", "'leader' or 'orchestrator'", "mode:"),
        ("container:\n  type: docker\n", "container.type", "'none', 'pyxis' or 'apptainer'", "type: docker"),
        ("container:\n  type: pyxis\n", "container.image", "needs container.image", "container:"),
    ],
)
def test_wrong_types_elsewhere(cpu_dir, tail, field, words, needle):
    spec = write(cpu_dir, CPU_SPEC)
    spec.write_text(spec.read_text() + tail)
    problem = one(spec, field)
    assert words in problem.message
    assert problem.line == line_of(spec, needle)


def test_missing_required_fields(tmp_path):
    spec = write(tmp_path, "slurm:\n  nodes: 1\n")
    found = {p.path: p.message for p in problems(spec)}
    assert found == {"name": "required field is missing", "model": "required field is missing"}


def test_bad_name(cpu_dir):
    spec = write(cpu_dir, CPU_SPEC.replace("name: cpu-one", "name: 'two words'"))
    problem = one(spec, "name")
    assert problem.line == 1 and "not a valid name" in problem.message


# ------------------------------------------------------------------------------------------ cross-field
def test_world_size_must_fit_the_allocation(tmp_path):
    make_engine(tmp_path / "engine", tp=4, pp=2)
    (tmp_path / "tok").mkdir()
    spec = write(
        tmp_path,
        GPU_SPEC.replace("tp_size: 2", "tp_size: 4\n  pp_size: 2").replace("gpus_per_node: 2", "gpus_per_node: 4"),
    )
    problem = one(spec, "model.tp_size")
    assert problem.line == line_of(spec, "tp_size: 4")
    for words in (
        "tp_size 4",
        "pp_size 2",
        "replicas 1",
        "= 8 ranks",
        "slurm.nodes 1",
        "ntasks_per_node 4",
        "= 4 tasks",
    ):
        assert words in problem.message, problem.message
    # the fix the message suggests makes it valid
    spec.write_text(spec.read_text().replace("nodes: 1", "nodes: 2"))
    assert load_spec(spec).world_size == 8


def test_replicas_count_in_the_fit(tmp_path):
    (tmp_path / "ckpt").mkdir()
    spec = write(
        tmp_path, CPU_SPEC.replace("nodes: 1", "nodes: 1\n  ntasks_per_node: 3") + "  tp_size: 2\nreplicas: 2\n"
    )
    problem = one(spec, "model.tp_size")
    assert "replicas 2 = 4 ranks" in problem.message and "= 3 tasks" in problem.message
    spec.write_text(spec.read_text().replace("ntasks_per_node: 3", "ntasks_per_node: 4"))
    assert load_spec(spec).world_size == 4


def test_tensorrtllm_replicas_each_get_a_step(gpu_dir):
    """One srun step per replica (hpc/spec/placement.py) gives each TensorRT-LLM replica its own MPI world."""
    spec = write(gpu_dir, GPU_SPEC.replace("nodes: 1", "nodes: 2") + "replicas: 2\nreplica_policy: keep-serving\n")
    loaded = load_spec(spec)
    assert (loaded.world_size, loaded.replica_policy, loaded.requeue) == (4, "keep-serving", False)


def test_a_replica_must_fill_whole_nodes_or_share_one_evenly(tmp_path):
    (tmp_path / "ckpt").mkdir()
    body = CPU_SPEC.replace("nodes: 1", "nodes: 2\n  ntasks_per_node: 3") + "  tp_size: 2\nreplicas: 3\n"
    problem = one(write(tmp_path, body), "replicas")
    assert "a node runs 3 ranks but a replica has 2" in problem.message and "divide ntasks_per_node" in problem.message
    body = CPU_SPEC.replace("nodes: 1", "nodes: 3\n  ntasks_per_node: 2") + "  tp_size: 3\nreplicas: 2\n"
    problem = one(write(tmp_path, body), "replicas")
    assert "a replica has 3 ranks but a node runs 2" in problem.message


def test_replica_policy_choices(cpu_dir):
    problem = one(write(cpu_dir, CPU_SPEC + "replica_policy: keep-going\n"), "replica_policy")
    assert "'fail-job'" in problem.message and "'keep-serving'" in problem.message


def test_tensorrtllm_needs_one_gpu_per_rank(gpu_dir):
    spec = write(gpu_dir, GPU_SPEC.replace("gpus_per_node: 2\n", "gpus_per_node: 0\n  ntasks_per_node: 2\n"))
    assert "gpus_per_node" in one(spec, "slurm.gpus_per_node").message


def test_orchestrator_on_several_nodes_is_rejected(gpu_dir):
    spec = write(
        gpu_dir,
        GPU_SPEC.replace("nodes: 1", "nodes: 2").replace("gpus_per_node: 2", "gpus_per_node: 1")
        + "mode: orchestrator\n",
    )
    problem = one(spec, "mode")
    assert problem.line == line_of(spec, "mode: orchestrator")
    assert "single node" in problem.message
    single = write(
        gpu_dir,
        GPU_SPEC.replace("gpus_per_node: 2", "gpus_per_node: 2\n  ntasks_per_node: 1") + "mode: orchestrator\n",
        name="single.yaml",
    )
    spec_ok = load_spec(single)
    assert spec_ok.world_size_per_replica == 1 and spec_ok.mode == "orchestrator"


@pytest.mark.parametrize("layout", ["pretrained", "legacy"])
@pytest.mark.parametrize("built,ok", [((2, 1), True), ((4, 1), False), ((2, 2), False), ((1, 1), False)])
def test_engine_config_must_match_tp_pp(tmp_path, layout, built, ok):
    make_engine(tmp_path / "engine", tp=built[0], pp=built[1], layout=layout)
    (tmp_path / "tok").mkdir()
    spec = write(tmp_path, GPU_SPEC)
    if ok:
        assert load_spec(spec).model.tp_size == 2
        return
    problem = one(spec, "model.tp_size")
    assert problem.line == line_of(spec, "tp_size:")
    assert f"built for tp_size {built[0]} × pp_size {built[1]}" in problem.message
    assert "the spec says tp_size 2 × pp_size 1" in problem.message


def test_engine_config_without_parallel_info_is_not_an_error(tmp_path):
    make_engine(tmp_path / "engine", layout="other")
    (tmp_path / "tok").mkdir()
    assert load_spec(write(tmp_path, GPU_SPEC)).model.engine_dir == tmp_path / "engine"


# -------------------------------------------------------------------------------------- paths, files, vars
def test_missing_checkpoint_dir_without_init(tmp_path):
    spec = write(tmp_path, CPU_SPEC)
    problem = one(spec, "model.checkpoint_dir")
    assert problem.line == line_of(spec, "checkpoint_dir:")
    assert f"{tmp_path / 'ckpt'} does not exist" in problem.message and "init" in problem.message
    spec.write_text(spec.read_text() + "  init: {family: gpt2}\n")
    assert load_spec(spec).model.init.family == "gpt2"  # `hpc-serve submit` creates it: not an error now
    assert not (tmp_path / "ckpt").exists()  # and loading (validate) does not create it either


def test_check_files_false_skips_the_filesystem(tmp_path):
    spec = parse_spec(spec_text(GPU_SPEC), base=tmp_path, check_files=False)
    assert spec.model.engine_dir == tmp_path / "engine"


def test_unset_variable_in_a_path_field(cpu_dir, monkeypatch):
    monkeypatch.delenv("HPC_TEST_UNSET_VAR", raising=False)
    spec = write(
        cpu_dir,
        CPU_SPEC.replace("checkpoint_dir: ckpt", "checkpoint_dir: ${HPC_TEST_UNSET_VAR}/ckpt")
        + "workdir: $HPC_TEST_UNSET_VAR/runs\n",
    )
    found = {p.path: p for p in problems(spec)}
    assert set(found) == {"model.checkpoint_dir", "workdir"}
    for field, needle in (("model.checkpoint_dir", "checkpoint_dir:"), ("workdir", "workdir:")):
        assert found[field].line == line_of(spec, needle)
        assert "$HPC_TEST_UNSET_VAR, which is not set" in found[field].message
    monkeypatch.setenv("HPC_TEST_UNSET_VAR", str(cpu_dir))
    loaded = load_spec(spec)
    assert loaded.model.checkpoint_dir == cpu_dir / "ckpt"
    assert loaded.workdir == cpu_dir / "runs"


@pytest.mark.slow
def test_unset_variable_message_names_the_variable_and_the_fix(cpu_dir, monkeypatch):
    monkeypatch.delenv("HPC_TEST_UNSET_VAR", raising=False)
    spec = write(cpu_dir, CPU_SPEC + "workdir: ${HPC_TEST_UNSET_VAR}/runs\n")
    result = validate_cli(spec)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"{spec}:{line_of(spec, 'workdir:')}: workdir: uses $HPC_TEST_UNSET_VAR, which is not set; "
        "export HPC_TEST_UNSET_VAR=/some/path, or give it a default in the spec: ${HPC_TEST_UNSET_VAR:-/some/path}"
    )


def test_variable_defaults_shell_style(cpu_dir, monkeypatch):
    """`${VAR:-default}` (what configs/ use so they validate on a fresh machine): the default when VAR is unset
    or empty, VAR's value otherwise; a default may start with `~`."""
    monkeypatch.delenv("HPC_TEST_UNSET_VAR", raising=False)
    monkeypatch.setenv("HOME", str(cpu_dir / "home"))
    (cpu_dir / "home" / "m").mkdir(parents=True)
    spec = write(
        cpu_dir,
        CPU_SPEC.replace("checkpoint_dir: ckpt", "checkpoint_dir: ${HPC_TEST_UNSET_VAR:-~/m}")
        + "workdir: ${HPC_TEST_UNSET_VAR:-.}/runs\n",
    )
    loaded = load_spec(spec)
    assert loaded.model.checkpoint_dir == cpu_dir / "home" / "m" and loaded.workdir == cpu_dir / "runs"
    monkeypatch.setenv("HPC_TEST_UNSET_VAR", "")
    assert load_spec(spec).workdir == cpu_dir / "runs"
    monkeypatch.setenv("HPC_TEST_UNSET_VAR", str(cpu_dir))
    loaded = load_spec(spec)
    assert loaded.model.checkpoint_dir == cpu_dir and loaded.workdir == cpu_dir / "runs"


def test_expand_unit():
    from hpc.envvars import expand

    env = {"A": "/a", "E": ""}
    assert expand("$A/x:${A}/y", env) == ("/a/x:/a/y", [])
    assert expand("${B:-/b}/${E:-/e}/${E}", env) == ("/b//e/", [])
    assert expand("$B/${C}/x", env) == ("$B/${C}/x", ["B", "C"])
    assert expand("${B:-~}/x", env)[0] == os.path.expanduser("~") + "/x"


def test_preview_notes_missing_inputs_but_refuses_conflicts(tmp_path):
    from hpc.spec import preview_spec

    spec = write(tmp_path, GPU_SPEC)  # neither engine nor tok exist
    loaded, notes = preview_spec(spec)
    assert loaded.model.engine_dir == tmp_path / "engine"
    assert [n.path for n in notes] == ["model.engine_dir", "model.tokenizer_dir"]
    assert all("does not exist" in n.message for n in notes)
    make_engine(tmp_path / "engine", tp=4)
    with pytest.raises(SpecError) as info:
        preview_spec(spec)
    assert [p.path for p in info.value.problems] == ["model.tp_size"]  # an engine built for another tp: refused


def test_problems_are_listed_in_file_order(cpu_dir, monkeypatch):
    monkeypatch.delenv("HPC_TEST_UNSET_VAR", raising=False)
    spec = write(cpu_dir, "workdir: $HPC_TEST_UNSET_VAR/runs\n" + CPU_SPEC.replace("ckpt", "$HPC_TEST_UNSET_VAR/c"))
    assert [p.path for p in problems(spec)] == ["workdir", "model.checkpoint_dir"]


def test_relative_paths_resolve_against_the_spec_folder(tmp_path, monkeypatch):
    here = tmp_path / "specs"
    make_engine(here / "models" / "engine", tp=2)
    (here / "models" / "tok").mkdir()
    spec = write(
        here,
        GPU_SPEC.replace("engine_dir: engine", "engine_dir: models/engine").replace(
            "tokenizer_dir: tok", "tokenizer_dir: ./models/../models/tok"
        )
        + "workdir: ../runs\n",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_spec(Path(os.path.relpath(spec, elsewhere)))
    assert loaded.model.engine_dir == here / "models" / "engine"
    assert loaded.model.tokenizer_dir == here / "models" / "tok"
    assert loaded.workdir == tmp_path / "runs"
    # default workdir: runs next to the spec
    assert (
        load_spec(
            write(
                here,
                GPU_SPEC.replace("engine_dir: engine", "engine_dir: models/engine").replace(
                    "tokenizer_dir: tok", "tokenizer_dir: models/tok"
                ),
                "b.yaml",
            )
        ).workdir
        == here / "runs"
    )


def test_tilde_expands_to_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "ckpt").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    spec = write(tmp_path, CPU_SPEC.replace("checkpoint_dir: ckpt", "checkpoint_dir: ~/ckpt") + "workdir: ~/runs\n")
    loaded = load_spec(spec)
    assert loaded.model.checkpoint_dir == home / "ckpt"
    assert loaded.workdir == home / "runs"


def test_workdir_with_shell_characters_is_rejected(cpu_dir):
    spec = write(cpu_dir, CPU_SPEC + "workdir: 'my runs'\n")
    problem = one(spec, "workdir")
    assert problem.line == line_of(spec, "workdir:")
    assert "#SBATCH -o" in problem.message


# ------------------------------------------------------------------------------------- triton.parameters
def test_unknown_triton_parameter_with_did_you_mean(cpu_dir):
    spec = write(cpu_dir, CPU_SPEC + "triton:\n  parameters:\n    enable_chunkd_context: true\n")
    problem = one(spec, "triton.parameters.enable_chunkd_context")
    assert problem.line == line_of(spec, "enable_chunkd_context")
    assert problem.message == (
        "unknown tensorrt_llm parameter 'enable_chunkd_context'; did you mean 'enable_chunked_context'?"
    )


def test_known_triton_parameters_pass(cpu_dir):
    from backend.repository import KNOWN_PARAMETERS

    assert "enable_chunked_context" in KNOWN_PARAMETERS
    spec = write(
        cpu_dir, CPU_SPEC + "triton:\n  parameters:\n    enable_chunked_context: true\n    medusa_choices: '{0, 0}'\n"
    )
    assert load_spec(spec).triton.parameters == {"enable_chunked_context": True, "medusa_choices": "{0, 0}"}


def test_triton_parameter_value_must_be_one_line(cpu_dir):
    spec = write(cpu_dir, CPU_SPEC + 'triton:\n  parameters:\n    medusa_choices: "a\\nb"\n')
    problem = one(spec, "triton.parameters.medusa_choices")
    assert problem.line == line_of(spec, "medusa_choices") and "single line" in problem.message


# ------------------------------------------------------------------------------------- Slurm time and mem
@pytest.mark.parametrize(
    "value,ok",
    [
        ('"30"', True),
        ('"30:00"', True),
        ('"02:00:00"', True),
        ('"1-12"', True),
        ('"1-12:30"', True),
        ('"2-00:00:00"', True),
        ("UNLIMITED", True),
        ('"1h"', False),
        ('"01:00:00:00"', False),
        ('"abc"', False),
        ('"1:2:3 "', False),
        ('"01:00:00\\n"', False),
        ("02:00:00", True),  # unquoted but a string for YAML (leading 0)
        ("2:00:00", False),  # unquoted: YAML 1.1 reads it as the base-60 number 7200
        ("30", False),
    ],
)
def test_slurm_time_format(cpu_dir, value, ok):
    spec = write(cpu_dir, CPU_SPEC.replace("  nodes: 1", f"  nodes: 1\n  time: {value}"))
    if ok:
        load_spec(spec)
        return
    problem = one(spec, "slurm.time")
    assert problem.line == line_of(spec, "time:")
    assert any(words in problem.message for words in ("is not a Slurm time", "quote the time", "single line"))
    if value in ("2:00:00", "30"):
        assert "quote the time" in problem.message


@pytest.mark.parametrize(
    "value,ok,expected",
    [
        ("64G", True, "64G"),
        ("512000M", True, "512000M"),
        ("0", True, "0"),
        ("1024", True, "1024"),
        ('"64GB"', False, None),
        ('"64 G"', False, None),
        ('"-1"', False, None),
        ('"1.5G"', False, None),
        ('"64G\\n"', False, None),
        ("true", False, None),
    ],
)
def test_slurm_mem_format(cpu_dir, value, ok, expected):
    spec = write(cpu_dir, CPU_SPEC.replace("  nodes: 1", f"  nodes: 1\n  mem: {value}"))
    if ok:
        assert load_spec(spec).slurm.mem == expected
        return
    problem = one(spec, "slurm.mem")
    assert problem.line == line_of(spec, "mem:")


def test_problem_format():
    assert str(Problem("a.yaml", 3, "slurm.nodes", "bad")) == "a.yaml:3: slurm.nodes: bad"
    assert str(Problem("a.yaml", 1, "", "bad")) == "a.yaml:1: bad"


def test_relative_mount_source_resolves_against_the_spec_folder(tmp_path, monkeypatch):
    here = tmp_path / "specs"
    (here / "data").mkdir(parents=True)
    (here / "ckpt").mkdir()
    spec = write(here, CPU_SPEC + "container:\n  type: pyxis\n  image: img\n  mounts: [data:/data:ro, data]\n")
    monkeypatch.chdir(tmp_path)  # a cwd where ./data does not exist
    assert load_spec(spec).container.mounts == [f"{here / 'data'}:/data:ro", str(here / "data")]
    (here / "data").rmdir()
    found = [p for p in problems(spec) if p.path.startswith("container.mounts")]
    assert [p.path for p in found] == ["container.mounts.0", "container.mounts.1"]
    assert all(f"mount source {here / 'data'} does not exist" in p.message for p in found)


@pytest.mark.parametrize("container", ["pyxis", "apptainer"])
def test_paths_that_would_split_a_mount_list_are_rejected_with_a_container(tmp_path, container):
    (tmp_path / "a,b").mkdir()
    (tmp_path / "c:d").mkdir()
    body = (
        CPU_SPEC.replace("checkpoint_dir: ckpt", "checkpoint_dir: c:d")
        + f"container:\n  type: {container}\n  image: img\n  mounts: ['a,b']\n"
    )
    spec = write(tmp_path, body)
    found = {p.path: p for p in problems(spec)}
    assert set(found) == {"container.mounts.0", "model.checkpoint_dir"}
    assert "','" in found["container.mounts.0"].message
    assert found["model.checkpoint_dir"].line == line_of(spec, "checkpoint_dir:")
    # without a container nothing is mounted, so such folder names are fine
    spec.write_text(CPU_SPEC.replace("checkpoint_dir: ckpt", "checkpoint_dir: c:d"))
    assert load_spec(spec).model.checkpoint_dir == tmp_path / "c:d"


# ------------------------------------------------------------------------ triton.parameters: one typed table
def test_parameter_types_and_conflicts_are_all_caught_by_validate_with_their_lines(cpu_dir):
    path = write(
        cpu_dir,
        """
        name: p
        model: {backend: cpu, workflow: engine, checkpoint_dir: ckpt}
        triton:
          decoupled: false
          parameters:
            max_beam_width: abc
            decoupled_mode: true
            kv_cache_free_gpu_mem_fraction: 1.5
            engine_dir: /elsewhere
            enable_chunked_context: true
    """,
    )
    found = {p.path: p for p in problems(path)}
    assert set(found) == {
        f"triton.parameters.{k}"
        for k in ("max_beam_width", "decoupled_mode", "kv_cache_free_gpu_mem_fraction", "engine_dir")
    }
    assert "must be an integer, got 'abc'" in found["triton.parameters.max_beam_width"].message
    assert found["triton.parameters.max_beam_width"].line == line_of(path, "max_beam_width")
    assert "set by triton.decoupled" in found["triton.parameters.decoupled_mode"].message
    assert found["triton.parameters.decoupled_mode"].line == line_of(path, "decoupled_mode")
    assert "set by model.engine_dir" in found["triton.parameters.engine_dir"].message


def test_spec_choices_are_the_repository_choices(cpu_dir):
    from backend.repository import choices

    for policy in choices("batch_scheduler_policy"):
        spec = load_spec(
            write(
                cpu_dir,
                f"""
            name: p
            model: {{backend: cpu, workflow: engine, checkpoint_dir: ckpt}}
            triton: {{batch_scheduler_policy: {policy}}}
        """,
            )
        )
        assert spec.triton.batch_scheduler_policy == policy


def test_validate_gives_every_problem_at_once_behind_the_schemas_refusals(tmp_path):
    """A mistyped key, the workflow mismatch its did-you-mean leads to, and a missing checkpoint: one run names
    all three (checked again as the first problems' fixes make the spec), not one round each."""
    spec = write(
        tmp_path,
        """
        name: bad
        slurm:
          partiton: gpu
        model:
          backend: cpu
          checkpoint_dir: missing-checkpoint
        triton:
          parameters:
            enable_chunked_contex: true
        """,
    )
    with pytest.raises(SpecError) as exc:
        load_spec(spec, site=None)
    got = [(p.line, p.path, p.message.split(";")[0]) for p in exc.value.problems]
    assert got == [
        (line_of(spec, "partiton"), "slurm.partiton", "unknown key 'partiton'"),
        (line_of(spec, "checkpoint_dir"), "model.checkpoint_dir", f"{tmp_path / 'missing-checkpoint'} does not exist"),
        (line_of(spec, "parameters"), "triton.parameters", got[2][2]),
        (line_of(spec, "enable_chunked"), "triton.parameters.enable_chunked_contex", got[3][2]),
    ]
    assert "is for model.workflow: engine" in got[2][2] and "unknown tensorrt_llm parameter" in got[3][2]


def test_a_problem_that_may_come_of_a_value_left_out_is_not_said(tmp_path):
    """`nodes: two` is refused and left out for its default (1): the rank count it would then contradict is not
    said, since it may be that default's doing."""
    spec = write(
        tmp_path,
        """
        name: x
        slurm:
          nodes: two
          ntasks_per_node: 2
        model:
          backend: cpu
          checkpoint_dir: ckpt
          init: {family: gpt2}
          tp_size: 4
        """,
    )
    with pytest.raises(SpecError) as exc:
        load_spec(spec, site=None, check_files=False)
    assert [p.path for p in exc.value.problems] == ["slurm.nodes"], exc.value.problems
