"""The workflow and backend strategies (hpc/spec/workflows.py) and the tables the rank and backend sides read:
one entry per name the spec takes, every question answered by every strategy, and the spec handing out the
strategy of its own strings. A new workflow or backend adds its class; these tests then check it answers all."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest

from backend.parameters import BACKENDS as REPOSITORY_BACKEND_NAMES
from backend.parameters import REPOSITORY_BACKENDS
from hpc.spec import parse_spec
from hpc.spec.workflows import BACKEND_STRATEGIES, WORKFLOW_STRATEGIES, Backend, Workflow
from launcher.contracts.llmapi import BACKENDS, ENGINE, LLMAPI, WORKFLOWS
from launcher.contracts.trtllm_versions import WORKFLOW_RELEASES
from launcher.contracts.workflows import RANK_BACKENDS, RANK_WORKFLOWS, rank_backend, rank_workflow


def test_every_name_the_spec_takes_has_one_entry_in_every_table():
    from hpc.serving.model_io import WORKFLOW_IO

    for table in (WORKFLOW_STRATEGIES, RANK_WORKFLOWS, WORKFLOW_RELEASES, WORKFLOW_IO):
        assert set(table) == set(WORKFLOWS)
    for table in (BACKEND_STRATEGIES, RANK_BACKENDS, REPOSITORY_BACKENDS):
        assert set(table) == set(BACKENDS)
    assert set(REPOSITORY_BACKEND_NAMES) == set(BACKENDS)
    assert all(WORKFLOW_STRATEGIES[name].name == name for name in WORKFLOWS)
    assert all(BACKEND_STRATEGIES[name].name == name for name in BACKENDS)


@pytest.mark.parametrize(
    ("base", "strategies"), [(Workflow, WORKFLOW_STRATEGIES.values()), (Backend, BACKEND_STRATEGIES.values())]
)
def test_every_strategy_answers_every_question(base, strategies):
    """Each class attribute the base declares is set, and no abstract method is left (instantiation says so)."""
    questions = [name for name in inspect.get_annotations(base) if not name.startswith("_")]
    assert questions
    for strategy in strategies:
        missing = [name for name in questions if not hasattr(strategy, name)]
        assert missing == [], f"{type(strategy).__name__} does not answer {missing}"
        assert strategy.rank.name == strategy.name


def _spec(tmp_path: Path, model: str):
    text = "name: s\nslurm:\n  nodes: 1\n  gpus_per_node: 1\nmodel:\n" + textwrap.indent(textwrap.dedent(model), "  ")
    return parse_spec(text, base=tmp_path, check_files=False)


def test_the_spec_hands_out_the_strategies_of_its_strings(tmp_path):
    engine = _spec(tmp_path, "backend: tensorrtllm\nengine_dir: e\ntokenizer_dir: t\n")
    assert engine.workflow_strategy is WORKFLOW_STRATEGIES[ENGINE] is engine.model.workflow_strategy
    assert engine.backend_strategy is BACKEND_STRATEGIES["tensorrtllm"]
    assert engine.model.serves_built_engine and engine.model.source_dir == tmp_path / "e"
    cpu = _spec(tmp_path, "backend: cpu\ncheckpoint_dir: c\n")  # workflow inferred: llmapi
    assert cpu.model.workflow == LLMAPI and cpu.workflow_strategy is WORKFLOW_STRATEGIES[LLMAPI]
    assert not cpu.model.serves_built_engine and cpu.model.source_dir == tmp_path / "c"
    assert cpu.workflow_strategy.model_modules(cpu.backend_strategy) == list(cpu.backend_strategy.llmapi_modules)


def test_the_rank_tables_fall_back_as_old_records_read():
    """A plan without a workflow is the engine workflow's; a build request naming no known backend has no tool."""
    assert rank_workflow("") is RANK_WORKFLOWS[ENGINE]
    assert rank_backend("nonesuch") is None
    from launcher.jobscript.build_record import tool_version

    assert tool_version("cpu") is None and tool_version("") is None
