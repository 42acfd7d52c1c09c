"""`hpc-serve doctor --probe`'s imports of what the llmapi `tensorrt_llm` model imports (hpc/doctor/node.py
`check_imports`), and the table of TensorRT-LLM versions and known defects (launcher/contracts/trtllm_versions.py).

The broken stand-in image: a folder put first on PYTHONPATH with a `tensorrt_llm` package (metadata version 1.2.1)
whose import goes, as 1.2.x's does, through serve/responses_utils.py to an `openai` too old to have
PartReasoningText (NGC 26.03-26.07's defect). node.py runs its imports in child processes, as on a node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.doctor import node
from hpc.doctor.facts import Facts
from hpc.doctor.probe import write_probe
from hpc.doctor.verdicts import (
    IMPORT_IMAGE_MODEL,
    IMPORT_LEADER,
    IMPORT_OWN_MODEL,
    IMPORT_TRTLLM,
    ProbeJob,
    model_import_targets,
    verdicts,
)
from hpc.spec import Spec
from launcher.contracts import trtllm_versions as tv

ROOT = Path(__file__).resolve().parent.parent
NGC_2605 = "nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3"
SYMPTOM = "cannot import name 'PartReasoningText' from 'openai.types.responses.response_content_part_added_event'"


def broken_site(folder: Path, version: str = "1.2.1") -> Path:
    """A site-packages folder with a tensorrt_llm whose import fails as NGC 26.03-26.07's does (its responses
    utilities import PartReasoningText from an openai that lacks it), with its package metadata."""
    files = {
        "tensorrt_llm/__init__.py": "from tensorrt_llm.serve import responses_utils\n",
        "tensorrt_llm/serve/__init__.py": "",
        "tensorrt_llm/serve/responses_utils.py": (
            "from openai.types.responses.response_content_part_added_event import PartReasoningText\n"
        ),
        "tensorrt_llm/llmapi/__init__.py": "",
        "tensorrt_llm/llmapi/mgmn_leader_node.py": 'if __name__ == "__main__":\n    raise SystemExit("main ran")\n',
        "openai/__init__.py": "",
        "openai/types/__init__.py": "",
        "openai/types/responses/__init__.py": "",
        "openai/types/responses/response_content_part_added_event.py": "Part = None\n",
        f"tensorrt_llm-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n",
    }
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def image_model(folder: Path) -> Path:
    """model.py and helpers.py shaped as upstream's newer generation: pb_utils and helpers at import,
    tensorrt_llm in initialize()."""
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(
        "import json\nimport triton_python_backend_utils as pb_utils\nfrom helpers import get_input\n\n"
        "class TritonPythonModel:\n    def initialize(self, args):\n"
        "        from tensorrt_llm import LLM, SamplingParams\n        from tensorrt_llm.llmapi import mgmn_leader_node\n"
    )
    (folder / "helpers.py").write_text("import json\n\n\ndef get_input(request, name):\n    return None\n")
    return folder


def llmapi_spec(tmp_path: Path, image_model_py: bool = True, **container) -> Spec:
    """An llmapi spec on TensorRT-LLM serving the image's model.py (`model_files_from`), or by default
    (`image_model_py` False) hpc-serve's own model."""
    model = {"backend": "tensorrtllm", "workflow": "llmapi", "checkpoint_dir": str(tmp_path)}
    if image_model_py:
        model["model_files_from"] = str(tmp_path / "model")
    data = {"name": "t", "workdir": str(tmp_path / "work"), "model": model, "slurm": {"gpus_per_node": 1}}
    return Spec.model_validate({**data, "container": container or {"type": "none"}})


def test_the_table_of_images_versions_and_defects():
    assert tv.ngc_release(NGC_2605) == "26.05"
    assert tv.ngc_release("nvcr.io#nvidia/tritonserver:26.03-trtllm-python-py3") == "26.03"  # pyxis
    assert tv.ngc_release("/images/tritonserver_25.11-trtllm-python-py3.sif") == "25.11"  # a pulled file
    assert tv.ngc_release("nvcr.io/nvidia/tritonserver:26.05-py3") is None  # no TensorRT-LLM in it
    assert [tv.image_trtllm(f"tritonserver:{r}-trtllm-python-py3") for r in ("25.09", "25.11", "26.02", "26.03")] == [
        "1.0.0",
        "1.0.3",
        "1.1.0",
        "1.2.0",
    ]
    (openai,) = tv.known_defects(None, NGC_2605)  # the image decides
    assert (
        openai.name == "openai-too-old"
        and "PartReasoningText" in openai.symptom
        and "pip install -U openai" in openai.fix
    )
    assert tv.known_defects("1.2.1", "nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3") == ()
    assert tv.known_defects("1.2.1", None) == (openai,)  # no image: by the version, which may carry it
    assert tv.known_defects("1.2.1", "site/triton:fixed") == (openai,)
    assert tv.known_defects("1.1.0", None) == () and tv.known_defects(None, None) == ()
    assert all(tv.ngc_release(f"tritonserver:{r}-trtllm-python-py3") == r for r in tv.NGC_TRTLLM)
    assert tv.version_key("1.0.3.2510") == tv.version_key("1.0.3") and node.WORKFLOW_RELEASES is tv.WORKFLOW_RELEASES


def test_named_imports_of_a_model_file(tmp_path):
    """Every import a file makes at any depth, in order; none that never runs (TYPE_CHECKING) or that is
    optional by design (a try that catches ImportError); relative ones and __future__ left out."""
    source = tmp_path / "m.py"
    source.write_text(
        "from __future__ import annotations\nimport os, json\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import torch\nelse:\n    import numpy\n"
        "try:\n    import ujson\nexcept ImportError:\n    import json as ujson\n"
        "from . import sibling\n\nclass M:\n    def initialize(self):\n        from tensorrt_llm import LLM, SamplingParams\n"
    )
    assert node.named_imports(str(source)) == [
        ("os", ()),
        ("json", ()),
        ("typing", ("TYPE_CHECKING",)),
        ("numpy", ()),
        ("json", ()),
        ("tensorrt_llm", ("LLM", "SamplingParams")),
    ]


@pytest.mark.slow
def test_broken_stand_in_image_fails_every_model_import_with_the_defect_and_its_fix(tmp_path, monkeypatch):
    """The probe's node side on the broken stand-in: the TensorRT-LLM version is read from its metadata, each
    import fails in its own child with the exception's type, message and traceback (the chain to openai), the
    exit code carries the bit, and the verdicts fail each import naming the known defect and `pip install -U
    openai`; the leader node's main never ran."""
    # the broken image's packages, then the rank-side packages the probe's bundle puts beside node.py
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(broken_site(tmp_path / "site")), str(ROOT)]))
    image_model(tmp_path / "model")
    spec = llmapi_spec(tmp_path)
    targets = model_import_targets(spec)
    assert [label for _, label, _ in targets] == [IMPORT_TRTLLM, IMPORT_LEADER, IMPORT_IMAGE_MODEL, IMPORT_OWN_MODEL]
    results = tmp_path / "node.json"
    argv = [str(results), "--workflow", "llmapi", *(a for t in targets for a in ("--model-import", *t))]
    rc = subprocess.run([sys.executable, node.__file__, *argv], capture_output=True, text=True).returncode
    found = json.loads(results.read_text())
    assert rc == node.BITS["imports"], found
    assert found["tensorrt_llm"]["ok"] and found["tensorrt_llm"]["version"] == "1.2.1"
    by_label = {e["label"]: e for e in found["imports"]["imports"]}
    for label in (IMPORT_TRTLLM, IMPORT_LEADER, IMPORT_IMAGE_MODEL):
        entry = by_label[label]
        assert (entry["ok"], entry["type"]) == (False, "ImportError") and SYMPTOM in entry["message"], entry
        assert "responses_utils.py" in " ".join(entry["traceback"]) and "main ran" not in json.dumps(entry)
    job = ProbeJob("5", state="FAILED", exit_code=rc, node="n1", results=found, saw_node_file=True)
    checks = {c.name: c for c in verdicts(spec, job, tmp_path)}
    assert checks["tensorrt_llm"].status == "ok" and "tensorrt_llm 1.2.1" in checks["tensorrt_llm"].detail
    failed = checks[IMPORT_IMAGE_MODEL]
    assert failed.status == "fail" and f"ImportError: {SYMPTOM}" in failed.detail, failed
    assert "known defect of TensorRT-LLM 1.2.1, openai-too-old" in failed.fix and "pip install -U openai" in failed.fix
    assert checks[IMPORT_TRTLLM].status == checks[IMPORT_LEADER].status == "fail"
    # the spec serves the image's model: hpc-serve's own only warns that it would fail too
    assert checks[IMPORT_OWN_MODEL].status == "warn", checks[IMPORT_OWN_MODEL]
    named = {c.name: c for c in verdicts(llmapi_spec(tmp_path, type="pyxis", image=NGC_2605), job, tmp_path)}
    assert named[IMPORT_IMAGE_MODEL].fix.startswith("known defect of NGC 26.05 (TensorRT-LLM 1.2.1), openai-too-old")
    # the default spec serves hpc-serve's model: its import fails, naming the same defect and its fix
    default = llmapi_spec(tmp_path, image_model_py=False)
    targets = model_import_targets(default)
    assert [label for _, label, _ in targets] == [IMPORT_TRTLLM, IMPORT_LEADER, IMPORT_OWN_MODEL]
    argv = [str(results), "--workflow", "llmapi", *(a for t in targets for a in ("--model-import", *t))]
    rc = subprocess.run([sys.executable, node.__file__, *argv], capture_output=True, text=True).returncode
    found = json.loads(results.read_text())
    assert rc == node.BITS["imports"], found
    job = ProbeJob("7", state="FAILED", exit_code=rc, node="n1", results=found, saw_node_file=True)
    own = {c.name: c for c in verdicts(default, job, tmp_path)}[IMPORT_OWN_MODEL]
    assert own.status == "fail" and SYMPTOM in own.detail, own
    assert "known defect of TensorRT-LLM 1.2.1, openai-too-old" in own.fix and "pip install -U openai" in own.fix


@pytest.mark.slow
def test_a_good_image_passes_and_says_the_known_defect_is_not_seen(tmp_path, monkeypatch):
    """The same stand-in with an openai that has PartReasoningText (a derived image): every import passes, and
    the image's known defect is reported as not seen."""
    site = broken_site(tmp_path / "site")
    (site / "openai/types/responses/response_content_part_added_event.py").write_text("PartReasoningText = object\n")
    (site / "tensorrt_llm/__init__.py").write_text(
        "from tensorrt_llm.serve import responses_utils\nLLM = SamplingParams = object\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT)]))  # the image, then the bundle's
    image_model(tmp_path / "model")
    spec = llmapi_spec(tmp_path, type="pyxis", image=NGC_2605)
    targets = [t for t in model_import_targets(spec) if t[1] != IMPORT_OWN_MODEL]  # ours: the rewrite's own tests
    found = {"node": "n1", "tensorrt_llm": {"ok": True, "detail": "", "version": "1.2.1"}}
    found["imports"] = node.check_imports(targets)
    assert found["imports"]["ok"], found
    job = ProbeJob("6", state="COMPLETED", exit_code=0, node="n1", results=found, saw_node_file=True)
    checks = {c.name: c for c in verdicts(spec, job, tmp_path)}
    assert all(checks[label].status == "ok" for _, label, _ in targets)
    assert checks["known defects"].status == "ok"
    assert checks["known defects"].detail.startswith("openai-too-old of NGC 26.05 (TensorRT-LLM 1.2.1): not seen here")


@pytest.mark.slow
def test_a_hanging_or_crashing_import_is_reported_and_the_others_still_are(tmp_path, monkeypatch):
    """Each import in its own child: one that never returns is killed at the bound, one that dies of a signal
    is named by it, and one beside them still imports."""
    (tmp_path / "hangs.py").write_text("import threading\nthreading.Event().wait()\n")
    (tmp_path / "crashes.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    (tmp_path / "fine.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT)]))  # ROOT: the bundle's packages
    targets = [("module", "hangs", "hangs"), ("module", "crashes", "crashes"), ("module", "fine", "fine:VALUE")]
    found = node.check_imports(targets, timeout_s=2.0)
    by_label = {e["label"]: e for e in found["imports"]}
    assert not found["ok"]
    assert (by_label["hangs"]["type"], by_label["hangs"]["message"]) == ("Timeout", "still importing after 2 s; killed")
    assert (by_label["crashes"]["type"], by_label["crashes"]["message"]) == (
        "Crash",
        "the importing process ended by signal 9",
    )
    assert by_label["fine"]["ok"]
    missing = node.check_imports([("module", "name", "fine:NOPE")])["imports"][0]
    assert (missing["type"], missing["message"]) == (
        "ImportError",
        f"cannot import name 'NOPE' from 'fine' ({tmp_path / 'fine.py'})",
    )


def test_probe_script_imports_what_the_llmapi_model_imports(tmp_path):
    """An llmapi spec on TensorRT-LLM: the job runs node.py with the model imports, and has the time for them;
    a tp 2 replica imports the worker node too; the CPU backend imports none of this."""
    spec = llmapi_spec(tmp_path, type="pyxis", image=NGC_2605)
    text = write_probe(spec, Facts(partition="gpu"), tmp_path / "probe", "n0nce").read_text()
    assert "--model-import module 'import leader node' tensorrt_llm.llmapi.mgmn_leader_node" in text
    assert f"--model-import file 'import image model.py' {tmp_path / 'model'}" in text
    assert f"#SBATCH --time={int(120 + node.IMPORT_TIMEOUT_S) // 60:02d}:" in text
    tp2 = Spec.model_validate(
        {
            **spec.model_dump(mode="json", exclude_none=True),
            "model": {**spec.model.model_dump(mode="json", exclude_none=True), "tp_size": 2},
            "slurm": {"gpus_per_node": 2},
        }
    )
    assert "tensorrt_llm.llmapi.mgmn_worker_node" in [t[2] for t in model_import_targets(tp2)]
    cpu = Spec.model_validate(
        {
            "name": "c",
            "workdir": str(tmp_path),
            "model": {"backend": "cpu", "workflow": "llmapi", "checkpoint_dir": "."},
        }
    )
    assert model_import_targets(cpu) == []


@pytest.mark.slow
def test_node_py_with_python_37_still_names_its_version(tmp_path):
    """node.py imports launcher.contracts.trtllm_versions at its top: still importable by an old python, whose
    version is then named (the import checks are skipped, not a traceback)."""
    from tests._pythons import find_python, where_looked
    from tests.test_doctor_python import _unpacked_bundle

    python = find_python(3, 7)
    if python is None:
        pytest.skip(where_looked(3, 7))
    node_py = _unpacked_bundle(tmp_path / "local")
    results = tmp_path / "node.json"
    args = [str(results), "--model-import", "module", "import tensorrt_llm", "tensorrt_llm"]
    proc = subprocess.run([python, "-I", str(node_py), *args], capture_output=True, text=True, timeout=120)
    found = json.loads(results.read_text())
    assert proc.returncode & 32 and not found["python"]["ok"], proc.stderr
    assert found["imports"]["skip"] and "too old" in found["imports"]["detail"]
    assert sys.version_info >= (3, 10)
