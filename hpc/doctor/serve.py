"""`hpc-serve doctor SPEC --serve`: a first acceptance run of a spec on this cluster. It submits the spec at its
smallest shape (one replica, the spec's own tp and pp: what must work; no gateway, no renewal) under a name of
its own (`<name>-doctor`, so no live deployment of the spec's name takes it for one of its replicas), waits for
READY (at most `--serve-timeout`), runs the battery (hpc/doctor/battery.py) against the replica, and then
cancels the job as `hpc-serve cancel` does: that ordered stop is the last check (how long it took; every rank
exit 0 without a signal, and the leader node ended without its launcher's SIGTERM or SIGKILL).

Whatever happens (a failed check, an exception, Ctrl-C, SIGTERM), the job it submitted is cancelled before it
returns: nothing it started is left queued or running. A Ctrl-C while it submits is held until sbatch
answered (so the job is known and can be cancelled); a second one during the cancel gives up the ordered stop
for a plain scancel. The deployment folder is kept (its logs and records), and its path printed.

`--models both` runs it once per llmapi model (hpc-serve's, then the image's model.py) on backend tensorrtllm;
on backend cpu there is only hpc-serve's (the image's model.py needs TensorRT-LLM itself).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpc.doctor.battery import Battery, Replica
from hpc.doctor.report import Check, fail, ok, skip, warn
from hpc.jobs.status import JobStatus, describe_failure
from hpc.scheduler.index import JobRef
from hpc.spec import Spec
from launcher.contracts.llmapi import IMAGE_MODEL, OWN_MODEL
from launcher.contracts.records import RankExitRecord, read_rank_records

#: an ordered stop of a replica with nothing in flight should end within this (a tp 2 stop across two
#: nodes in 10 s or less); longer is a warning, not a failure
STOP_TARGET_S = 10.0
#: the suffix of the doctor's deployment name
NAME_SUFFIX = "-doctor"

Say = Callable[[str], object]


def models_to_run(spec: Spec, choice: str) -> tuple[list[str], list[Check]]:
    """The llmapi models to run the battery on, and a skip row for a model the spec's backend cannot run."""
    own = spec.model.llmapi_model or OWN_MODEL
    wanted = {"spec": [own], "both": [OWN_MODEL, IMAGE_MODEL]}.get(choice, [choice])
    if not spec.backend_strategy.runs_image_model and IMAGE_MODEL in wanted:
        why = "backend cpu has only hpc-serve's model (the image's model.py runs on TensorRT-LLM: backend tensorrtllm)"
        return [OWN_MODEL], [skip("image's model", why)]
    return wanted, []


def smallest(spec: Spec, model: str) -> Spec:
    """The spec as the doctor submits it: one replica of the spec's tp × pp on the spec's ranks per node (whole
    nodes, or one node when a replica is smaller than a node), `model` as its llmapi model, no gateway, no
    renewal, no requeue, and the name `<name>-doctor`."""
    data = spec.model_dump(mode="python")
    world, per_node = spec.world_size_per_replica, spec.tasks_per_node
    nodes, per_node = (world // per_node, per_node) if world >= per_node else (1, world)
    data["slurm"].update(nodes=nodes, ntasks_per_node=per_node)
    data.update(replicas=1, gateway=None, renew=None, requeue=False)
    data["name"] = spec.name[: 64 - len(NAME_SUFFIX)] + NAME_SUFFIX
    data["model"]["llmapi_model"] = model
    # llm_api as the spec gave it: a dump of every field would write the ones not given as null into model.yaml
    # (`kv_cache_config: null`, which TensorRT-LLM's update_llm_args_with_extra_dict cannot take)
    data["llm_api"] = spec.llm_api.arguments() if spec.llm_api is not None else None
    if model == OWN_MODEL:
        data["model"]["model_files_from"] = None
    return Spec.model_validate(data)


def tokenizer_of(spec: Spec) -> tuple[Any, str]:
    """The model's tokenizer (llm_api.tokenizer, else the checkpoint's), or None and why, when it cannot be read
    here (a checkpoint only the compute nodes mount, a hub name)."""
    from backend.models.tokenizer import load_tokenizer

    folder = getattr(spec.llm_api, "tokenizer", None) or spec.model.checkpoint_dir
    try:
        return load_tokenizer(Path(str(folder))), ""
    except Exception as exc:  # noqa: BLE001 - any reason it cannot be read: the count is left out, and why
        return None, f"tokenizer {folder} not readable here: {type(exc).__name__}: {exc}"[:200]


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done (sbatch answered), then raise KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {s: signal.signal(s, lambda signum, _: caught.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if caught:
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a batch system's, a closed session's) ends the run as Ctrl-C does: with the job cancelled."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_serve(spec: Spec, timeout_s: float, models: str = "spec", say: Say = print) -> list[Check]:
    """The battery on each model asked for; every job it submitted is ended when it returns or raises."""
    if not spec.workflow_strategy.chooses_model_py:
        return [skip("serve", f"model.workflow {spec.model.workflow}: --serve checks the llmapi workflow's model only")]
    wanted, checks = models_to_run(spec, models)
    label = len(wanted) > 1
    with sigterm_interrupts():
        for model in wanted:
            checks += serve_once(smallest(spec, model), timeout_s, label=model if label else "", say=say)
    return checks


def serve_once(spec: Spec, timeout_s: float, label: str = "", say: Say = print) -> list[Check]:
    """Submit, wait for READY, run the battery, cancel (the last check); the job is cancelled on any way out."""
    from hpc.jobs.submit import SubmitError, submit

    def named(check: Check) -> Check:
        return Check(f"{label}: {check.name}" if label else check.name, check.status, check.detail, check.fix)

    ref: JobRef | None = None
    checks: list[Check] = []
    stopped = False
    try:
        try:
            with signals_held():
                start = time.monotonic()
                ref = submit(spec, note=lambda line: None)
        except (SubmitError, ValueError) as exc:
            return [named(fail("submit", str(exc), "change what the message names in the spec"))]
        say(f"job {ref.job_id} submitted ({spec.name}: {ref.deploy_dir}); READY within {timeout_s:g} s or cancelled")
        status = _wait_ready(ref, timeout_s, say)
        checks.append(named(ready_verdict(status, time.monotonic() - start, timeout_s, ref.job_id)))
        if status.state == "READY":
            from hpc.serving.auth import read_token

            tokenizer, note = tokenizer_of(spec)
            replica = Replica(status.endpoints[0], read_token(ref.deploy_dir))
            model = spec.model.llmapi_model or OWN_MODEL
            selectable = spec.backend_strategy.runs_image_model
            checks += Battery(replica, model, tokenizer, note, label, image_selectable=selectable).run(say)
            say(f"job {ref.job_id}: the ordered stop (hpc-serve cancel)")
            checks.append(named(ordered_stop(ref, spec.world_size_per_replica)))
        else:
            _cancel(ref, say)
        stopped = True
        say(f"job {ref.job_id} ended; its folder is kept: {ref.deploy_dir}")
        return checks
    finally:
        if ref is not None and not stopped:
            _cancel(ref, say)


def _wait_ready(ref: JobRef, timeout_s: float, say: Say) -> JobStatus:
    from hpc.jobs.track import wait

    return wait(ref, until=("READY",), timeout=timeout_s, on_change=lambda s: say(f"  {s.summary()}"))


def _cancel(ref: JobRef, say: Say) -> None:
    """`hpc-serve cancel`'s ordered stop; a second Ctrl-C (or any error in it) ends the job with plain scancel."""
    from hpc.jobs.executors import executor_of
    from hpc.jobs.track import cancel

    say(f"cancelling job {ref.job_id} (ordered stop; Ctrl-C again: scancel at once)")
    try:
        cancel(ref)
    except BaseException:
        executor_of(ref).cancel(ref, 0, stoppable=False)
        raise


def ready_verdict(status: JobStatus, waited_s: float, timeout_s: float, job_id: str) -> Check:
    if status.state == "READY":
        return ok("ready", f"job {job_id} READY {waited_s:.0f} s after sbatch: {status.endpoints[0].http_url}")
    logs = f"`hpc-serve status {job_id}` and `hpc-serve logs {job_id}` (the job folder is kept)"
    if status.done:
        return fail("ready", f"the job ended {status.summary()}", f"read {logs}")
    return fail(
        "ready",
        f"still {status.summary()} after {timeout_s:g} s; cancelled",
        f"a longer --serve-timeout, or a partition with idle nodes (sinfo); {logs}",
    )


def ordered_stop(ref: JobRef, world: int) -> Check:
    """`hpc-serve cancel` of the job, timed, and how its ranks ended."""
    from hpc.jobs.track import cancel

    asked = time.time()
    status = cancel(ref)
    returned_s = time.time() - asked
    records = read_rank_records(ref.paths)
    signalled = [  # the launcher had to signal a leader node to end it (its rank's record says so)
        f"rank {r.rank}'s leader node: {r.leader_node_signal}" for r in records if r.leader_node_signal is not None
    ]
    return stop_verdict(status, records, world, asked, returned_s, signalled)


def stop_verdict(
    status: JobStatus,
    records: list[RankExitRecord],
    world: int,
    asked_at: float,
    returned_s: float,
    signalled: list[str],
) -> Check:
    """ok: the job ended, every rank wrote its record with exit 0 and no signal, no process was signalled to
    end it, within STOP_TARGET_S; warn: all that, but slower."""
    name = "ordered stop"
    fix = f"read `hpc-serve logs {status.job_id}` (every rank's log is kept in the job folder)"
    if not status.done:
        return fail(name, f"the job is still {status.state} {returned_s:.0f} s after the cancel", fix)
    ended = [r.ended_at for r in records if r.ended_at]
    took = f"{max(ended) - asked_at:.1f} s" if ended else "?"
    found = f"ranks ended {took} after the cancel (cancel returned after {returned_s:.1f} s)"
    bad = [describe_failure(r).splitlines()[0] for r in records if r.failed]
    missing = sorted(set(range(world)) - {r.rank for r in records})
    if bad or missing:
        what = bad + ([f"no exit record from rank {', '.join(map(str, missing))}"] if missing else [])
        return fail(name, f"{found}; " + "; ".join(what), fix)
    if signalled:
        return fail(name, f"{found}; the leader node had to be signalled: {signalled[0]}", fix)
    if ended and max(ended) - asked_at > STOP_TARGET_S:
        return warn(name, f"{found}: every rank exit 0, nothing killed, but over {STOP_TARGET_S:g} s", fix)
    return ok(name, f"{found}; every rank exit 0, nothing killed")
