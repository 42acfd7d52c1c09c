"""A rank's processes on the llmapi workflow (launcher/contracts/llmapi.py says why hpc-serve does these steps itself
rather than run `trtllm-llmapi-launch`).

Rank 0 of a replica runs two processes: the *leader node* (the engine's MPI rank 0, started first, with the MPI job
variables intact) and tritonserver (without them), joined by a loopback IPC address of the job's own and a fresh
HMAC key that only their environments carry. Ranks > 0 run a *worker node* in place of tritonserver. The leader
node is watched like a peer: if it ends while tritonserver serves, the rank fails at once with its exit code and
its last log lines (they share the rank's log ring); after tritonserver ends, the leader node gets a bounded time
to end by itself, as the release of TensorRT-LLM ends it (launcher/contracts/trtllm_versions.py STOP_ACTION_SINCE: the
LLM's shutdown in the model's finalize on older releases; `python -m tensorrt_llm.llmapi.mgmn_leader_node --action
stop`, sent by this launcher as trtllm-llmapi-launch sends it, on newer ones), then SIGTERM, then SIGKILL, so
nothing outlives the rank.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from launcher.contracts import model_names
from launcher.contracts.llmapi import MODEL_FILES, MPI_SIZE_VAR, SPAWN_PROXY_VAR, new_hmac_key, proxy_env, without_mpi
from launcher.contracts.plan import LaunchPlan
from launcher.contracts.trtllm_versions import LEADER_NODE_MODULE, WORKER_NODE_MODULE, has_stop_action
from launcher.node.ports import free_ports
from launcher.node.stop import FOLLOWER_IGNORES
from launcher.node.supervise import LOG_RING, Child, Supervisor, log, signal_name, start_process
from launcher.node.watch import Failure

#: after tritonserver ended (its model unloaded, and the leader node was told to stop): how long the leader node may
#: take to end by itself, and then after SIGTERM, before SIGKILL
LEADER_NODE_EXIT_S = 10.0
LEADER_NODE_TERM_S = 3.0
#: how long `mgmn_leader_node --action stop` may take (it connects to the leader node and tells it to stop)
STOP_ACTION_S = 10.0
#: how long reading the installed TensorRT-LLM's version may take (a python reading tensorrt_llm/version.py)
VERSION_PROBE_S = 30.0
#: the installed tensorrt_llm's version, read without importing the package (that takes seconds and a GPU): its
#: version.py, found where `import tensorrt_llm` would find it, run on its own; "" when there is none
VERSION_PROBE = (
    "import importlib.util, os, runpy\n"
    "spec = importlib.util.find_spec('tensorrt_llm')\n"
    "path = os.path.join(os.path.dirname(spec.origin), 'version.py') if spec and spec.origin else ''\n"
    "print(runpy.run_path(path).get('__version__', '') if os.path.isfile(path) else '')\n"
)


class ModelFilesMissing(RuntimeError):
    """The image lacks the llmapi model's files that launch.json names: the replica cannot serve."""


def leader_node_argv() -> list[str]:
    """Rank 0's engine process: this interpreter (the container's python3) on TensorRT-LLM's leader-node module."""
    return [sys.executable, "-m", LEADER_NODE_MODULE]


def worker_node_argv() -> list[str]:
    """A rank > 0's only process: TensorRT-LLM's worker-node module."""
    return [sys.executable, "-m", WORKER_NODE_MODULE]


def engine_env(plan: LaunchPlan, env: dict[str, str]) -> dict[str, str]:
    """What trtllm-llmapi-launch exports on every rank: the spawn-proxy switch and the ranks' count."""
    return {**env, SPAWN_PROXY_VAR: "1", MPI_SIZE_VAR: str(plan.world_size_per_replica)}


def trtllm_version(env: dict[str, str]) -> str | None:
    """The TensorRT-LLM release the ranks import (VERSION_PROBE, with the leader node's environment); None when
    it cannot be told."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", VERSION_PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=VERSION_PROBE_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(f"could not read the installed TensorRT-LLM's version: {exc}")
        return None
    version = proc.stdout.strip()
    if proc.returncode or not version:
        log(f"could not read the installed TensorRT-LLM's version: {proc.stderr.strip()[-300:] or 'none found'}")
        return None
    return version


def model_version_dir(plan: LaunchPlan) -> Path:
    """`<repository>/tensorrt_llm/1/`: where model.yaml is and the image's model files go."""
    return Path(plan.model_repository) / model_names.TENSORRT_LLM / "1"


def copy_model_files(plan: LaunchPlan) -> list[Path]:
    """Copy the image's model.py and helpers.py (launch.json `model_files_from`) into the repository, each moved
    into place whole (the replicas of a job start together and share the repository); the paths written.
    Nothing to do when the plan names no source (the CPU backend's model is in the repository already)."""
    if not plan.model_files_from:
        return []
    source = Path(plan.model_files_from)
    missing = [name for name in MODEL_FILES if not (source / name).is_file()]
    if missing:
        raise ModelFilesMissing(
            f"{', '.join(str(source / m) for m in missing)} not found: the image's TensorRT-LLM llmapi model "
            f"(launch.json model_files_from); use an image that has it, or name the folder that holds "
            f"{' and '.join(MODEL_FILES)} in the spec"
        )
    target = model_version_dir(plan)
    written = []
    for name in MODEL_FILES:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=target)
        os.close(fd)
        shutil.copyfile(source / name, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target / name)
        written.append(target / name)
    return written


class LeaderNode:
    """Rank 0's engine process beside tritonserver: started before it, watched while it serves, ended after it."""

    def __init__(self, plan: LaunchPlan, env: dict[str, str]) -> None:
        self.argv = leader_node_argv()
        self.port = free_ports(1)[0]
        self.proxy = proxy_env(self.port, new_hmac_key())
        self.env = {**engine_env(plan, env), **self.proxy}
        self.version = trtllm_version(self.env)
        self.child: Child | None = None
        #: the last signal `end` had to send (None: it ended as its release ends it)
        self.signalled: str | None = None
        #: the rank's log ring: tritonserver's output joins it (roles.py LlmapiLeader passes it to the supervisor's spawn)
        self.ring: collections.deque[str] = collections.deque(maxlen=LOG_RING)
        #: (to end by itself, after SIGTERM) before SIGKILL: see LEADER_NODE_EXIT_S
        self.end_patience = (LEADER_NODE_EXIT_S, LEADER_NODE_TERM_S)

    def server_env(self, env: dict[str, str]) -> dict[str, str]:
        """tritonserver's environment: the MPI/Slurm job variables removed, the proxy's added."""
        return {**without_mpi(env), **self.proxy}

    def start(self) -> Child:
        """Start it, with the stop signals Slurm sends every process of the step ignored: it ends when the model
        stops it, or by the launcher (``end``), never before tritonserver has drained."""
        log(f"leader node on 127.0.0.1:{self.port}: {' '.join(self.argv)} (tensorrt_llm {self.version or 'unknown'})")
        self.child = start_process(self.argv, self.env, self.ring, FOLLOWER_IGNORES)
        return self.child

    def death(self) -> Failure | None:
        """A Failure once the leader node has ended (any exit while tritonserver runs is one: the engine is gone)."""
        rc = self.child.proc.poll() if self.child is not None else None
        if rc is None:
            return None
        how = f"signal {signal_name(rc)}" if signal_name(rc) else f"exit code {rc}"
        return Failure(
            f"the leader node ({' '.join(self.argv[1:])}) ended ({how}) while tritonserver served",
            signal=signal_name(rc),
            exit_code=rc,
        )

    def send_stop_action(self) -> None:
        """`mgmn_leader_node --action stop`, as trtllm-llmapi-launch sends it once tritonserver exited: only where
        the release has it (an older leader-node module takes no arguments and would start a second server),
        only while the leader node is alive, and time-boxed."""
        child = self.child
        if child is None or child.proc.poll() is not None:
            return
        if self.version is None or not has_stop_action(self.version):
            return
        argv = [*self.argv, "--action", "stop"]
        log(f"tritonserver exited; stopping the leader node as trtllm-llmapi-launch does: {' '.join(argv[1:])}")
        try:
            proc = subprocess.run(
                argv, env=self.env, capture_output=True, text=True, timeout=STOP_ACTION_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log(f"{' '.join(argv[1:])}: {exc}")
            return
        if proc.returncode:
            log(f"{' '.join(argv[1:])} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")

    def end(self) -> int | None:
        """After tritonserver: tell it to stop as its release wants, wait for it to end, then SIGTERM, then SIGKILL
        its group; its return code."""
        child = self.child
        if child is None:
            return None
        self.send_stop_action()
        waits = ((None, self.end_patience[0]), (signal.SIGTERM, self.end_patience[1]), (signal.SIGKILL, 5.0))
        for sig, patience in waits:
            if sig is not None and child.proc.poll() is None:
                log(f"leader node pid {child.proc.pid} still running; sending {signal.Signals(sig).name} to its group")
                self.signalled = signal.Signals(sig).name
                Supervisor.kill_group(child, sig)
            if _wait(child, patience):
                break
        Supervisor.kill_group_gone(child)  # whatever it left in its group
        child.finish_output()
        return child.proc.returncode


def _wait(child: Child, patience: float) -> bool:
    deadline = time.monotonic() + patience
    while child.proc.poll() is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def combined_watch(ranks: Callable[[bool], Failure | None], leader: LeaderNode) -> Callable[[bool], Failure | None]:
    """The supervisor's fail-fast question on rank 0: a failed peer or stub (launcher/node/watch.py), else a dead
    leader node (while not stopping: in an ordered stop the leader node may end first)."""

    def check(stopping: bool) -> Failure | None:
        return ranks(stopping) or (None if stopping else leader.death())

    return check
