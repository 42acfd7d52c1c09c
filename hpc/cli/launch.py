"""`hpc-serve launch DIR_OR_SPEC`: the per-rank entry point, also for `srun --mpi=pmix` inside `salloc`.

Given a rendered deployment folder it runs the launcher. Given a spec, every rank of the step needs the same
rendered folder: rank 0 renders it into `<workdir>/<name>-<job>.<step>` and the others wait for its
launch.json (render moves it into place last), so no rank starts from half-written files.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from launcher.contracts.job_index import job_cluster
from launcher.contracts.layout import Deployment, JobPaths, with_source_root

WAIT_FOR_RENDER_S = 300.0


def deployment_for_spec(spec_path: Path) -> Path:
    """Render (rank 0) or wait for (other ranks) the step's deployment folder."""
    from hpc.cli.support import load_spec_or_exit
    from launcher.contracts.rank import detect, step_name

    spec = load_spec_or_exit(str(spec_path))
    deploy_dir = spec.workdir / f"{spec.name}-{step_name()}"
    if detect().rank == 0:  # the launcher's one reader: OMPI_* before a stale SLURM_PROCID
        from hpc.jobs.model_init import ensure_model
        from hpc.render.jobfiles import render
        from hpc.scheduler.index import register

        if spec.build is not None:  # serve what the build: section built; building is a job of its own
            from hpc.jobs.build import prepare

            prepared = prepare(spec)
            if prepared.plan.cached is None:
                raise SystemExit(
                    f"hpc-serve launch: the engine of {spec_path}'s build: section is not built yet "
                    f"({prepared.plan.engine_dir}); build it first: hpc-serve build {spec_path} --wait"
                )
            spec = prepared.served
        ensure_model(spec)  # this step serves the spec, so `model.init` is due now (render does not do it)
        render(spec, deploy_dir)
        job_id = os.environ.get("SLURM_JOB_ID")
        if job_id:
            register(job_id, JobPaths(deploy_dir, job_id).folder, job_cluster())
        return deploy_dir
    deadline = time.monotonic() + WAIT_FOR_RENDER_S
    while not Deployment(deploy_dir).launch.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"hpc-serve launch: rank 0 did not render {deploy_dir} within {WAIT_FOR_RENDER_S}s")
        time.sleep(0.2)
    return deploy_dir


def launch(target: str) -> int:
    path = Path(target).expanduser().resolve()
    deploy_dir = path if path.is_dir() else deployment_for_spec(path)
    os.environ["PYTHONPATH"] = with_source_root(os.environ.get("PYTHONPATH"), Deployment(deploy_dir).runtime_root)
    import launcher

    return launcher.main([str(deploy_dir)])


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1]))
