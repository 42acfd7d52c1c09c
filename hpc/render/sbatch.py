"""Every job's sbatch options, and the one function that writes them as `#SBATCH` lines.

The serving job (tensorrt_llm_triton.sub), the gateway job (gateway.sub), the engine build (build.sub), the
doctor's probe job (probe.sub) and doctor's `sbatch --test-only` all ask Slurm through `SbatchOptions`: the
templates print the lines it wrote (`_sbatch.j2`'s `header`), and `--test-only` passes the serving job's options
as arguments, so doctor approves exactly the allocation submit asks for. As submitit's single
`_make_sbatch_string`: one builder, one order, one rule for each value (the serving job's GPUs: `serving_gres`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc.spec import Spec
from hpc.spec.build import build_gpus_per_node
from launcher.contracts.config import STOP_LEAD_S
from launcher.contracts.layout import Deployment

#: the probe job's name in the queue (`hpc-serve doctor --probe`)
PROBE_JOB_NAME = "hpc-serve-doctor"


@dataclass(frozen=True)
class SbatchOptions:
    """One job's sbatch options, in the order the scripts have always had them: its name and output files (and
    the folder it runs in), where it is charged and queued, `layout` (options before --time: nodes, tasks, a
    gateway's cpus), its time limit, then what it asks for: Slurm's warning `signal`, `gres`, the spec's
    resources (cpus per task, memory, exclusive, constraint, reservation), `nodelist`, `requeue`, and last the
    spec's own `sbatch_args` (one option each, checked by the spec)."""

    job_name: str
    output: str
    time: str
    error: str | None = None  # None: stderr goes where `output` goes
    chdir: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    layout: tuple[str, ...] = ()
    signal: str | None = None
    gres: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    exclusive: bool = False
    constraint: str | None = None
    reservation: str | None = None
    nodelist: str | None = None
    requeue: bool = False
    sbatch_args: tuple[str, ...] = ()

    def directives(self) -> list[tuple[str, str | None]]:
        """(flag, value) in order; a value None: a flag alone. Short flags take their value after a space."""
        pairs: list[tuple[str, str | None]] = [("-J", self.job_name), ("-o", self.output)]
        pairs += [("-e", self.error)] if self.error else []
        pairs += [("--chdir", self.chdir)] if self.chdir else []
        for flag, value in (("-A", self.account), ("-p", self.partition), ("--qos", self.qos)):
            pairs += [(flag, value)] if value else []
        pairs += [(option, None) for option in self.layout]
        pairs.append(("--time", self.time))
        asks: tuple[tuple[str, object], ...] = (
            ("--signal", self.signal),
            ("--gres", self.gres),
            ("--cpus-per-task", self.cpus_per_task),
            ("--mem", self.mem),
        )
        pairs += [(flag, str(value)) for flag, value in asks if value]
        pairs += [("--exclusive", None)] if self.exclusive else []
        for flag, value in (("--constraint", self.constraint), ("--reservation", self.reservation)):
            pairs += [(flag, value)] if value else []
        pairs += [("--nodelist", self.nodelist)] if self.nodelist else []
        pairs += [("--requeue", None), ("--open-mode", "append")] if self.requeue else []
        return pairs + [(arg, None) for arg in self.sbatch_args]

    def lines(self) -> list[str]:
        """The script's `#SBATCH` lines: the only place hpc-serve writes one."""
        return [f"#SBATCH {_text(flag, value)}" for flag, value in self.directives()]

    def argv(self, *, files: bool = True) -> list[str]:
        """The same options as sbatch's arguments (`files=False`: without the name, output files and folder,
        which depend on where the script is written, not on the allocation)."""
        placement = ("-J", "-o", "-e", "--chdir")
        argv: list[str] = []
        for flag, value in self.directives():
            if files or flag not in placement:
                argv += [flag, value] if value is not None and not flag.startswith("--") else [_text(flag, value)]
        return argv


def _text(flag: str, value: str | None) -> str:
    if value is None:
        return flag
    return f"{flag}={value}" if flag.startswith("--") else f"{flag} {value}"


def serving_gres(spec: Spec) -> str | None:
    """The serving job's GPUs: the spec's GRES string, else `gpu:<gpus_per_node>`, else none."""
    s = spec.slurm
    return s.gres or (f"gpu:{s.gpus_per_node}" if s.gpus_per_node else None)


def build_gres(spec: Spec) -> str | None:
    """The build job's GPUs: as many as the tools use at once (one per rank, at most a node's)."""
    if not spec.model.backend_strategy.uses_gpus:
        return None
    count = min(spec.model.tp_size * spec.model.pp_size, build_gpus_per_node(spec))
    return f"gpu:{count}"


def _resources(spec: Spec) -> dict[str, Any]:
    """What the spec's `slurm:` asks of every node it runs on, beside the GPUs."""
    s = spec.slurm
    return {
        "cpus_per_task": s.cpus_per_task,
        "mem": s.mem,
        "exclusive": s.exclusive,
        "constraint": s.constraint,
        "reservation": s.reservation,
    }


def serving_options(spec: Spec, deploy_dir: Path) -> SbatchOptions:
    """The serving job's: every node and rank, Slurm's USR1 STOP_LEAD_S before the time limit (its ordered stop,
    DEVELOPERS.md "Stopping"), the spec's resources, and requeue when the spec asks for it."""
    s, dep = spec.slurm, Deployment(deploy_dir)
    return SbatchOptions(
        job_name=spec.name,
        output=str(dep.sbatch_log("out")),
        error=str(dep.sbatch_log("err")),
        account=s.account,
        partition=s.partition,
        qos=s.qos,
        layout=(f"--nodes={s.nodes}", f"--ntasks-per-node={spec.tasks_per_node}"),
        time=s.time,
        signal=f"B:USR1@{STOP_LEAD_S}",
        gres=serving_gres(spec),
        requeue=spec.requeue,
        sbatch_args=tuple(s.sbatch_args),
        **_resources(spec),
    )


def gateway_options(spec: Spec, deploy_dir: Path) -> SbatchOptions:
    """The gateway job's: one task with `gateway.cpus`, charged and queued as the serving job unless `gateway:`
    says otherwise; none of the serving job's resources."""
    g, s, dep = spec.gateway, spec.slurm, Deployment(deploy_dir)
    assert g is not None
    return SbatchOptions(
        job_name=f"{spec.name}-gateway",
        output=str(dep.sbatch_log("out")),
        error=str(dep.sbatch_log("err")),
        account=g.account or s.account,
        partition=g.partition or s.partition,
        qos=g.qos or s.qos,
        layout=("--nodes=1", "--ntasks=1", f"--cpus-per-task={g.cpus}"),
        time=g.time or s.time,
        mem=g.mem,
        nodelist=g.nodelist,
        sbatch_args=tuple(g.sbatch_args),
    )


def build_options(spec: Spec, deploy_dir: Path) -> SbatchOptions:
    """The engine build's: one task on one node of `build.partition`, the GPUs its tools use, the spec's
    resources."""
    b, s, dep = spec.build, spec.slurm, Deployment(deploy_dir)
    assert b is not None
    return SbatchOptions(
        job_name=f"{spec.name}-build",
        output=str(dep.sbatch_log("out")),
        error=str(dep.sbatch_log("err")),
        account=s.account,
        partition=b.partition or s.partition,
        qos=s.qos,
        layout=("--nodes=1", "--ntasks=1"),
        time=b.time or s.time,
        gres=build_gres(spec),
        sbatch_args=tuple(s.sbatch_args),
        **_resources(spec),
    )


def probe_options(spec: Spec, time: str) -> SbatchOptions:
    """The doctor's probe job: the serving job's placement on one node, one task, for a short `time`; its output
    to /dev/null and run from / (a workdir the node lacks must not keep it from starting). No --exclusive and none
    of the spec's own sbatch_args: a probe of a couple of minutes need not wait for a whole node."""
    s = spec.slurm
    return SbatchOptions(
        job_name=PROBE_JOB_NAME,
        output="/dev/null",
        chdir="/",
        account=s.account,
        partition=s.partition,
        qos=s.qos,
        layout=("--nodes=1", "--ntasks=1"),
        time=time,
        gres=serving_gres(spec),
        **{**_resources(spec), "exclusive": False},
    )


def test_only_argv(spec: Spec) -> list[str]:
    """`sbatch --test-only` with the serving job's own options, for a script that does nothing: all but its name
    and files (which depend on the folder it is rendered into, not on the allocation)."""
    options = serving_options(spec, Path(spec.workdir)).argv(files=False)
    return ["sbatch", "--test-only", *options, "--wrap=true"]
