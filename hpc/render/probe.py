"""The doctor's probe job script (`hpc-serve doctor --probe`, hpc/doctor/probe.py decides what it checks): rendered
with hpc/render/templates/probe.sub.j2 like every job script, its #SBATCH lines from hpc/render/sbatch.py, its
srun flags and container wrapper the serving job's (hpc/render/jobfiles.py), mounting the node-local folder
`local` it unpacks its checks into."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpc.render.jobfiles import srun_and_wrapper, template_environment
from hpc.render.sbatch import probe_options
from hpc.spec import Spec
from launcher.contracts.layout import PROBE_SUB_NAME


def render_probe_script(
    spec: Spec, *, time: str, local: Path, values: Mapping[str, object], templates: Path | None = None
) -> str:
    """The probe job's script: one node and task for `time`; `values`: what the doctor's checks put in it (the
    probe folder, the nonce, the bundle, node.py's arguments and exit codes, the names of the files it writes)."""
    srun, wrapper = srun_and_wrapper(spec, local)
    context = {
        "spec": spec,
        "sbatch_lines": probe_options(spec, time).lines(),
        "srun_args": srun,
        "wrapper": wrapper,
        "local": str(local),
        **values,
    }
    return template_environment(templates).get_template(PROBE_SUB_NAME + ".j2").render(context)
