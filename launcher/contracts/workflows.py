"""What the rank side asks of a workflow (launch.json's `workflow`) and of a backend (its `backend`): one record
per name, so that the launcher, the build job and the plan ask the record instead of testing the strings. The
login side's strategies (hpc/spec/workflows.py) carry the same records as `rank`; the backend side's repository
facts are backend/parameters.py REPOSITORY_BACKENDS. A new workflow or backend adds one entry here.
Standard library only, Python 3.10.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.contracts.llmapi import ENGINE, LLMAPI


@dataclass(frozen=True)
class RankWorkflow:
    """A workflow as the ranks run it."""

    name: str
    #: its generation model writes the drain file a stop asks for (launcher/node/stop.py); else (TensorRT-LLM's
    #: backend, the llmapi model) its server's metrics say when it drained
    reports_drain: bool
    #: a replica's ranks run TensorRT-LLM's leader and worker nodes beside tritonserver (launcher/contracts/
    #: llmapi.py), and its `tensorrt_llm` model is hpc-serve's or the image's (model.llmapi_model), whose files
    #: rank 0 copies in when the plan names them
    llmapi_launch: bool
    #: the replica's processes import the `tensorrt_llm` package (the LLM API; the engine workflow's C++ backend
    #: does not): where the backend stands in for TensorRT-LLM, its stand-in goes on PYTHONPATH
    imports_tensorrt_llm: bool


@dataclass(frozen=True)
class RankBackend:
    """A backend as the ranks and the build job run it."""

    name: str
    #: hpc-serve's stand-in package `tensorrt_llm` (STANDIN_ROOT) replaces TensorRT-LLM where a workflow imports it
    standin: bool
    #: the packages whose installed version is the build tool's, for the build record (first found wins)
    tool_packages: tuple[str, ...]


RANK_WORKFLOWS: dict[str, RankWorkflow] = {
    w.name: w
    for w in (
        RankWorkflow(ENGINE, reports_drain=True, llmapi_launch=False, imports_tensorrt_llm=False),
        RankWorkflow(LLMAPI, reports_drain=False, llmapi_launch=True, imports_tensorrt_llm=True),
    )
}
RANK_BACKENDS: dict[str, RankBackend] = {
    b.name: b
    for b in (
        RankBackend("tensorrtllm", standin=False, tool_packages=("tensorrt_llm", "tensorrt-llm")),
        RankBackend("cpu", standin=True, tool_packages=()),
        RankBackend("sim", standin=True, tool_packages=()),
    )
}


def rank_workflow(name: str) -> RankWorkflow:
    """The record of `name`; a plan without a workflow (or an older one) is the engine workflow's."""
    return RANK_WORKFLOWS.get(name, RANK_WORKFLOWS[ENGINE])


def rank_backend(name: str) -> RankBackend | None:
    """The record of `name`, None for a name no backend has (a request written by hand)."""
    return RANK_BACKENDS.get(name)
