"""The docs' console examples run as written and print what the docs show: each `$ command` of a ```console
block that this file lists is run in a fresh folder (the configs copied, an empty $HOME, no site profile), and
its output, with that folder and $HOME written as the docs write them, must be the docs' lines."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: (doc, the first command of the block): the blocks run here; the others need a job or a cluster
BLOCKS = [("docs/deploying.md", "hpc-serve render configs/tiny-cpu.yaml -o deploy")]


def console_block(doc: str, first: str) -> list[tuple[str, list[str]]]:
    """The block starting with `$ first`: [(command, its output lines)]."""
    text = (ROOT / doc).read_text()
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        if block.startswith(f"$ {first}\n"):
            steps: list[tuple[str, list[str]]] = []
            for line in block.splitlines():
                if line.startswith("$ "):
                    steps.append((line[2:], []))
                else:
                    steps[-1][1].append(line)
            return steps
    raise AssertionError(f"{doc} has no console block starting with `$ {first}`")


@pytest.mark.parametrize(("doc", "first"), BLOCKS)
def test_console_examples_print_what_the_docs_show(doc, first, tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    shutil.copytree(ROOT / "configs", work / "configs")
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hpc-serve").write_text(f'#!/bin/sh\nexec {sys.executable} -m hpc.cli.main "$@"\n')
    (bin_dir / "hpc-serve").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_SERVE_")}
    env.update(HOME=str(home), PATH=f"{bin_dir}:{env['PATH']}", PYTHONPATH=str(ROOT), COLUMNS="400")
    for command, expected in console_block(doc, first):
        proc = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, check=False)
        got = (proc.stderr + proc.stdout) if command.startswith("hpc-serve") else proc.stdout
        got = got.replace(f"{work}/", "").replace(f"{work}", ".").replace(str(home), "~")
        assert proc.returncode == 0, f"{command}\n{got}"
        assert sorted(got.splitlines()) == sorted(expected), f"$ {command}\n{got}"
