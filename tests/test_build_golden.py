"""The engine build scripts (`D/build.sub`, hpc/jobs/build_script.py) line for line against tests/golden_builds/<name>/:
every tool's exact command line (convert_checkpoint.py / quantize.py / trtllm-build and their flags), the job's
#SBATCH lines and the container wrapping. Regenerate after an intended change with:
UPDATE_GOLDEN=1 python -m pytest tests/test_build_golden.py"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hpc.jobs.build_plan import plan_build
from hpc.jobs.build_script import render_build_script
from hpc.spec import load_spec
from launcher.contracts.layout import BUILD_SUB_NAME
from tests._golden import check_script, normalise

# beside tests/golden/ (whose folders are one per configs/*.yaml): one folder per case, its spec and its script
GOLDEN = Path(__file__).resolve().parent / "golden_builds"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "spec.yaml").is_file())
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def test_there_are_build_goldens():
    assert {"llama3-70b-tp4pp2", "llama3-8b-awq-apptainer", "tiny-cpu-tp2"} <= set(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_build_script_matches_golden(tmp_path, case, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the apptainer image is named relative to where sbatch runs
    shutil.copy(GOLDEN / case / "spec.yaml", tmp_path / "spec.yaml")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "trtllm.sif").write_text("")
    spec = load_spec(tmp_path / "spec.yaml")
    plan = plan_build(spec)
    raw = render_build_script(spec, plan, tmp_path / "deploy")
    text = normalise(raw, tmp_path, {plan.key: "<KEY>"})  # content-addressed: it hashes the checkpoints' mtimes
    golden = GOLDEN / case / BUILD_SUB_NAME
    if UPDATE:
        golden.write_text(text)
    assert "/tmp/" not in text, "an absolute machine path was not normalised"
    assert text == golden.read_text(), f"golden_builds/{case}/{BUILD_SUB_NAME} differs (UPDATE_GOLDEN=1 to accept)"
    script = tmp_path / BUILD_SUB_NAME
    script.write_text(raw)
    check_script(script)
