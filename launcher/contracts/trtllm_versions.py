"""Facts per TensorRT-LLM version, in one place: which NGC `tritonserver:<yy.mm>-trtllm-python-py3` image carries
which TensorRT-LLM, how versions order, and the known defects of an image or a version with their fix
(`known_defects`). `hpc-serve doctor` names them; `--probe` shows whether they bite on the node.

Standard library only, and importable by Python 3.7: hpc/doctor/node.py imports it on a node before it can tell
that the node's python is too old for the rest of the rank-side code. Sources (upstream files at the commits
read): docs/decisions.md "TensorRT-LLM versions and known defects".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: NGC `tritonserver:<release>-trtllm-python-py3` → the TensorRT-LLM it carries (Triton's release compatibility
#: matrix; 25.11 prints 1.0.3.2510). The llmapi workflow's images: TensorRT-LLM 1.x since 25.09.
NGC_TRTLLM: dict[str, str] = {
    "25.09": "1.0.0",
    "25.10": "1.0.0",
    "25.11": "1.0.3",
    "25.12": "1.1.0",
    "26.01": "1.1.0",
    "26.02": "1.1.0",
    "26.03": "1.2.0",
    "26.04": "1.2.1",
    "26.05": "1.2.1",
    "26.06": "1.2.1",
    "26.07": "1.2.1",
}

#: the modules trtllm-llmapi-launch runs on a replica's rank 0 and on its other ranks (`python3 -m ...`); each
#: keeps its main under `if __name__ == "__main__"` (mgmn_leader_node.py at 1033ea16 and c40f1157), so importing
#: one runs nothing
LEADER_NODE_MODULE = "tensorrt_llm.llmapi.mgmn_leader_node"
WORKER_NODE_MODULE = "tensorrt_llm.llmapi.mgmn_worker_node"

#: an NGC TensorRT-LLM image as a spec names it: `nvcr.io/nvidia/tritonserver:26.05-...` (docker, apptainer's
#: `docker://`), `nvcr.io#nvidia/tritonserver:26.05-...` (pyxis), `tritonserver_26.05-...sif` (a pulled file)
_NGC_IMAGE = re.compile(r"tritonserver[:_](\d\d\.\d\d)-trtllm-python-py3")


@dataclass(frozen=True)
class Defect:
    """A known defect: the NGC releases whose image has it (`images`), the TensorRT-LLM versions it comes with
    (`versions`: how an image of no known release, a derived one or a plain install, is matched), what users
    see (`symptom`), why (`cause`), what to do (`fix`), and the upstream sources it was read from."""

    name: str
    images: tuple[str, ...]
    versions: tuple[str, ...]
    symptom: str
    cause: str
    fix: str
    sources: tuple[str, ...] = ()


KNOWN_DEFECTS: tuple[Defect, ...] = (
    Defect(
        name="openai-too-old",
        images=("26.03", "26.04", "26.05", "26.06", "26.07"),
        versions=("1.2.0", "1.2.1"),
        symptom="ImportError: cannot import name 'PartReasoningText' from "
        "'openai.types.responses.response_content_part_added_event'; the tensorrt_llm model never loads and the "
        "replica never becomes READY",
        cause="the image's openai package (1.107.3) predates PartReasoningText, which tensorrt_llm's "
        "serve/responses_utils.py imports when the model imports tensorrt_llm; TensorRT-LLM requires openai "
        "with no lower bound",
        fix="use an image with a newer openai: a derived image (`FROM <this image>` then `RUN pip install -U "
        "openai`) named in container.image; or `pip install --target=DIR -U openai` into a folder the nodes "
        "mount and put DIR first on PYTHONPATH in slurm.env",
        sources=(
            "NVIDIA/TensorRT-LLM tensorrt_llm/serve/responses_utils.py@02238b67",
            "triton-inference-server/server/docs/getting_started/llm.md@5f756ce4 (26.03 and 26.07, openai 1.107.3)",
            "triton-inference-server/server/docs/introduction/compatibility.md@e1db8a60 (image → TensorRT-LLM)",
        ),
    ),
)


def version_key(version: str) -> tuple[int, ...]:
    """An order for TensorRT-LLM versions: 1.3.0rc20 < 1.3.0 < 1.3.1 (a pre-release before its release); a
    fourth part (25.11's 1.0.3.2510) does not count."""
    head, _, pre = version.partition("rc")
    parts = [int(p) if p.isdigit() else 0 for p in head.split(".")[:3]]
    parts += [0] * (3 - len(parts))
    return (*parts, 0, int(pre)) if pre.isdigit() else (*parts, 1, 0)


#: the first release whose `mgmn_leader_node` takes `--action stop` (click, TensorRT-LLM PR #4727, mid-2025) and
#: whose LLM client's shutdown() leaves the leader node running (RemoteMpiCommSessionClient.shutdown is a no-op):
#: from it on the leader node ends only by that command (or a signal). Before it (0.20 and the 1.0.0rc0 of early
#: 2025) the module takes no arguments (a `--action stop` there would start a second leader node) and the
#: client's shutdown ended it. Sources: docs/compatibility.md "The leader node's end".
STOP_ACTION_SINCE = "1.0.0"


#: the last TensorRT-LLM with the TensorRT-engine path (trtllm-build, the C++ backend, the ensemble), and the
#: first with the LLM API's PyTorch backend that the llmapi model serves
LAST_ENGINE, FIRST_LLMAPI = "1.3.0rc20", "1.0.0"


@dataclass(frozen=True)
class WorkflowReleases:
    """The TensorRT-LLM releases that serve a workflow (`first`, `last`: None is no bound), and how the doctor
    says that a version does (`has`) or does not (`has_not`)."""

    first: str | None
    last: str | None
    has: str
    has_not: str

    def serves(self, version: str) -> bool:
        key = version_key(version)
        return (self.first is None or key >= version_key(self.first)) and (
            self.last is None or key <= version_key(self.last)
        )


#: each workflow's releases, by the spec's `model.workflow` (launcher/contracts/llmapi.py's LLMAPI and ENGINE,
#: spelled out: that module is not Python 3.7-clean; a test keeps the keys equal to its WORKFLOWS)
WORKFLOW_RELEASES: dict[str, WorkflowReleases] = {
    "llmapi": WorkflowReleases(
        FIRST_LLMAPI,
        None,
        f"serves the llmapi workflow (>= {FIRST_LLMAPI})",
        f"predates the llmapi model ({FIRST_LLMAPI})",
    ),
    "engine": WorkflowReleases(
        None,
        LAST_ENGINE,
        f"has the engine workflow (<= {LAST_ENGINE})",
        f"has no engine workflow (gone after {LAST_ENGINE})",
    ),
}


def has_stop_action(version: str) -> bool:
    """`python -m tensorrt_llm.llmapi.mgmn_leader_node --action stop` ends this release's leader node."""
    return version_key(version) >= version_key(STOP_ACTION_SINCE)


def client_shutdown_stops_leader(version: str) -> bool:
    """`LLM.shutdown()` inside tritonserver ends this release's leader node (releases before STOP_ACTION_SINCE)."""
    return not has_stop_action(version)


def ngc_release(image: str | None) -> str | None:
    """The NGC release (`26.05`) of an NGC TensorRT-LLM image name, else None."""
    match = _NGC_IMAGE.search(image or "")
    return match.group(1) if match else None


def image_trtllm(image: str | None) -> str | None:
    """The TensorRT-LLM version an NGC image carries, when the table knows its release."""
    return NGC_TRTLLM.get(ngc_release(image) or "")


def known_defects(version: str | None, image: str | None) -> tuple[Defect, ...]:
    """The known defects of `image` (by its NGC release, when the table knows it: the image decides), else of
    `version` (the installed TensorRT-LLM: an image of no known release may or may not carry the defect, which
    the probe's imports then tell)."""
    release = ngc_release(image)
    if release in NGC_TRTLLM:
        return tuple(d for d in KNOWN_DEFECTS if release in d.images)
    if not version:
        return ()
    key = version_key(version)
    return tuple(d for d in KNOWN_DEFECTS if any(version_key(v) == key for v in d.versions))


def describe(defect: Defect) -> str:
    """One line: the symptom and its cause."""
    return f"{defect.symptom} ({defect.cause})"
