"""`hpc-serve doctor` on the real Slurm test cluster (ci/cluster): the shipped CPU spec passes every check and
the probe job; a missing partition, missing container runtimes, a time past the partition's limit, nodes too
small and a workdir the nodes do not share each fail with their fix and exit 1."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests._env import unavailable
from tests._pythons import find_python, where_looked
from tests.e2e import CLI, cli

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "tiny-cpu-ensemble.yaml"  # the engine workflow until the llmapi launcher lands


@pytest.fixture(autouse=True)
def wide_table(monkeypatch):
    """Rich draws the table for COLUMNS: wide enough that each check stays on one line."""
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture(scope="module")
def short_partition(slurm_cluster) -> str:
    """ci/cluster's `short` partition (MaxTime 00:05:00). A cluster started before slurm.conf.in had it gets it
    at run time, with the very line of slurm.conf.in, rather than a restart of every daemon under other tests."""
    if subprocess.run(["scontrol", "show", "partition", "short"], capture_output=True).returncode != 0:
        line = next(
            line
            for line in (ROOT / "ci/cluster/slurm.conf.in").read_text().splitlines()
            if "PartitionName=short" in line
        )
        subprocess.run(["scontrol", "create", *line.split()], check=True, capture_output=True, text=True)
    return "short"


def spec_file(folder: Path, name: str, **sections) -> Path:
    """A CPU-engine spec (its checkpoint need not exist: doctor loads specs as `render` does)."""
    spec = {
        "name": name,
        "workdir": str(folder / "work"),
        "slurm": {"time": "00:10:00"},
        "model": {"backend": "cpu", "workflow": "engine", "checkpoint_dir": str(folder / "ckpt")},
    }
    for key, value in sections.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def failed(output: str) -> dict[str, str]:
    """{check: 'detail\\n  fix: ...'} of the report's FAIL lines."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^FAIL ([\w /.-]+?): (.*\n  fix: .*)$", output, re.M)}


def test_tiny_cpu_passes_with_probe(slurm_cluster):
    proc = cli("doctor", str(TINY), "--probe", "--probe-timeout", "120", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for check in ("slurm commands", "accounting", "mpi", "partition", "nodes", "time limit", "container",
                  "sbatch --test-only", "probe job", "shared workdir", "python", "tritonserver"):  # fmt: skip
        assert re.search(rf"│ {re.escape(check)}\s+│ ok ", out), f"{check} not ok:\n{out}"
    assert re.search(r"│ gpus\s+│ skip ", out) and re.search(r"│ tensorrt_llm\s+│ skip ", out), out
    assert "FAIL" not in out
    assert not (ROOT / "runs" / ".doctor").exists()  # the probe folder is removed when all passed


def test_missing_partition(slurm_cluster, tmp_path):
    proc = cli("doctor", str(spec_file(tmp_path, "nopart", slurm={"partition": "nosuch"})), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = failed(proc.stdout)
    assert "slurm.partition 'nosuch' does not exist" in fails["partition"]
    assert "fix: set slurm.partition to one of: debug (default)" in fails["partition"]
    assert list(fails) == ["partition"]


@pytest.mark.parametrize(
    ("container", "words"),
    [
        ({"type": "apptainer", "image": "/images/triton.sif"}, "`module load apptainer` in slurm.modules"),
        (
            {"type": "pyxis", "image": "nvcr.io#nvidia/tritonserver:24.08-trtllm-python-py3"},
            "ask your admins for pyxis",
        ),
    ],
)
def test_missing_container_runtime(slurm_cluster, tmp_path, container, words):
    if shutil.which("apptainer") or shutil.which("singularity"):
        pytest.skip("this machine has a container runtime")
    proc = cli("doctor", str(spec_file(tmp_path, "ctr", container=container)), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = failed(proc.stdout)
    assert list(fails) == ["container"], proc.stdout
    assert words in fails["container"]


def test_time_past_partition_limit(short_partition, tmp_path):
    spec = spec_file(tmp_path, "long", slurm={"partition": short_partition, "time": "01:00:00"})
    proc = cli("doctor", str(spec), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = failed(proc.stdout)
    assert list(fails) == ["time limit"], proc.stdout
    assert "slurm.time 01:00:00 is past short's MaxTime 00:05:00" in fails["time limit"]
    assert "fix: set slurm.time to 00:05:00 or less, or use a partition that allows it: debug" in fails["time limit"]
    ok = spec_file(tmp_path, "fits", slurm={"partition": short_partition, "time": "00:04:00"})
    assert cli("doctor", str(ok), check=False).returncode == 0


def test_validate_and_submit_refuse_a_time_slurm_would_never_start(short_partition, tmp_path, tiny_gpt2):
    """Past the partition's MaxTime Slurm queues the job PENDING (PartitionTimeLimit) for good: `validate` says so
    at the spec's line with the fix, and `submit` (CLI and hpc.api) submits nothing."""
    spec = spec_file(tmp_path, "never", slurm={"partition": short_partition, "time": "00:30:00"})
    data = yaml.safe_load(spec.read_text())
    data["model"]["checkpoint_dir"] = str(tiny_gpt2)
    spec.write_text(yaml.safe_dump(data))
    proc = cli("validate", str(spec), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(
        rf"^{re.escape(str(spec))}:\d+: slurm.time: slurm.time 00:30:00 is past short's MaxTime", proc.stderr
    )
    assert "Slurm would queue the job and never start it; set slurm.time to 00:05:00 or less" in proc.stderr
    proc = cli("submit", str(spec), "--executor", "slurm", check=False)
    assert proc.returncode == 2 and "never start it" in proc.stderr, proc.stdout + proc.stderr
    import hpc.api
    from hpc.spec import SpecError

    with pytest.raises(SpecError, match="never start it"):
        hpc.api.submit(spec, executor="slurm")
    assert not (tmp_path / "work").exists() or not list((tmp_path / "work").glob("never-*"))  # nothing written
    assert "never" not in subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout


def test_gateway_job_partition_and_time(short_partition, tmp_path):
    """The gateway job (spec `gateway:`) is a job of its own: its partition and time are checked beside the
    serving job's, which here fits `debug` while the gateway asks `short` for an hour."""
    gateway = {"partition": short_partition, "time": "01:00:00"}
    proc = cli("doctor", str(spec_file(tmp_path, "gw", gateway=gateway)), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = failed(proc.stdout)
    assert list(fails) == ["gateway time limit"], proc.stdout
    assert "gateway.time 01:00:00 is past short's MaxTime 00:05:00" in fails["gateway time limit"]
    assert "fix: set gateway.time to 00:05:00 or less, or use a partition that allows it: debug" in proc.stdout
    assert re.search(r"│ gateway partition\s+│ ok\s+│ short: UP", proc.stdout), proc.stdout
    assert re.search(r"│ time limit\s+│ ok\s+│ slurm.time 00:10:00", proc.stdout), proc.stdout
    # within the limit, but shorter than the serving job: a warning (exit 0), and Slurm's verdict was asked
    gateway["time"] = "00:04:00"
    proc = cli("doctor", str(spec_file(tmp_path, "gw-short", gateway=gateway)), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"│ gateway time limit\s+│ warn\s+│ gateway.time 00:04:00 within short's", proc.stdout)
    assert re.search(r"│ sbatch --test-only\s+│ ok ", proc.stdout), proc.stdout
    proc = cli("doctor", str(spec_file(tmp_path, "gw-none", gateway={"partition": "nosuch"})), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = failed(proc.stdout)
    assert list(fails) == ["gateway partition"], proc.stdout
    assert (
        "gateway.partition 'nosuch' does not exist\n  fix: set gateway.partition to one of: debug (default)"
        in (fails["gateway partition"])
    )


def test_nodes_too_small(slurm_cluster, tmp_path):
    """The emulated nodes have gpu:4 each, and the CPUs ci/cluster/common.sh gives them (sinfo says how many)."""
    cpus = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%c"], capture_output=True, text=True).stdout
    proc = cli("doctor", str(spec_file(tmp_path, "big", slurm={"gpus_per_node": 8})), check=False)
    assert proc.returncode == 1
    fails = failed(proc.stdout)
    most = max(int(n) for n in cpus.split())
    assert f"0 of 2 in debug fit; its usable nodes have at most {most} CPUs, 4 GPUs" in fails["nodes"], proc.stdout
    assert "lower slurm.nodes, slurm.gpus_per_node" in fails["nodes"]


def test_workdir_not_shared(slurm_cluster, tmp_path):
    """Every path is shared between this machine's emulated nodes, so the login side is made to differ: doctor
    runs in a mount namespace of its own (`unshare -m`) where the workdir is a fresh tmpfs, as a login node's
    local disk would be. The probe job, started by slurmd outside that namespace, sees the real folder at the
    same path: neither side sees the other's file, exactly as with a workdir on a disk the nodes lack."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        unavailable("needs root and unshare to give the login side a filesystem of its own")
    workdir = tmp_path / "work"
    workdir.mkdir()
    spec = spec_file(tmp_path, "local")
    wrap = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs login-only "$0" && exec "$@"', str(workdir)]
    proc = subprocess.run(
        [*wrap, *CLI, "doctor", str(spec), "--probe", "--probe-timeout", "120"],
        capture_output=True,
        text=True,
        timeout=200,
    )
    out = proc.stdout + proc.stderr
    if "mount" in proc.stderr and "permission denied" in proc.stderr.lower():
        unavailable(f"cannot mount a tmpfs in a mount namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 1, out
    fails = failed(proc.stdout)
    assert list(fails) == ["shared workdir"], out
    assert "the job did not see the file written here; the job's file is not seen here" in fails["shared workdir"]
    assert "fix: set workdir to a folder on a filesystem the login node and the compute nodes share" in out
    # the verdicts came back through the job's exit code: tritonserver still started on the node
    assert re.search(r"│ tritonserver\s+│ ok\s+│ passed on node\d \(from the job's", out), out
    # what the node wrote is in the real folder, not in the login side's tmpfs
    assert list(workdir.glob(".doctor/*/from-node"))


def test_write_profile(slurm_cluster, tmp_path):
    """What the doctor found becomes a site profile that loads as every profile does (hpc/spec/site.py)."""
    from hpc.spec.site import current_profile

    path = tmp_path / "site.yaml"
    proc = cli("doctor", str(TINY), "--write-profile", str(path))
    assert f"wrote site profile {path}" in proc.stdout
    profile = current_profile(path)
    assert profile is not None
    assert profile.data == {"slurm": {"partition": "debug", "gpus_per_node": 4, "mpi": "pmix"}}
    assert "written by hpc-serve doctor" in path.read_text()
    again = cli("doctor", str(TINY), "--write-profile", str(path), check=False)
    assert again.returncode == 2 and "exists" in again.stderr


def test_probe_timeout_cancels_the_job(slurm_cluster, tmp_path):
    """A probe that does not end in time is cancelled, and says so with its fix (0 s: it is still pending or
    starting at the first look)."""
    proc = cli("doctor", str(spec_file(tmp_path, "slow")), "--probe", "--probe-timeout", "0", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = failed(proc.stdout)
    assert list(fails) == ["probe job"], proc.stdout
    job = re.search(r"job (\d+) still (PENDING|RUNNING|CONFIGURING)", fails["probe job"])
    assert job and "after 0 s; cancelled" in fails["probe job"], fails
    assert "fix: try again with a longer --probe-timeout" in fails["probe job"]
    state = subprocess.run(["scontrol", "-o", "show", "job", job.group(1)], capture_output=True, text=True).stdout
    assert re.search(r"JobState=(CANCELLED|COMPLETING)", state), state


def test_probe_gpus_not_visible(slurm_cluster, tmp_path):
    """The emulated nodes' GPUs are fake devices without a driver: a spec asking for one gets its allocation
    (--gres=gpu:1) but nvidia-smi shows none, and the probe says so."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    spec = spec_file(tmp_path, "gpu", slurm={"gpus_per_node": 1})
    proc = cli("doctor", str(spec), "--probe", "--probe-timeout", "120", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = failed(proc.stdout)
    assert list(fails) == ["gpus"], proc.stdout
    assert (
        "nvidia-smi -L" in fails["gpus"] and "fix: the job sees fewer GPUs than slurm.gpus_per_node 1" in fails["gpus"]
    )


def test_probe_tritonserver_that_does_not_start(slurm_cluster, tmp_path):
    """triton.server names a file that is not a tritonserver the node can run: the launcher's resolution refuses
    it on the node, and the fix says where to point triton.server."""
    fake = tmp_path / "tritonserver"
    fake.write_text("#!/bin/sh\necho 'error while loading shared libraries: libtritonserver.so' >&2\nexit 127\n")
    fake.chmod(0o755)
    spec = spec_file(tmp_path, "badserver", triton={"server": str(fake)})
    proc = cli("doctor", str(spec), "--probe", "--probe-timeout", "120", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = failed(proc.stdout)
    assert list(fails) == ["tritonserver"], proc.stdout
    assert f"{fake} (launch.json tritonserver) exit 127: error while loading shared libraries" in fails["tritonserver"]
    assert "fix: set triton.server to the tritonserver binary on the nodes" in fails["tritonserver"]


#: `apptainer exec [--nv] [-B SRC:DST]... [--pwd DIR] IMAGE CMD...` that runs CMD on the host: an "image" whose
#: python3 is whichever interpreter container.python names
FAKE_APPTAINER = """#!/bin/bash
[ "$1" = exec ] || exit 2
shift
while [ $# -gt 0 ]; do case $1 in --nv) shift ;; -B|--pwd) shift 2 ;; *) break ;; esac; done
shift
exec "$@"
"""


def test_probe_names_a_container_python_too_old_for_the_ranks(slurm_cluster, tmp_path, monkeypatch):
    """An image whose python3 is 3.8 (NGC's images before Ubuntu 22.04): the probe runs node.py with it, as a
    rank would run the launcher, and the report names the version and what the ranks need. The container is
    a stand-in apptainer (on PATH here and, through sbatch's exported environment, in the job)."""
    python38 = find_python(3, 8)
    if python38 is None:
        pytest.skip(where_looked(3, 8))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(FAKE_APPTAINER)
    (bin_dir / "apptainer").chmod(0o755)
    (bin_dir / "tritonserver").write_text("#!/bin/sh\necho 'Usage: tritonserver [options]'\nexit 1\n")
    (bin_dir / "tritonserver").chmod(0o755)
    (tmp_path / "old.sif").touch()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    spec = spec_file(
        tmp_path,
        "oldpython",
        container={"type": "apptainer", "image": str(tmp_path / "old.sif"), "python": python38},
        triton={"server": str(bin_dir / "tritonserver")},
    )
    proc = cli("doctor", str(spec), "--probe", "--probe-timeout", "120", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = failed(proc.stdout)
    assert list(fails) == ["python"], proc.stdout
    version = re.search(rf"{re.escape(python38)} in the container is (3\.8\.\d+); ", fails["python"])
    assert version and "hpc-serve's rank-side code needs >= 3.10" in fails["python"], fails["python"]
    assert f"fix: use an image whose {python38} is Python 3.10 or newer" in fails["python"]


def _as_a_terminals_foreground_job() -> None:
    """SIGINT as a user's Ctrl-C finds it: handled. A test run started in the background of a shell without job
    control (`cmd &` in a script, CI's runners) has SIGINT ignored, and every process below it inherits that; the
    doctor under test then never sees the Ctrl-C (a contended run failed so: "doctor still ran 60 s after
    Ctrl-C", with nothing printed after the probe's submission)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_cancels_the_probe(slurm_cluster, tmp_path):
    """Ctrl-C while the probe job runs (its slurm.setup sleeps) cancels the job before doctor exits."""
    spec = spec_file(tmp_path, "interrupted", slurm={"setup": ["sleep 60"]})
    proc = subprocess.Popen(
        [*CLI, "doctor", str(spec), "--probe"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_as_a_terminals_foreground_job,
    )
    assert proc.stdout is not None
    seen = ""
    while not (job := re.search(r"probe job (\d+) submitted", seen)):
        line = proc.stdout.readline()
        assert line, f"doctor ended before submitting its probe:\n{seen}"
        seen += line
    proc.send_signal(signal.SIGINT)
    try:
        out = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"doctor still ran 60 s after Ctrl-C:\n{seen}{proc.communicate()[0]}") from None
    assert proc.returncode == 130, out
    assert f"probe job {job.group(1)} cancelled" in out
    state = subprocess.run(["scontrol", "-o", "show", "job", job.group(1)], capture_output=True, text=True).stdout
    assert re.search(r"JobState=(CANCELLED|COMPLETING)", state), state


def test_probe_of_a_broken_stand_in_image_names_the_failed_import_and_the_known_defect(slurm_cluster, tmp_path):
    """An image whose python cannot import the llmapi model (`container.type: none`, a tensorrt_llm
    1.2.1 first on PYTHONPATH whose import reaches an openai without PartReasoningText, as NGC 26.03-26.07's
    does). The probe job imports on the node what the model imports, and the report fails each import with the
    exception and the known defect's fix; doctor exits 1."""
    from tests.test_doctor_imports import SYMPTOM, broken_site, image_model

    site = broken_site(tmp_path / "site")
    model = image_model(tmp_path / "model")
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    (checkpoint / "model.safetensors").write_text("")
    spec = spec_file(
        tmp_path,
        "broken",
        container={"type": "none"},
        slurm={"gpus_per_node": 1, "env": {"PYTHONPATH": str(site)}},
        model={
            "backend": "tensorrtllm",
            "workflow": "llmapi",
            "checkpoint_dir": str(checkpoint),
            "model_files_from": str(model),
        },
    )
    proc = cli("doctor", str(spec), "--probe", "--probe-timeout", "200", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    fails = failed(proc.stdout)
    assert re.search(r"│ tensorrt_llm\s+│ ok\s+│ tensorrt_llm 1\.2\.1 serves the llmapi workflow", out), out
    for name in ("import tensorrt_llm", "import leader node", "import image model.py"):
        assert f"ImportError: {SYMPTOM}" in fails[name], out
        assert "known defect of TensorRT-LLM 1.2.1, openai-too-old" in fails[name]
        assert "pip install -U openai" in fails[name]
    assert set(fails) <= {"gpus", "import tensorrt_llm", "import leader node", "import image model.py"}, out
