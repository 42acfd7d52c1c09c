"""`srun` and `scancel` as the local executor plays them, so that a local job runs the rendered `.sub` itself.

The `.sub` holds the per-replica plan (start each replica's step, withdraw its endpoint and clean its /dev/shm when it
ends, restart it, stop the job in order); a local job runs that very script with these two stand-ins first on its
PATH, so the local executor and Slurm cannot drift apart. One machine has no placement: `srun` runs its command once
per task (under `mpirun` for more than one, each replica an MPI world of its own as under Slurm), and `scancel
--signal` reaches the job's rank launchers, as Slurm's reaches every process of the job's steps (a signal to
`mpirun` would abort the ranks instead of letting them stop in order).

Usage (the stand-ins in a local job's folder exec it): python -m hpc.jobs.local_slurm srun|scancel ARGS...
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
from pathlib import Path

from launcher.contracts.rank import JOB_ID_ENV

#: srun options that take a value as the next word when not written `--opt=value` (the rest are flags)
_SRUN_VALUED = frozenset(
    "-A -C -D -G -J -N -c -e -i -m -n -o -p -q -t -w -x --account --chdir --constraint --container-image "
    "--container-mounts --container-name --container-workdir --cpu-bind --cpus-per-task --distribution --error "
    "--export --gpu-bind --gpus --gres --input --job-name --mem --mem-per-cpu --mpi --nodelist --nodes --ntasks "
    "--ntasks-per-node --output --partition --qos --relative --reservation --time --exclude".split()
)
#: a local job's stand-ins: what they exec (their folder goes first on the `.sub`'s PATH)
_STANDIN = '#!/bin/bash\n# {what}, as the local executor plays it (hpc/jobs/local_slurm.py)\nexec {python} -m hpc.jobs.local_slurm {what} "$@"\n'
COMMANDS = ("srun", "scancel")


def write_standins(folder: Path) -> Path:
    """Write the stand-ins into `folder` (created); returns it, for the front of the `.sub`'s PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for what in COMMANDS:
        path = folder / what
        path.write_text(_STANDIN.format(what=what, python=shlex.quote(sys.executable)))
        path.chmod(0o755)
    return folder


def srun_tasks(argv: list[str]) -> tuple[int, list[str]]:
    """(tasks, command) of an srun command line: `--ntasks`/`-n` counts the tasks (1 without it); placement and
    resources mean nothing on one machine. Raises ValueError for a command line without a command."""
    tasks, k = 1, 0
    while k < len(argv):
        word = argv[k]
        if word == "--":
            k += 1
            break
        if not word.startswith("-") or word == "-":
            break
        name, has_value, value = word.partition("=")
        if name in ("-n", "--ntasks") or (name.startswith("-n") and not name.startswith("--") and len(name) > 2):
            if name.startswith("-n") and len(name) > 2 and not has_value:
                value = name[2:]
            elif not has_value:
                k += 1
                value = argv[k] if k < len(argv) else ""
            try:
                tasks = int(value)
            except ValueError:
                raise ValueError(f"srun (local): --ntasks needs a number, got {value!r}") from None
        elif name in _SRUN_VALUED and not has_value:
            k += 1
        k += 1
    command = argv[k:]
    if not command:
        raise ValueError("srun (local): no command to run")
    return max(tasks, 1), command


def srun(argv: list[str]) -> int:
    """Replace this process by the step: the command itself for one task, else `mpirun -n TASKS` of it."""
    try:
        tasks, command = srun_tasks(argv)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if tasks == 1:
        os.execvp(command[0], command)
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print(
            f"srun (local): the step needs {tasks} tasks but mpirun is not on PATH (apt-get install openmpi-bin)",
            file=sys.stderr,
        )
        return 2
    os.execv(mpirun, [mpirun, "--oversubscribe", "-n", str(tasks), *command])
    return 2  # not reached


def job_processes(job_id: str) -> list[int]:
    """Pids of every process started for a local job (they all carry HPC_SERVE_JOB_ID in their environment):
    the sweep that makes sure `cancel` leaves no tritonserver or python stub behind."""
    marker = f"{JOB_ID_ENV}={job_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _is_launcher(pid: int) -> bool:
    """Whether `pid` runs a rank's launcher (`python -m launcher DEPLOY_DIR`)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a == b"-m" and b == b"launcher" for a, b in zip(words, words[1:], strict=False))


def scancel(argv: list[str]) -> int:
    """`scancel --signal=SIG JOB...`: SIG to each job's rank launchers (the only form the `.sub` sends)."""
    signame, jobs, k = None, [], 0
    while k < len(argv):
        word = argv[k]
        if word.startswith("--signal="):
            signame = word.split("=", 1)[1]
        elif word in ("-s", "--signal") and k + 1 < len(argv):
            k += 1
            signame = argv[k]
        elif word.startswith("-"):
            print(f"scancel (local): {word} is not played locally (only --signal=SIG JOBID)", file=sys.stderr)
            return 1
        else:
            jobs.append(word)
        k += 1
    if signame is None or not jobs:
        print("scancel (local): only `scancel --signal=SIG JOBID` is played locally", file=sys.stderr)
        return 1
    try:
        signum = signal.Signals[signame if signame.startswith("SIG") else f"SIG{signame}"]
    except KeyError:
        print(f"scancel (local): unknown signal {signame!r}", file=sys.stderr)
        return 1
    for job in jobs:
        for pid in job_processes(job):
            if _is_launcher(pid):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m hpc.jobs.local_slurm {'|'.join(COMMANDS)} ARGS...", file=sys.stderr)
        return 2
    return srun(argv[1:]) if argv[0] == "srun" else scancel(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
