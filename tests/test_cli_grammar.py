"""One CLI grammar (docs/decisions.md "One CLI grammar"): TARGET is read the same way by every command that takes one, a
flag means one thing on every command that has it, every argument says what it is and what leaving it out means, and the
exit codes are the table of hpc/cli/support.py, which docs/cli.md lists."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from hpc.cli.main import build_parser, main
from hpc.cli.reference import subcommands
from hpc.cli.support import EXIT_CODES, SEED_HELP, TARGET_HELP, TIMEOUT_HELP, HelpFormatter
from tests.test_track import make_job, scheduler  # noqa: F401 (a fixture)

ROOT = Path(__file__).parents[1]


def _commands() -> dict[str, argparse.ArgumentParser]:
    return dict(subcommands(build_parser()).choices)


def _arguments() -> list[tuple[str, argparse.Action]]:
    return [
        (name, action)
        for name, command in _commands().items()
        for action in command._actions
        if not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS
    ]


def test_every_argument_of_every_command_says_what_it_is():
    silent = [f"{name} {action.option_strings or action.dest}" for name, action in _arguments() if not action.help]
    assert not silent, f"arguments without help: {silent}"


def test_every_default_is_said_in_the_help():
    for name, command in _commands().items():
        assert command.formatter_class is HelpFormatter, name
        text = command.format_help()
        for action in command._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                shown = re.sub(r"\s+", " ", text)
                assert f"default: {action.default}" in shown or "default" in (action.help or ""), (name, action.dest)


def test_target_is_one_positional_with_one_meaning_on_every_command():
    """The commands that take a deployment or a job all call it TARGET and explain it with the same words;
    none has a positional named after a job alone (such as `wait job`)."""
    takers = set()
    for name, action in _arguments():
        if action.option_strings:
            continue
        if action.dest == "target" and name != "launch":
            assert action.metavar == "TARGET" and TARGET_HELP in (action.help or ""), name
            takers.add(name)
        assert action.dest not in ("job", "jobs"), name
    assert takers == {
        "status",
        "wait",
        "endpoints",
        "logs",
        "cancel",
        "generate",
        "gateway",
        "token",
        "bench",
        "metrics",
    }


@pytest.mark.parametrize("flag, words", [("--seed", SEED_HELP), ("--timeout", TIMEOUT_HELP)])
def test_a_flag_means_one_thing_on_every_command(flag, words):
    having = [(name, action) for name, action in _arguments() if flag in action.option_strings]
    assert having, flag
    for name, action in having:
        assert words in (action.help or ""), (name, flag, action.help)


def test_docs_list_every_exit_code_with_its_meaning():
    """docs/cli.md's table is the table of hpc/cli/support.py: a code added there and not documented fails."""
    text = (ROOT / "docs" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", text, re.M))
    assert {int(code): meaning for code, meaning in rows.items()} == EXIT_CODES


@pytest.mark.usefixtures("scheduler")
def test_ctrl_c_during_a_wait_says_the_job_goes_on_and_how_to_stop_it(tmp_path, capsys, monkeypatch):
    """Ctrl-C lands in the wait between two polls: 130, and the words a newcomer needs (it was not cancelled)."""
    import hpc.jobs.track

    ref = make_job(tmp_path)

    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(hpc.jobs.track.time, "sleep", interrupted)
    assert main(["wait", str(ref.job_dir)]) == 130
    said = capsys.readouterr().err
    assert f"job {ref.job_id} is PENDING and goes on" in said
    assert f"hpc-serve cancel {ref.job_id}" in said


@pytest.mark.usefixtures("scheduler")
def test_a_negative_timeout_is_refused_naming_the_flag(tmp_path, capsys):
    ref = make_job(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["wait", str(ref.job_dir), "--timeout", "-1"])
    assert exc.value.code == 2 and "--timeout" in capsys.readouterr().err


@pytest.mark.usefixtures("scheduler")
def test_a_wait_that_runs_out_of_time_exits_4_not_1(tmp_path, capsys):
    """`wait` whose --timeout ends while the job is PENDING: 4 (it goes on), never the 1 of a failed job."""
    ref = make_job(tmp_path)
    assert main(["wait", str(ref.job_dir), "--timeout", "0.1"]) == 4
    assert "gave up waiting after 0.1s; the job is still PENDING" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["generate", "x", "Hi", "--max-tokens", "0"], "argument --max-tokens: '0': a number more than 0"),
        (["generate", "x", "Hi", "--max-tokens", str(2**31)], "at most 2147483647"),
        (["generate", "x", "Hi", "--seed", "-1"], "argument --seed: '-1': a number at least 0"),
        (["generate", "x", "Hi", "--concurrency", "0"], "argument --concurrency"),
        (["generate", "x", "Hi", "--replica", "-1"], "argument --replica"),
        (["logs", "x", "--rank", "-2"], "argument --rank: '-2': a number at least 0"),
        (["bench", "x", "--num-requests", "0"], "argument --num-requests: '0': a number more than 0"),
    ],
)
def test_a_number_out_of_range_is_a_usage_error_naming_the_flag(argv, words, capsys):
    """Refused before anything is sent: the gateway's 400 would name its body's field (`max_tokens`), not the
    flag typed, and a count of 0 would hang or do nothing."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.usefixtures("scheduler")
def test_logs_of_a_rank_the_job_does_not_have_names_the_ranks_it_has(tmp_path, capsys):
    ref = make_job(tmp_path)  # 2 ranks
    assert main(["logs", str(ref.job_dir), "--rank", "2"]) == 3, "not found, as a job that does not exist"
    assert f"--rank 2: job {ref.job_id} has ranks 0 to 1" in capsys.readouterr().err


def test_docs_cli_md_is_the_parsers_own_help():
    """docs/cli.md is written from the parser (python -m hpc.cli.reference); UPDATE_GOLDEN=1 rewrites it."""
    from hpc.cli.reference import render

    path, text = ROOT / "docs" / "cli.md", render()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.read_text() == text, "docs/cli.md differs from the commands: python -m hpc.cli.reference > docs/cli.md"


def test_a_mistyped_flag_gets_a_did_you_mean_from_its_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "some-job", "hi", "--temprature", "0.5"])
    said = capsys.readouterr().err
    assert exc.value.code == 2 and "hpc-serve generate: error:" in said
    assert "--temprature (did you mean --temperature?)" in said


def test_generate_without_a_prompt_says_none_was_given(capsys):
    assert main(["generate", "some-job"]) == 2
    assert "give a PROMPT or --file FILE (one prompt per line); none was given" in capsys.readouterr().err


def test_a_mistyped_deployment_name_gets_a_did_you_mean(tmp_path, monkeypatch, capsys):
    """`status tiny-cpus` when a job of tiny-cpu is in the job index."""
    from launcher.contracts.job_index import link_index
    from launcher.contracts.layout import JobPaths

    monkeypatch.setenv("HPC_SERVE_HOME", str(tmp_path / "home"))
    deploy = tmp_path / "runs" / "tiny-cpu-20261202-101010"
    deploy.mkdir(parents=True)
    (deploy / "spec.yaml").write_text("name: tiny-cpu\n")
    link_index("777", JobPaths(deploy, "777").create().folder)
    with pytest.raises(SystemExit) as exc:
        main(["status", "tiny-cpus"])
    assert exc.value.code == 3
    assert "did you mean 'tiny-cpu'?" in capsys.readouterr().err


def test_generate_says_once_that_random_weights_write_random_text(capsys):
    """The embedded default (model.init) answers `An��� ru ru�`: a note on stderr, so it does not read as a UTF-8
    bug; a trained checkpoint gets none."""
    from hpc.cli.jobs import _say_if_random
    from hpc.serving.deployment import target_of_spec
    from hpc.spec import load_spec

    spec = load_spec(Path(__file__).parent.parent / "configs" / "tiny-cpu.yaml", check_files=False)
    _say_if_random(target_of_spec(spec, spec.workdir))
    assert "serves random weights (model.init): its text is random" in capsys.readouterr().err
    spec.model.init = None
    _say_if_random(target_of_spec(spec, spec.workdir))
    assert capsys.readouterr().err == ""
