"""Every configs/*.yaml validates and renders exactly like tests/golden/<config>/ (machine-specific paths
normalised: the tmp tree → <TMP>, sys.executable → <PYTHON>, the source root → <SRC>, the version → <VERSION>),
and configs/gpt2-medium-portable.yaml against each site profile of configs/sites/ like tests/golden/sites/<site>/.
Regenerate after an intended change with:  UPDATE_GOLDEN=1 python -m pytest tests/test_configs.py"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.render import jobfiles as R
from hpc.spec import load_spec
from tests import _golden
from tests._golden import check_script

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
GOLDEN = Path(__file__).resolve().parent / "golden"
# One spec with nothing of a cluster in it, rendered against each example site profile (docs/site-profiles.md)
SITES = ROOT / "configs" / "sites"
PORTABLE = ROOT / "configs" / "gpt2-medium-portable.yaml"
SITE_GOLDEN = GOLDEN / "sites"
FILES = (R.SUB_NAME, R.SH_NAME, R.LAUNCH_NAME)
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

# What the engines in configs/ were built for (trtllm-build's config.json), by engine folder.
ENGINES = {
    "gpt2-medium/engines/tp4": (4, 1),
}
# The Hugging Face checkpoints the llmapi configs serve, by folder: (attention heads, layers) of their config.json
CHECKPOINTS = {"llama3.1-8b-instruct/hf": (32, 32), "llama3.1-70b-instruct/hf": (64, 80)}


def make_checkpoint(folder: Path, heads: int, layers: int) -> None:
    """What the spec's checkpoint checks read (hpc/spec/checkpoint.py): config.json, a weights file, a tokenizer."""
    folder.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": heads, "num_hidden_layers": layers}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_text("")
    (folder / "tokenizer.json").write_text("{}")


@pytest.fixture()
def site(tmp_path: Path, monkeypatch) -> Path:
    """$HPC_SERVE_MODELS with the engines, tokenizers and image the configs name; $HPC_SERVE_WORKDIR; a tmp $HOME
    (tiny-cpu's checkpoint would go to ~/.cache)."""
    models = tmp_path / "models"
    for engine, (tp, pp) in ENGINES.items():
        (models / engine).mkdir(parents=True)
        (models / engine / "config.json").write_text(
            json.dumps({"pretrained_config": {"mapping": {"tp_size": tp, "pp_size": pp, "world_size": tp * pp}}})
        )
    (models / "gpt2-medium/hf").mkdir(parents=True)
    for folder, (heads, layers) in CHECKPOINTS.items():
        make_checkpoint(models / folder, heads, layers)
    (models / "images").mkdir()
    (models / "images" / "tritonserver-trtllm.sif").write_text("")
    monkeypatch.setenv("HPC_SERVE_MODELS", str(models))
    monkeypatch.setenv("HPC_SERVE_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def normalise(text: str, tmp: Path) -> str:
    return _golden.normalise(text, tmp, {str(R.SOURCE_ROOT): "<SRC>"})


def test_there_are_configs():
    assert {c.stem for c in CONFIGS} >= {
        "tiny-cpu",
        "tiny-cpu-ensemble",
        "gpt2-medium-tp4",
        "llama3-70b-tp8pp2",
        "llama3-8b",
        "llama3-8b-apptainer",
    }


def test_every_example_is_llmapi_but_the_engine_ones():
    """The issue: llmapi is every example's workflow, the engine workflow kept in the examples that say so."""
    workflows = {c.stem: load_spec(c, check_files=False).model.workflow for c in CONFIGS}
    engine = {"tiny-cpu-ensemble", "gpt2-medium-tp4", "gpt2-medium-portable"}
    assert {name for name, flow in workflows.items() if flow == "engine"} == engine
    assert workflows["tiny-cpu"] == "llmapi"


def validate(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`hpc-serve validate CONFIG` in a process of its own, with this checkout and this test's environment."""
    return subprocess.run(
        [sys.executable, "-m", "hpc.cli.main", "validate", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=cwd,
        timeout=60,
    )


def match_golden(deploy_dir: Path, golden: Path, names: tuple[str, ...], tmp: Path) -> None:
    """The rendered `names` equal the golden ones, normalised (UPDATE_GOLDEN=1: write them first)."""
    if UPDATE:
        golden.mkdir(parents=True, exist_ok=True)
        for name in names:
            (golden / name).write_text(normalise((deploy_dir / name).read_text(), tmp))
    for name in names:
        got = normalise((deploy_dir / name).read_text(), tmp)
        assert "/tmp/" not in got and str(ROOT) not in got, "an absolute machine path was not normalised"
        want = (golden / name).read_text()
        where = golden.relative_to(GOLDEN)
        assert got == want, f"{where}/{name} differs from tests/golden (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_config_validates_and_matches_golden(site, config):
    result = validate(config, site)
    assert result.returncode == 0, result.stderr
    spec = load_spec(config)
    out = R.render(spec, site / "deploy" / config.stem)
    match_golden(out.deploy_dir, GOLDEN / config.stem, FILES, site)
    for name in (R.SUB_NAME, R.SH_NAME):
        check_script(out.deploy_dir / name)
    plan = json.loads(out.launch.read_text())
    assert plan["tp_size"] * plan["pp_size"] * plan["replicas"] == spec.slurm.nodes * spec.tasks_per_node


def test_golden_folders_match_the_configs():
    """A config without a golden (or a golden without a config) is a test that silently stopped running."""
    folders = [p for p in GOLDEN.iterdir() if p.is_dir() and p != SITE_GOLDEN]
    assert sorted(p.name for p in folders) == sorted(c.stem for c in CONFIGS)
    for folder in folders:
        assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(SITES.glob("*.yaml")), ids=lambda p: p.stem)
def test_one_spec_on_two_sites_matches_golden(site, monkeypatch, profile):
    """configs/gpt2-medium-portable.yaml names no partition, account, container or MPI: each example site gives
    its own, and the rendered scripts hold them (spec.yaml records the profile)."""
    monkeypatch.setenv("HPC_SERVE_SITE", str(profile))
    result = validate(PORTABLE, site)
    assert result.returncode == 0, result.stderr
    assert f"site profile: {profile} " in result.stdout
    out = R.render(load_spec(PORTABLE), site / "deploy" / profile.stem)
    match_golden(out.deploy_dir, SITE_GOLDEN / profile.stem, (*FILES, "spec.yaml"), site)
    check_script(out.sub)


def test_every_example_site_has_a_golden():
    assert sorted(p.stem for p in SITES.glob("*.yaml")) == ["apptainer", "pyxis"]
    assert sorted(p.name for p in SITE_GOLDEN.iterdir()) == ["apptainer", "pyxis"]


def fresh_machine(tmp: Path) -> dict[str, str]:
    """The environment of a newcomer's first shell: no HPC_SERVE_* variables, an empty $HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_SERVE_")}
    return {**env, "HOME": str(tmp / "home"), "PYTHONPATH": str(ROOT)}


def cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpc.cli.main", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_readme_commands_on_a_fresh_machine(tmp_path, config):
    """docs/deploying.md "Using it": `hpc-serve validate|render CONFIG` and `submit CONFIG --dry-run` with nothing exported. No config
    stops on an unset variable; a GPU config's validate names the engine that is not built yet (and nothing
    else); render and the dry run preview every config and create nothing outside the deployment folder."""
    env = fresh_machine(tmp_path)
    validated = cli(["validate", str(config)], env, tmp_path)
    assert "not set" not in validated.stderr
    if "backend: cpu" in config.read_text() or "backend: sim" in config.read_text():  # nothing to download
        assert validated.returncode == 0, validated.stderr
    else:
        assert validated.returncode == 2
        for line in validated.stderr.splitlines():
            assert f"{tmp_path / 'home' / 'models'}" in line and "does not exist" in line, line
    rendered = cli(["render", str(config), "-o", "deploy"], env, tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    assert "submit with:" in rendered.stdout and (tmp_path / "deploy" / R.SUB_NAME).is_file()
    dry = cli(["submit", str(config), "--dry-run"], env, tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH" in dry.stdout and "not set" not in dry.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy"], "a preview wrote outside its folder"
    plan = json.loads((tmp_path / "deploy" / R.LAUNCH_NAME).read_text())
    assert plan["deployment_dir"] == str(tmp_path / "deploy")
