"""The CPU a replica's own serving path spends per streamed token: one local replica of the simulated engine
(llmapi workflow, Llama 3.1 8B on a simulated H200, `model.sim.slowdown` as given), `--concurrency` streams
through Triton's gRPC stream directly (hpc.serving.triton.TritonEngine, the gateway's request; no gateway), always
a request in flight each, for `--seconds`.

Per side: tokens/s of the replica (median of the rounds), CPU microseconds per streamed token of each process of
the replica (tritonserver, the `tensorrt_llm` python stub, the leader node; /proc/<pid>/stat), and tokens per
response (above 1 when the model's sender fell behind and one response carried several tokens).

`--baseline TREE` (a source tree of another commit, e.g. `git archive`) starts a second replica from that tree;
rounds alternate between the two, so a change of the model is read against the code before it in one run.

    python benchmarks/bench_replica_path.py [--concurrency 16] [--max-tokens 256] [--seconds 10] [--rounds 3]
                                            [--slowdown 1] [--baseline TREE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_relay import apply_sets  # noqa: E402
from gateway_procs import CLI, write_spec  # noqa: E402
from gateway_sides import PROMPT  # noqa: E402

from launcher.contracts.job_index import HOME_ENV  # noqa: E402

#: the replica's processes, by what their command line holds (the first match names it)
ROLES = (("leader node", "mgmn_leader_node"), ("stub", "triton_python_backend_stub"), ("tritonserver", "tritonserver"))


def _proc_table() -> dict[int, tuple[int, float, str]]:
    """pid → (parent pid, CPU seconds, command line) of every process now."""
    tick = os.sysconf("SC_CLK_TCK")
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, cmdline)
    return table


def replica_pids(job_dir: Path) -> dict[str, list[int]]:
    """The processes of the replica whose job folder is `job_dir`, by role (ROLES): every process under the rank
    (launcher) whose tritonserver serves the deployment's model repository."""
    table = _proc_table()
    deployment = str(job_dir.parents[1])  # <workdir>/<name>-<time>/jobs/<job>: the model repository is beside
    todo = [table[pid][0] for pid, (_, _, cmd) in table.items() if "tritonserver " in cmd and deployment in cmd]
    seen: set[int] = set()
    while todo:
        here = todo.pop()
        if here not in seen:
            seen.add(here)
            todo += [child for child, (parent, _, _) in table.items() if parent == here]
    roles: dict[str, list[int]] = {role: [] for role, _ in ROLES}
    for pid in seen:
        cmd = table[pid][2]
        for role, mark in ROLES:
            if mark in cmd.split(" ", 1)[0] or (mark == "mgmn_leader_node" and mark in cmd):
                roles[role].append(pid)
                break
    missing = [role for role, pids in roles.items() if not pids]
    assert not missing, f"no {missing} process found under {job_dir}"
    return roles


def cpu_s(pids: list[int]) -> float:
    table = _proc_table()
    return sum(table[p][1] for p in pids if p in table)


@contextlib.contextmanager
def replica(spec: Path, source: Path | None) -> Iterator[tuple[str, Path]]:
    """A READY local job of `spec` (its id and folder), submitted by `source`'s tree (default this one)."""
    env = os.environ | ({"PYTHONPATH": str(source)} if source else {})
    cwd = str(source) if source else None
    proc = subprocess.run(
        [*CLI, "submit", str(spec), "--executor", "local", "--wait", "--timeout", "280"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    if proc.returncode != 0:
        raise SystemExit(f"submit exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    job_id, job_dir = proc.stdout.splitlines()[0].split()[:2]
    try:
        yield job_id, Path(job_dir)
    finally:
        subprocess.run([*CLI, "cancel", job_id], capture_output=True, timeout=120, env=env, cwd=cwd)


class Side:
    """One replica: its endpoint, its processes, and the responses its streams received."""

    def __init__(self, name: str, job_id: str, job_dir: Path) -> None:
        from launcher.contracts.layout import JobPaths
        from launcher.contracts.records import read_endpoints

        self.name, self.job_dir = name, job_dir
        (self.record,) = read_endpoints(JobPaths.of_folder(job_dir))
        token = subprocess.run([*CLI, "token", job_id], capture_output=True, text=True, timeout=60).stdout.strip()
        self.token = token or None
        self.pids = replica_pids(job_dir)
        self.responses = 0


async def one_request(engine: Any, side: Side, max_tokens: int) -> int:
    """One streamed request to `side` to its end: the tokens it generated (ignore_eos: max_tokens)."""
    from hpc.serving.model_io import GenerateParams

    params = GenerateParams(PROMPT, max_tokens, ignore_eos=True)
    how = (side.record.workflow, side.record.decoupled, side.record.llmapi_model)
    async for chunk in engine.stream(side.record.grpc_url, params, side.token, *how):
        side.responses += bool(chunk.text)
    return max_tokens


async def rate(engine: Any, side: Side, streams: int, seconds: float, max_tokens: int) -> dict[str, float]:
    """`streams` requests always in flight for `seconds`: tokens/s, µs of CPU per token of each process role,
    tokens per response."""
    deadline = time.perf_counter() + seconds

    async def client() -> int:
        done = 0
        while time.perf_counter() < deadline:
            done += await one_request(engine, side, max_tokens)
        return done

    before = {role: cpu_s(pids) for role, pids in side.pids.items()}
    responses0, t0 = side.responses, time.perf_counter()
    tokens = sum(await asyncio.gather(*(client() for _ in range(streams))))
    wall = time.perf_counter() - t0
    out = {"rate": tokens / wall, "per_response": tokens / max(side.responses - responses0, 1)}
    for role, pids in side.pids.items():
        out[role] = (cpu_s(pids) - before[role]) / max(tokens, 1) * 1e6
    return out


async def measure(args: argparse.Namespace, sides: list[Side]) -> None:
    from hpc.serving.triton import TritonEngine

    engine = TritonEngine()
    try:
        for side in sides:  # warm-up
            await rate(engine, side, args.concurrency, min(2.0, args.seconds), args.max_tokens)
        runs: dict[str, list[dict[str, float]]] = {side.name: [] for side in sides}
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                runs[side.name].append(await rate(engine, side, args.concurrency, args.seconds, args.max_tokens))
    finally:
        await engine.close()
    med = {name: {k: statistics.median(run[k] for run in v) for k in v[0]} for name, v in runs.items()}
    print(
        f"one replica (sim H200, slowdown {args.slowdown:g}), {args.concurrency} streams of {args.max_tokens} "
        f"tokens, {args.rounds} rounds of {args.seconds:g} s, direct gRPC:"
    )
    for name, m in med.items():
        rounds = " ".join(f"{run['rate']:.0f}" for run in runs[name])
        cpu = ", ".join(f"{role} {m[role]:.1f}" for role, _ in ROLES)
        total = sum(m[role] for role, _ in ROLES)
        print(f"  {name:8} {m['rate']:8.0f} tokens/s   rounds: {rounds}")
        print(f"  {name:8} CPU us per token: {cpu}, all {total:.1f}; {m['per_response']:.2f} tokens a response")
    if len(sides) == 2:
        this, base = med[sides[0].name], med[sides[1].name]
        print(f"  tokens/s, this / baseline: {this['rate'] / base['rate']:.3f}")
        for role, _ in ROLES:
            print(f"  {role} CPU per token, this / baseline: {this[role] / max(base[role], 1e-9):.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16, help="streams in flight")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0, help="one round's length")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slowdown", type=float, default=1.0, help="model.sim.slowdown: each step waits this x")
    parser.add_argument("--set", action="append", default=[], help="KEY.PATH=VALUE into the spec (repeatable)")
    parser.add_argument("--baseline", type=Path, help="a source tree of another commit: a second replica of it")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-replica-"))
    os.environ[HOME_ENV] = str(work / "hpc-home")
    print(f"work folder: {work}\n")
    try:
        with contextlib.ExitStack() as stack:
            sides = []
            trees = [("this", None)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
            for name, source in trees:
                checkpoint = work / "sim-llama"  # made by the first submit (model.init), shared by the second
                batch = {"max_batch_size": max(64, args.concurrency)}
                spec = write_spec(work, f"replica-{name}", checkpoint, 1, "token", batch, backend="sim")
                sim = f"model.sim={{gpu: h200, slowdown: {args.slowdown:g}}}"
                apply_sets(spec, ["model.init={model: llama-3.1-8b}", sim, *args.set])
                job_id, job_dir = stack.enter_context(replica(spec, source))
                sides.append(Side(name, job_id, job_dir))
            asyncio.run(measure(args, sides))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
