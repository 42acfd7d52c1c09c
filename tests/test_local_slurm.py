"""The local executor's `srun` and `scancel` (hpc/jobs/local_slurm.py): the command lines the rendered `.sub` sends."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpc.jobs.local_slurm import main, srun_tasks, write_standins


@pytest.mark.parametrize(
    ("argv", "tasks", "command"),
    [
        (
            ["--mpi=pmix", "--kill-on-bad-exit=1", "--nodes=1", "--ntasks=2", "--relative=0", "bash", "x.sh"],
            2,
            ["bash", "x.sh"],
        ),
        (
            ["--overlap", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "bash", "-c", "rm -f a"],
            1,
            ["bash", "-c", "rm -f a"],
        ),
        (
            ["-n", "4", "--nodelist", "node1", "--container-image", "img", "python", "-m", "launcher"],
            4,
            ["python", "-m", "launcher"],
        ),
        (["-n3", "--", "--odd-command"], 3, ["--odd-command"]),
        (["hostname"], 1, ["hostname"]),
    ],
)
def test_srun_reads_the_tasks_and_the_command(argv, tasks, command):
    assert srun_tasks(argv) == (tasks, command)


@pytest.mark.parametrize(("argv", "words"), [(["--ntasks=2"], "no command"), (["--ntasks=two", "x"], "needs a number")])
def test_srun_refuses_what_it_cannot_run(argv, words):
    with pytest.raises(ValueError, match=words):
        srun_tasks(argv)


def test_scancel_plays_only_the_signal_form(capsys):
    assert main(["scancel", "local-abc123"]) == 1
    assert main(["scancel", "--signal=NOPE", "local-abc123"]) == 1
    assert main(["scancel", "--batch", "local-abc123"]) == 1
    assert main(["scancel", "--signal=TERM", "local-none00"]) == 0  # no process of that job: nothing to signal
    assert "only" in capsys.readouterr().err


def test_the_standins_run_this_python(tmp_path):
    folder = write_standins(tmp_path / "bin")
    out = subprocess.run(
        [folder / "srun", "--ntasks=1", sys.executable, "-c", "print('ran')"], capture_output=True, text=True
    )
    assert (out.returncode, out.stdout) == (0, "ran\n")
    assert (folder / "scancel").stat().st_mode & 0o777 == 0o755
