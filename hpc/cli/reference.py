"""docs/cli.md, written from the parser itself: the command reference cannot drift from the commands.

`python -m hpc.cli.reference > docs/cli.md` rewrites it; tests/test_cli_grammar.py fails while the file differs
(UPDATE_GOLDEN=1 rewrites it there). What TARGET means and the exit codes come from hpc/cli/support.py, the
places the commands read them from.
"""

from __future__ import annotations

import argparse
import functools

from hpc.cli.main import build_parser
from hpc.cli.support import EXIT_CODES, TARGET_HELP, HelpFormatter

#: the help's width in the document: fixed, so the file does not depend on the terminal that wrote it
WIDTH = 100

INTRO = """# The command line

Every command prints `--help` with each argument's meaning and default; this page is that help, written by
`python -m hpc.cli.reference > docs/cli.md` (a test fails while it differs from the code).

## TARGET

Every command that acts on a deployment or a job takes TARGET, read the same way everywhere
(hpc/serving/deployment.py `resolve`): {target}.

- A spec file, a deployment folder and a deployment name mean the deployment: every job of it, its gateway, its
  renewals. `hpc-serve status configs/tiny-cpu.yaml` shows them all.
- A job id or a job folder means that job. Job ids are per Slurm cluster: `1234@twin` names job 1234 of
  cluster `twin`.
- Commands that follow one job (`wait`, `logs`, `generate --replica`) take one TARGET; given a deployment,
  they act on its current job and say which on stderr.
- Commands that look at or stop a deployment's jobs (`status`, `endpoints`, `metrics`, `cancel`, `token`,
  `gateway`) take several TARGETs: job ids of one deployment. `status` with none shows the newest serving job
  (and its gateway).
- `bench` also takes a gateway URL, `http://host:port`.

A flag means one thing on every command that has it: `--timeout S` is how long a command waits for a job
(exit 4 when it runs out, the job goes on); `--seed N` is the sampling seed; `--model NAME` the model the
requests name.

## A tour

```bash
hpc-serve status TARGET         # PENDING (Slurm's reason) → STARTING → READY, or FAILED naming the rank
hpc-serve status tiny-cpu       # a deployment (spec, folder or name): its jobs under way, and its gateway
hpc-serve wait tiny-cpu --timeout 600    # its current job READY: 0; ended: 1; still starting after 600 s: 4
hpc-serve endpoints TARGET --format env  # GATEWAY_URL=… (when one answers), TRITON_HTTP_URL=http://<host>:<port> …
hpc-serve generate TARGET "The capital of France is" --max-tokens 16
hpc-serve generate configs/tiny-cpu.yaml "Once upon a time" --stream --temperature 0.8 --seed 1
hpc-serve generate tiny-cpu --file prompts.txt --concurrency 16    # one JSON line per prompt, in order
hpc-serve metrics tiny-cpu --watch 2     # every replica's figures, summed; live rates
hpc-serve bench tiny-cpu --request-rate 8 --output-dir bench/   # load test: req/s, tokens/s, TTFT, ITL
hpc-serve logs TARGET --rank 1 -f        # a job, or a deployment's current job
hpc-serve cancel 1234                    # ordered stop: drain, release the followers, then scancel
hpc-serve cancel tiny-cpu                # a deployment: every job of it, renewal included
hpc-serve token tiny-cpu                 # the access token (auth: token); nothing, exit 0, on auth: none
hpc-serve list
```

## Exit codes

| code | meaning |
|---|---|
{codes}
"""


def _help(command: argparse.ArgumentParser) -> str:
    """The command's --help at WIDTH columns."""
    kept = command.formatter_class
    command.formatter_class = functools.partial(HelpFormatter, width=WIDTH)
    try:
        return command.format_help().rstrip()
    finally:
        command.formatter_class = kept


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """The parser's one set of commands (what `hpc-serve --help` lists)."""
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub


def render() -> str:
    """The whole page."""
    codes = "\n".join(f"| {code} | {meaning} |" for code, meaning in sorted(EXIT_CODES.items()))
    parts = [INTRO.format(target=TARGET_HELP, codes=codes), "## Commands\n"]
    sub = subcommands(build_parser())
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, command in sub.choices.items():
        command.prog = f"hpc-serve {name}"
        parts.append(f"### `hpc-serve {name}`\n\n{helps.get(name) or ''}\n\n```text\n{_help(command)}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
