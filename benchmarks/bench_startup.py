"""Startup overhead of hpc-serve: job start → READY, versus a bare tritonserver started by hand, side by side.

Each round renders a fresh deployment (timed, reported separately: it happens before a job exists), then runs
both, alternating which goes first:

  hpc-serve  t0 = the call of `hpc.jobs.local.submit_local(D, ServingJob)` (local executor) on the rendered D; READY = the moment
             `D/jobs/<id>/endpoints/replica-0.json` exists (polled every 2 ms). Everything hpc-serve puts between
             a job start and a usable endpoint is inside: the detached supervisor, bash, the per-rank script,
             `python -m launcher` (plan, tritonserver resolution, ports, address), tritonserver itself, the
             launcher's readiness polling and the record write.
             With --executor slurm: t0 = when the batch step began, i.e. the creation time of the job's
             `D/logs/<id>.out` (slurmstepd opens it before the .sub runs; the .sub writes nothing to it),
             falling back to `scontrol show job` StartTime (1 s resolution) if the file was written to.
             sbatch → start (queueing, scheduling) is the cluster's, not ours, and is printed on its own.
  bare       the same tritonserver binary, environment and backends directory the launcher would use
             (`launcher.node.server.resolve`, `launcher.node.server_env.child_env`), the same argv (`launcher.node.command.build_argv`:
             same repository, `--disable-auto-complete-config`, python shm prefix, fresh ports), started with
             Popen; t0 = just before Popen; READY = the first 200 from /v2/health/ready (polled every 2 ms) and
             then the same first request hpc-serve's READY includes (one token through the model the
             launcher warms up, launcher/node/warmup.py `choose`), so both sides mean "a token came back".
             On the llmapi workflow (the default; `--workflow engine` for the ensemble) bare is what
             `trtllm-llmapi-launch tritonserver` does by hand: the leader node first (the CPU engine's stand-in of
             `tensorrt_llm.llmapi.mgmn_leader_node`), then tritonserver, joined by their IPC address and key
             (launcher/contracts/llmapi.py), t0 just before the leader node's Popen.

Both are stopped and every process is gone before the next measurement starts. Printed: every round, the
medians, and the ratio median(hpc-serve) / median(bare); for hpc-serve also where its time went
(supervisor up, tritonserver spawned, ready, record visible), from the record's own timestamps.

    python benchmarks/bench_startup.py [--rounds 5] [--executor local|slurm] [--workflow llmapi|engine]
                                       [--checkpoint DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from launcher.contracts.job_index import HOME_ENV  # noqa: E402
from launcher.contracts.llmapi import ENGINE, LLMAPI, WORKFLOWS  # noqa: E402
from launcher.contracts.records import EndpointRecord  # noqa: E402

POLL_S = 0.002


def write_spec(folder: Path, checkpoint: Path, *, partition: str | None = None, workflow: str = LLMAPI) -> Path:
    batch = {"triton_max_batch_size": 8} if workflow == ENGINE else {}  # llmapi's: llm_api.max_batch_size
    spec = {
        "name": "bench-startup",
        "workdir": str(folder / "runs"),
        "slurm": {
            "nodes": 1,
            "ntasks_per_node": 1,
            "time": "00:10:00",
            **({"partition": partition} if partition else {}),
        },
        "model": {"backend": "cpu", "workflow": workflow, "checkpoint_dir": str(checkpoint), "tp_size": 1},
        "triton": {**batch, "ready_timeout_s": 300},
        **({"llm_api": {"max_batch_size": 8}} if workflow == LLMAPI else {}),
    }
    path = folder / "bench-startup.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def wait_gone(text: str, timeout: float = 90) -> None:
    from hpc.jobs.local import processes_mentioning

    deadline = time.monotonic() + timeout
    while processes_mentioning(text):
        if time.monotonic() > deadline:
            for pid, _ in processes_mentioning(text):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        time.sleep(0.1)


def http_started(log: Path) -> float | None:
    """When tritonserver's own log says its HTTP service started (after every model loaded): the earliest a
    readiness probe can succeed. Triton stamps lines in local time without the year."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"^I(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) .*Started HTTPService", text, re.M)
    if not match:
        return None
    mon, day, hh, mm, ss, us = map(int, match.groups())
    return datetime(datetime.now().year, mon, day, hh, mm, ss, us).timestamp()


def poll_file(path: Path, timeout: float, alive=lambda: True) -> float:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(f"{path} did not appear")
        time.sleep(POLL_S)
    return time.time()


# ---------------------------------------------------------------------------------------------------------


def run_hpc_local(deploy_dir: Path) -> dict:
    from hpc.jobs.kinds import ServingJob
    from hpc.jobs.local import cancel_local, submit_local

    t0 = time.time()
    ref = submit_local(deploy_dir, ServingJob)
    t_returned = time.time()
    endpoint = ref.paths.endpoint(0)
    t_ready = poll_file(endpoint, 300, alive=lambda: not list(ref.ranks_dir.glob("*.json")))
    record = EndpointRecord.from_dict(json.loads(endpoint.read_text()))
    local = json.loads(ref.paths.local_state.read_text())
    cancel_local(ref)
    wait_gone(str(deploy_dir))
    http = http_started(ref.rank_log(0, "err"))
    return {
        "total": t_ready - t0,
        "returned": t_returned - t0,
        "supervisor": local["started_at"] - t0,
        "spawned": record.started_at - t0,
        "ready_at": record.ready_at - t0,
        "http_up": (http - record.started_at) if http else float("nan"),
    }


def run_hpc_slurm(deploy_dir: Path) -> dict:
    from hpc.jobs.executors import SlurmExecutor
    from hpc.jobs.kinds import ServingJob
    from hpc.jobs.track import cancel
    from hpc.scheduler import slurm

    t_submit = time.time()
    ref = SlurmExecutor().submit(ServingJob, deploy_dir)
    job_id = ref.job_id
    endpoint = ref.paths.endpoint(0)
    t_ready = poll_file(endpoint, 300, alive=lambda: not list(ref.ranks_dir.glob("*.json")))
    record = EndpointRecord.from_dict(json.loads(endpoint.read_text()))
    out = ref.paths.deployment.sbatch_log("out", job_id)
    if out.exists() and out.stat().st_size == 0:
        t0, how = out.stat().st_mtime, "logs/<id>.out created"
    else:
        stamp = slurm.default.scontrol_jobs([job_id])[job_id]["StartTime"]
        t0, how = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")), "scontrol StartTime"
    cancel(ref)  # returns once the job has ended (or CANCEL_GRACE_S + 60 s passed)
    wait_gone(str(deploy_dir))
    http = http_started(ref.rank_log(0, "err"))
    return {
        "total": t_ready - t0,
        "queued": t0 - t_submit,
        "spawned": record.started_at - t0,
        "ready_at": record.ready_at - t0,
        "t0": how,
        "http_up": (http - record.started_at) if http else float("nan"),
    }


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM `proc`'s process group, SIGKILL what is left of it after 40 s, and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=40)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_bare(deploy_dir: Path, n: int) -> dict:
    from launcher.contracts.llmapi import new_hmac_key, proxy_env, without_mpi
    from launcher.contracts.plan import LaunchPlan
    from launcher.contracts.urls import READY_PATH, http_url, open_direct
    from launcher.node.command import build_argv
    from launcher.node.llmapi import engine_env, leader_node_argv
    from launcher.node.ports import allocate, free_ports
    from launcher.node.server import resolve
    from launcher.node.server_env import child_env
    from launcher.node.warmup import choose, send

    plan = LaunchPlan.read(deploy_dir)
    server = resolve(plan.tritonserver)
    ports = allocate(plan.ports)[0]
    argv = build_argv(
        server.argv0,
        model_repository=plan.model_repository,
        rank=0,
        job_id=f"bare-{n}",
        leader=True,
        ports=ports,
        follower_models=plan.follower_models,
        backend_dir=server.backend_dir,
        server_args=plan.server_args,
    )
    env = child_env(plan, server)
    warmup = choose(Path(plan.model_repository), 60)  # the bare server has no token: nothing to send
    assert warmup is not None, f"{plan.model_repository}: no model to send the first token to"
    url = http_url("127.0.0.1", ports.http, READY_PATH)
    log = open(deploy_dir / "logs" / f"bare-{n}.log", "wb")
    leader = None
    t0 = time.time()
    if plan.workflow == LLMAPI:  # trtllm-llmapi-launch's steps: the leader node, then tritonserver beside it
        proxy = proxy_env(free_ports(1)[0], new_hmac_key())
        leader = subprocess.Popen(
            leader_node_argv(),
            env={**engine_env(plan, env), **proxy},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        env = {**without_mpi(env), **proxy}
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        while True:
            if proc.poll() is not None or (leader is not None and leader.poll() is not None):
                raise RuntimeError(f"bare tritonserver or its leader node exited; see {log.name}")
            try:
                with open_direct(url, timeout=1) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(POLL_S)
        t_ready = time.time()
        send(warmup, ports.http)
        t_token = time.time()
    finally:
        stop_group(proc)
        if leader is not None:  # after tritonserver, as trtllm-llmapi-launch ends it
            stop_group(leader)
        log.close()
        wait_gone(plan.model_repository)
    http = http_started(Path(log.name))
    return {"total": t_token - t0, "ready": t_ready - t0, "http_up": (http - t0) if http else float("nan")}


# ---------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--executor", choices=["local", "slurm"], default="local")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint folder; default: a tiny random GPT-2")
    parser.add_argument("--partition", help="with --executor slurm")
    parser.add_argument("--workflow", choices=WORKFLOWS, default=LLMAPI, help="the deployment's (default: llmapi)")
    parser.add_argument("--workdir", type=Path, help="where deployments go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the deployments")
    args = parser.parse_args()

    from hpc.render.jobfiles import render
    from hpc.spec import load_spec
    from launcher.node.server import resolve

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(HOME_ENV, str(work / "hpc-home"))
    checkpoint = args.checkpoint
    if checkpoint is None:
        from backend.cpu_engine.init_model import create_checkpoint

        checkpoint = Path(create_checkpoint(work / "tiny-gpt2", family="gpt2", size="tiny", seed=0))
    spec = load_spec(write_spec(work, checkpoint, partition=args.partition, workflow=args.workflow))
    server = resolve(None)
    print(
        f"tritonserver: {server.argv0} ({server.source})\nbackends: {server.backend_dir}\n"
        f"checkpoint: {checkpoint}\nexecutor: {args.executor}, {args.workflow} workflow, {args.rounds} rounds, "
        "alternating order\n"
    )

    run_hpc = run_hpc_local if args.executor == "local" else run_hpc_slurm
    # one unmeasured warm-up of each (page cache, python bytecode, the backends cache dir)
    warm = render(spec, work / "runs" / "warmup")
    run_bare(warm.deploy_dir, 0)
    run_hpc(warm.deploy_dir)

    hpc_runs, bare_runs, renders = [], [], []
    header = f"{'round':>5} {'first':>9} {'render s':>9} {'hpc-serve s':>12} {'bare s':>8}"
    print(header)
    for n in range(1, args.rounds + 1):
        t = time.perf_counter()
        rendered = render(spec, work / "runs" / f"round-{n}")
        renders.append(time.perf_counter() - t)
        if n % 2:
            h = run_hpc(rendered.deploy_dir)
            b = run_bare(rendered.deploy_dir, n)
        else:
            b = run_bare(rendered.deploy_dir, n)
            h = run_hpc(rendered.deploy_dir)
        hpc_runs.append(h)
        bare_runs.append(b)
        print(
            f"{n:>5} {'hpc-serve' if n % 2 else 'bare':>9} {renders[-1]:>9.3f} {h['total']:>12.3f} {b['total']:>8.3f}",
            flush=True,
        )

    med = {key: statistics.median(r[key] for r in hpc_runs) for key in hpc_runs[0] if key != "t0"}
    bare = statistics.median(r["total"] for r in bare_runs)
    bare_http = statistics.median(r["http_up"] for r in bare_runs)
    bare_ready = statistics.median(r["ready"] for r in bare_runs)
    print()
    print(f"render (not in hpc-serve's time), median: {statistics.median(renders):.3f} s")
    if args.executor == "slurm":
        print(
            f"sbatch → job start (the scheduler's), median: {med['queued']:.3f} s; job start from: {hpc_runs[0]['t0']}"
        )
    print(
        f"hpc-serve job start → READY, median: {med['total']:.3f} s   raw: "
        + " ".join(f"{r['total']:.3f}" for r in hpc_runs)
    )
    print(
        f"bare tritonserver → ready + first token, median: {bare:.3f} s (ready {bare_ready:.3f} s)   raw: "
        + " ".join(f"{r['total']:.3f}" for r in bare_runs)
    )
    print(f"ratio median(hpc-serve) / median(bare): {med['total'] / bare:.3f}   (target <= 1.15)")
    print("\nhpc-serve, where the time goes (medians, seconds after job start):")
    if args.executor == "local":
        print(f"  supervisor wrote local.json        {med['supervisor']:.3f}")
        print(f"  submit_local returned              {med['returned']:.3f}")
    print(f"  launcher spawned tritonserver      {med['spawned']:.3f}")
    print(f"  warm-up came back (ready_at)       {med['ready_at']:.3f}")
    print(f"  endpoint record seen               {med['total']:.3f}")
    print(f"  tritonserver spawn → token back:   {med['ready_at'] - med['spawned']:.3f} s   (bare: {bare:.3f} s)")
    print(
        f"  tritonserver spawn → its log says 'Started HTTPService': {med['http_up']:.3f} s   (bare: "
        f"{bare_http:.3f} s); the rest is readiness polling, the token check and the warm-up"
    )
    if args.keep:
        print(f"\ndeployments kept in {work / 'runs'}")
    else:
        shutil.rmtree(work / "runs", ignore_errors=True)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
