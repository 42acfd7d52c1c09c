"""The deployment folder's names and paths: the only module that knows them (DEVELOPERS.md "The deployment folder").

Why one module: the folder is the contract between processes that never import each other's code at run time
(render writes it, the `.sub` and the launcher fill it on compute nodes, `hpc` reads it from any shell), and
every hand-typed copy of a name is a copy that can drift. Modelled on submitit's ``JobPaths``: a small object
built from the deployment folder and a job id, used on the write side (launcher, `.sub` through the values
render passes into its templates, the local executor) and on the read side (`hpc` track, clients, tests).

Standard library only, and cheap to import: the local executor's supervisor imports it on the critical path
to a job's start. The job index (`~/.hpc-serve/jobs`, which points at job folders) is launcher/contracts/job_index.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SPEC_NAME = "spec.yaml"
LAUNCH_NAME = "launch.json"
SUB_NAME = "tensorrt_llm_triton.sub"
SH_NAME = "tensorrt_llm_triton.sh"
REPO_NAME = "triton_model_repo"
LOGS_NAME = "logs"
#: hpc-serve's own packages, copied here by render: what every rank imports (never the whole site-packages)
RUNTIME_NAME = "python"
SHIPPED_PACKAGES = ("launcher", "backend")
JOBS_NAME = "jobs"
ENDPOINTS_NAME = "endpoints"
RANKS_NAME = "ranks"
CANCEL_MARKER_NAME = "cancel_requested"
#: in `jobs/<id>/`: the job itself asks its ranks for the ordered stop (the `.sub` at Slurm's time limit, the
#: renewer after a handover); every launcher watches it as it watches the cancel marker, but the job was not
#: cancelled: it ends COMPLETED
STOP_REQUEST_NAME = "stop_requested"
#: the deployment's access token (0600; `hpc-serve token`, the gateway): never in scripts, logs or records
TOKEN_NAME = "access_token"
#: `<workdir>/<name>.gateway.json`: where a running gateway of deployment `<name>` says it listens
GATEWAY_RECORD_SUFFIX = ".gateway.json"
#: the gateway's own sbatch script (a spec's `gateway:` section): one small job in front of the deployment's jobs
GATEWAY_SUB_NAME = "gateway.sub"
#: in `D/jobs/<job_id>/`: this job is the deployment's gateway, not a serving job (written by submit and the script)
GATEWAY_JOB_MARKER_NAME = "gateway_job"
#: in a gateway job's `D/jobs/<job_id>/`: {"job_id": …} of the gateway job it submitted to take over before its time
#: limit (hpc/jobs/renewal.py); the successor may replace a live record of the job that names it here
GATEWAY_SUCCESSOR_NAME = "gateway_successor"
#: a spec's `build:` section: the engine build job's sbatch script (hpc/jobs/), and in its job folder the mark that
#: it is a build job, the step it runs, and the step that failed (launcher/contracts/build_records.py's BuildStep, each)
BUILD_SUB_NAME = "build.sub"
#: `hpc-serve doctor --probe`'s sbatch script, in the probe's own folder (hpc/render/probe.py renders it)
PROBE_SUB_NAME = "probe.sub"
BUILD_JOB_MARKER_NAME = "build_job"
BUILD_FAILURE_NAME = "build_failed.json"
BUILD_STEP_NAME = "build_step.json"
#: in the build job's folder: every step's output; in the deployment folder: what the job builds (its steps'
#: command lines, the engine folder, the request that names it; read by the job's last step and by `status`)
BUILD_LOG_NAME = "build.log"
BUILD_REQUEST_NAME = "build_request.json"
#: in a built engine folder: what built it (inputs' identity, arguments, tool version; launcher/jobscript/build_record.py)
BUILD_RECORD_NAME = "hpc-serve-build.json"
#: in a build's `output_dir` (the engine cache), beside its engine folders: a build job's staging folder (the
#: last step renames it to the engine folder), and the marker that job `{job}` builds `{key}` now, so a second
#: submission waits on it rather than build it twice (written by submit once sbatch named the job; removed by the
#: job's EXIT trap however it ends, and by a reader that finds its job ended: hpc/jobs/build.py)
BUILD_STAGING_NAME = ".staging-{key}-{job}"
BUILDING_MARKER_NAME = ".building-{key}-{job}.json"
#: the marker as builds rendered before the job id was in its name wrote it (only ever cleaned up now)
OLD_BUILDING_MARKER_NAME = ".building-{key}.json"
#: the local executor's supervisor state: what sacct is to a Slurm job
LOCAL_STATE_NAME = "local.json"
#: a requeued job (same id, restarted by Slurm): the `.sub` writes `$SLURM_RESTART_COUNT` here at every start,
#: and moves the records of the run before into `previous/<run>/` (run 0 is the first)
RESTART_COUNT_NAME = "restart_count"
PREVIOUS_RUNS_NAME = "previous"
#: replica_policy restart: in `D/jobs/<job_id>/replica_restarts/`, each replica's latest ReplicaRestart
#: (`replica-<r>.json`, launcher/contracts/records.py) and the records of each run of it that ended
#: (`replica-<r>/<n>/`: its ranks' exit records, moved there by the `.sub` before restart n)
REPLICA_RESTARTS_NAME = "replica_restarts"
#: in `ranks/`: the rank's launcher gave up on something a restart cannot change (the plan, a fixed port, the
#: token): the `.sub` restarts no replica of it
NO_RESTART_SUFFIX = ".no_restart"
#: in `ranks/`: the rank crashed (config.START_CRASH_SIGNALS) before its replica was ever READY: the `.sub` starts
#: the replica again (config.START_CRASH_RESTARTS) under any replica_policy
START_CRASH_SUFFIX = ".start_crash"
#: renewal (launcher/jobscript/renew.py): in `D/jobs/<job_id>/`, the job's place in its chain (written by its own renewer)
CHAIN_NAME = "chain.json"
#: ... and its mark once a successor serves: clients send it no new requests (hpc/serving/discovery.py)
DRAINING_NAME = "draining"
#: in `D/jobs/<job_id>/`: the Slurm cluster (ClusterName) the job runs on: job ids are unique per cluster only,
#: and clusters may share $HOME (launcher/contracts/job_index.py)
CLUSTER_NAME = "cluster"
#: in `D/`: `hpc-serve cancel` of the deployment stopped its chain; no renewer of a job older than it submits
RENEW_STOP_NAME = "renew_stopped"
#: in `D/`: the autoscaling controller's decisions and state (launcher/contracts/autoscale.py)
AUTOSCALE_NAME = "autoscale.json"
#: in `D/jobs/<job_id>/`: the autoscaling controller let the job expire: its renewer submits no successor
NO_SUCCESSOR_NAME = "no_successor"

ENDPOINT_GLOB = "replica-*.json"
ENDPOINT_NAME = "replica-{replica}.json"
#: a replica leader's startup phase (records.StartupRecord) until it publishes its endpoint; not `*.json`, so
#: the endpoint glob never takes it for an endpoint
STARTING_NAME = "replica-{replica}.starting"
RANK_RECORD_GLOB = "rank-*.json"
STOPPING_GLOB = "rank-*.stopping"

#: The folder holding `launcher/`, `backend/` and `hpc/`: put first on each rank's PYTHONPATH (and mounted into
#: containers) so the launcher and the python models import the code the user submitted with.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def with_source_root(pythonpath: str | None, root: Path = SOURCE_ROOT) -> str:
    """PYTHONPATH with `root` first (and not twice): how every process hpc-serve starts finds its code.

    Ranks pass their deployment's shipped copy (`Deployment.runtime_root`): after a wheel install SOURCE_ROOT
    is `site-packages`, which first on PYTHONPATH (or mounted into a container) would shadow the container's
    own numpy and friends."""
    rest = [p for p in (pythonpath or "").split(os.pathsep) if p and p != str(root)]
    return os.pathsep.join([str(root), *rest])


def gateway_record(workdir: Path, name: str) -> Path:
    """The address record of the gateway of deployment `name` (every folder `<workdir>/<name>-*`). It lives
    beside the deployment folders, not in one, because a gateway outlives the jobs and folders it serves."""
    return Path(workdir) / f"{name}{GATEWAY_RECORD_SUFFIX}"


def gateway_lock(workdir: Path, name: str) -> Path:
    """The lock `submit` holds while it decides whether deployment `name` needs a gateway job and submits it:
    two submits at once would otherwise both see none and start two."""
    return Path(workdir) / f".{name}.gateway.lock"


def rank_log_name(job_id: str, rank: int | str, stream: str = "out") -> str:
    """`<job>_<rank>_log.out|err`: submitit's JobPaths naming, so `submitit.SlurmJob(...).stdout()` reads it.
    Also takes placeholders (`"%j", "%t"` for srun's --output, shell variables for the local executor)."""
    if stream not in ("out", "err"):
        raise ValueError(f"stream must be 'out' or 'err', got {stream!r}")
    return f"{job_id}_{rank}_log.{stream}"


@dataclass(frozen=True)
class Deployment:
    """One rendered deployment folder `D` (what `render` writes)."""

    root: Path

    @property
    def spec(self) -> Path:
        return self.root / SPEC_NAME

    @property
    def launch(self) -> Path:
        return self.root / LAUNCH_NAME

    @property
    def sub(self) -> Path:
        return self.root / SUB_NAME

    @property
    def sh(self) -> Path:
        return self.root / SH_NAME

    @property
    def gateway_sub(self) -> Path:
        """The gateway's sbatch script (rendered only when the spec has an enabled `gateway:` section)."""
        return self.root / GATEWAY_SUB_NAME

    @property
    def build_sub(self) -> Path:
        """The engine build job's sbatch script (rendered only for a spec with a `build:` section)."""
        return self.root / BUILD_SUB_NAME

    @property
    def build_request(self) -> Path:
        """What the build job builds (hpc/jobs/build_script.py writes it, launcher/jobscript/build_record.py reads it)."""
        return self.root / BUILD_REQUEST_NAME

    @property
    def model_repository(self) -> Path:
        return self.root / REPO_NAME

    @property
    def runtime(self) -> Path:
        """`D/python`: the copy of hpc-serve's packages the ranks import (render writes it)."""
        return self.root / RUNTIME_NAME

    @property
    def runtime_root(self) -> Path:
        """What a rank puts first on PYTHONPATH: the shipped copy, or (a folder rendered before there was one)
        the installed source root."""
        return self.runtime if (self.runtime / "launcher").is_dir() else SOURCE_ROOT

    @property
    def logs_dir(self) -> Path:
        """sbatch's own -o/-e (Slurm does not create folders, so render does)."""
        return self.root / LOGS_NAME

    @property
    def jobs_dir(self) -> Path:
        return self.root / JOBS_NAME

    @property
    def token(self) -> Path:
        """The access token the gateway requires as `Authorization: Bearer …` (a 0600 file)."""
        return self.root / TOKEN_NAME

    @property
    def renew_stop(self) -> Path:
        """Written by `hpc-serve cancel` of the deployment: renewers of jobs started before it submit nothing."""
        return self.root / RENEW_STOP_NAME

    @property
    def autoscale(self) -> Path:
        """The autoscaling controller's record: its last decisions and its hysteresis' state."""
        return self.root / AUTOSCALE_NAME

    def sbatch_log(self, stream: str = "out", job_id: str = "%j") -> Path:
        """`D/logs/<job>.out|err`: the batch script's output (`%j` in the `#SBATCH -o` line)."""
        return self.logs_dir / f"{job_id}.{stream}"

    def job(self, job_id: str) -> JobPaths:
        return JobPaths(self.root, job_id)


@dataclass(frozen=True)
class JobPaths:
    """Everything one submission of a deployment reads or writes: `D/jobs/<job_id>/…`."""

    deploy_dir: Path
    job_id: str

    @classmethod
    def of_folder(cls, job_dir: Path) -> JobPaths:
        """From a job folder `D/jobs/<job_id>` (the index's symlink target)."""
        return cls(job_dir.parent.parent, job_dir.name)

    @staticmethod
    def is_job_folder(path: Path) -> bool:
        return path.parent.name == JOBS_NAME

    @property
    def deployment(self) -> Deployment:
        return Deployment(self.deploy_dir)

    @property
    def folder(self) -> Path:
        return self.deploy_dir / JOBS_NAME / self.job_id

    @property
    def endpoints_dir(self) -> Path:
        return self.folder / ENDPOINTS_NAME

    @property
    def ranks_dir(self) -> Path:
        return self.folder / RANKS_NAME

    def endpoint(self, replica: int) -> Path:
        """Written atomically by replica `replica`'s leader once tritonserver is ready."""
        return self.endpoints_dir / ENDPOINT_NAME.format(replica=replica)

    def starting(self, replica: int) -> Path:
        """Written by replica `replica`'s leader while it loads and warms up; removed once it is ready or ends."""
        return self.endpoints_dir / STARTING_NAME.format(replica=replica)

    def starting_records(self) -> list[Path]:
        """Every replica's startup record of the job."""
        glob = STARTING_NAME.format(replica="*")
        return sorted(self.endpoints_dir.glob(glob)) if self.endpoints_dir.is_dir() else []

    def rank_record(self, rank: int) -> Path:
        """Written by each rank's launcher when its tritonserver exits (or it gave up)."""
        return self.ranks_dir / f"rank-{rank}.json"

    def stopping(self, rank: int) -> Path:
        """A leader's launcher, on its first stop signal (`HPC_SERVE_STOP_FILE` for the model)."""
        return self.ranks_dir / f"rank-{rank}.stopping"

    def drain(self, rank: int) -> Path:
        """A leader's model, once it saw the stop (``{"state": "draining"}``) and once nothing is in flight any
        more (``"drained"``): its launcher sends tritonserver SIGTERM only then (launcher/node/stop.py LeaderDrain)."""
        return self.ranks_dir / f"rank-{rank}.drain"

    def released(self, rank: int) -> Path:
        """A follower's model, once its leader released it (`HPC_SERVE_RELEASE_FILE`)."""
        return self.ranks_dir / f"rank-{rank}.released"

    def rank_log(self, rank: int | str, stream: str = "out") -> Path:
        return self.folder / rank_log_name(self.job_id, rank, stream)

    def rank_logs(self, stream: str = "err") -> list[Path]:
        """Every rank's log of `stream` that exists, sorted by name."""
        return sorted(self.folder.glob(rank_log_name(self.job_id, "*", stream)))

    @property
    def cancel_marker(self) -> Path:
        """Written by `cancel` before it signals anything: ranks that exit after it were stopped by the user."""
        return self.folder / CANCEL_MARKER_NAME

    @property
    def stop_request(self) -> Path:
        """Written by the job itself (the `.sub`'s time-limit trap, the renewer): its ranks stop in order."""
        return self.folder / STOP_REQUEST_NAME

    @property
    def gateway_successor(self) -> Path:
        """A renewing gateway job's successor (its job id), written once it was submitted."""
        return self.folder / GATEWAY_SUCCESSOR_NAME

    @property
    def build_log(self) -> Path:
        """Every step's output of a build job (its last lines are what `status` shows for a failed build)."""
        return self.folder / BUILD_LOG_NAME

    @property
    def build_failure(self) -> Path:
        """Written by the build script when a step fails: which step, its exit status (launcher/contracts/build_records.py)."""
        return self.folder / BUILD_FAILURE_NAME

    @property
    def build_step(self) -> Path:
        """Written by the build script as each step starts: the step it runs (launcher/contracts/build_records.py)."""
        return self.folder / BUILD_STEP_NAME

    @property
    def local_state(self) -> Path:
        return self.folder / LOCAL_STATE_NAME

    @property
    def restart_count(self) -> Path:
        """`$SLURM_RESTART_COUNT` of the run going on (0 until Slurm requeues the job), written by the `.sub`."""
        return self.folder / RESTART_COUNT_NAME

    def no_restart(self, rank: int) -> Path:
        """Written by a rank's launcher that gave up on what a restart cannot change (NO_RESTART_SUFFIX)."""
        return self.ranks_dir / f"rank-{rank}{NO_RESTART_SUFFIX}"

    def start_crash(self, rank: int) -> Path:
        """Written by a rank's launcher whose tritonserver or stub crashed before its replica was READY."""
        return self.ranks_dir / f"rank-{rank}{START_CRASH_SUFFIX}"

    @property
    def replica_restarts_dir(self) -> Path:
        return self.folder / REPLICA_RESTARTS_NAME

    def replica_restart(self, replica: int) -> Path:
        """The replica's latest ReplicaRestart (replica_policy restart), written by the `.sub` when its step ended."""
        return self.replica_restarts_dir / f"replica-{replica}.json"

    def replica_ended_run(self, replica: int, restart: int) -> Path:
        """The rank records of the run of `replica` that ended before restart `restart` (1: the first restart)."""
        return self.replica_restarts_dir / f"replica-{replica}" / str(restart)

    def previous_run(self, run: int) -> Path:
        """Where the `.sub` of a requeued job moved the endpoints and rank records of run `run` (0: the first)."""
        return self.folder / PREVIOUS_RUNS_NAME / str(run)

    @property
    def chain(self) -> Path:
        """The job's place in its renewal chain (predecessor, successor, times), written by its own renewer."""
        return self.folder / CHAIN_NAME

    @property
    def draining(self) -> Path:
        """Written by the job's renewer once its successor serves: clients send it no new requests."""
        return self.folder / DRAINING_NAME

    @property
    def no_successor(self) -> Path:
        """Written by the autoscaling controller (a RenewStop): the job serves to its time limit, not renewed."""
        return self.folder / NO_SUCCESSOR_NAME

    def stopping_marks(self) -> list[Path]:
        """Every leader's `rank-<r>.stopping` of the job: its ordered stop has begun."""
        return sorted(self.ranks_dir.glob(STOPPING_GLOB)) if self.ranks_dir.is_dir() else []

    @property
    def cluster_file(self) -> Path:
        """The Slurm cluster the job runs on (`CLUSTER_NAME`), written by submit and by the `.sub` at job start."""
        return self.folder / CLUSTER_NAME

    @property
    def cluster(self) -> str | None:
        """The job's recorded cluster; None for a local job, or a folder from before clusters were recorded."""
        try:
            return self.cluster_file.read_text().strip() or None
        except OSError:
            return None

    def record_cluster(self, cluster: str) -> None:
        """Write the job's cluster (atomically: a reader never sees an empty file and takes it for no cluster)."""
        if self.cluster == cluster:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{CLUSTER_NAME}.{os.getpid()}"
        tmp.write_text(cluster + "\n")
        os.replace(tmp, self.cluster_file)

    def create(self) -> JobPaths:
        """Make the folders the ranks write into (the `.sub` does the same for a hand-run sbatch)."""
        self.endpoints_dir.mkdir(parents=True, exist_ok=True)
        self.ranks_dir.mkdir(exist_ok=True)
        return self


def building_marker(output_root: Path, key: str, job_id: str) -> Path:
    """The marker that job `job_id` builds `key` (the engine cache's BUILDING_MARKER_NAME)."""
    return output_root / BUILDING_MARKER_NAME.format(key=key, job=job_id)


def building_markers(output_root: Path, key: str) -> list[Path]:
    """Every marker of a build of `key` under `output_root` (the old name's too): the jobs that may be building it."""
    found = sorted(output_root.glob(BUILDING_MARKER_NAME.format(key=key, job="*")))
    old = output_root / OLD_BUILDING_MARKER_NAME.format(key=key)
    return found + ([old] if old.exists() else [])


def template_values(deploy_dir: Path) -> dict[str, str]:
    """The names and paths the `.sub`/`.sh` templates write, so the templates re-type none of them. Paths inside
    the job folder are relative to the shell variables the `.sub` sets (`$DEPLOY_DIR`, `$JOB_DIR`)."""
    dep = Deployment(deploy_dir)
    return {
        "sub_path": str(dep.sub),
        "sh_path": str(dep.sh),
        "sh_name": SH_NAME,
        "sbatch_out": str(dep.sbatch_log("out")),
        "sbatch_err": str(dep.sbatch_log("err")),
        "jobs_name": JOBS_NAME,
        "endpoints_name": ENDPOINTS_NAME,
        "ranks_name": RANKS_NAME,
        "stop_request_name": STOP_REQUEST_NAME,
        "cancel_marker_name": CANCEL_MARKER_NAME,
        "stopping_glob": STOPPING_GLOB,
        "rank_log_example": str(dep.job("<job id>").rank_log("<rank>")),
        "restart_count_name": RESTART_COUNT_NAME,
        "previous_runs_name": PREVIOUS_RUNS_NAME,
        "replica_restarts_name": REPLICA_RESTARTS_NAME,
        "no_restart_suffix": NO_RESTART_SUFFIX,
        "start_crash_suffix": START_CRASH_SUFFIX,
        "gateway_sub_path": str(dep.gateway_sub),
        "gateway_marker_name": GATEWAY_JOB_MARKER_NAME,
        "build_sub_path": str(dep.build_sub),
        "build_marker_name": BUILD_JOB_MARKER_NAME,
        "build_failure_name": BUILD_FAILURE_NAME,
        "build_step_name": BUILD_STEP_NAME,
        "build_record_name": BUILD_RECORD_NAME,
        "build_log_name": BUILD_LOG_NAME,
        "build_request_path": str(dep.build_request),
    }
