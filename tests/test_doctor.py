"""`hpc-serve doctor` without a cluster: reading Slurm's outputs (copied from real clusters), the probe job's
script and its verdicts from what came back, the report, the starting site profile."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.doctor import parse
from hpc.doctor.facts import Facts
from hpc.doctor.probe import write_probe
from hpc.doctor.profile import profile_values
from hpc.doctor.report import Check, exit_code, fail, ok
from hpc.doctor.verdicts import ProbeJob, verdicts
from hpc.spec import Spec
from launcher.contracts.layout import SHIPPED_PACKAGES, SOURCE_ROOT
from tests._golden import check_script

PARTITIONS = (
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
    "DefaultTime=NONE MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 Nodes=node[1-2] State=UP TotalCPUs=16 "
    "TotalNodes=2 JobDefaults=(null) TRES=cpu=16,mem=8000M,node=2,billing=16,gres/gpu=8\n"
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=proj1,proj2 AllowQos=ALL Default=NO MaxTime=2-00:00:00 "
    "Nodes=gpu[001-004] State=DRAIN TotalNodes=4\n"
)
NODE = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUTot=8 Gres=gpu:4 NodeAddr=127.0.0.1 "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=4000 State=IDLE "
    "Partitions=debug  Reason=maintenance by admin [root@2026-11-01T10:00:00] CfgTRES=cpu=8,mem=4000M,gres/gpu=4"
)


def test_scontrol_records_keep_values_with_spaces_and_equals():
    debug, gpu = parse.scontrol_records(PARTITIONS)
    assert (debug["PartitionName"], debug["Default"], debug["MaxTime"], debug["State"]) == (
        "debug",
        "YES",
        "UNLIMITED",
        "UP",
    )
    assert debug["TRES"] == "cpu=16,mem=8000M,node=2,billing=16,gres/gpu=8"
    assert (gpu["AllowAccounts"], gpu["MaxTime"], gpu["State"]) == ("proj1,proj2", "2-00:00:00", "DRAIN")
    (node,) = parse.scontrol_records(NODE)
    assert node["OS"] == "Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0"
    assert node["Reason"] == "maintenance by admin [root@2026-11-01T10:00:00]"
    assert (node["CPUTot"], node["Gres"], node["State"]) == ("8", "gpu:4", "IDLE")


def test_sinfo_nodes_states_partitions_and_gres():
    text = "\n".join(
        [
            "node1|debug*|idle|8|gpu:4|4000",
            "node1|short|idle|8|gpu:4|4000",
            "gpu001|gpu|mixed|64|gpu:a100:8(S:0-1)|512000",
            "gpu002|gpu|drained|64|gpu:a100:8(S:0-1)|512000",
            "gpu003|gpu|idle~|64|gpu:h100:4,gpu:a100:2|512000+",
            "gpu004|gpu|idle*|64|gpu:8|512000",
            "cpu1|cpu|allocated|128|(null)|256000",
            "garbage line",
        ]
    )
    nodes = parse.sinfo_nodes(text)
    assert [(n.name, n.partition) for n in nodes][:2] == [("node1", "debug"), ("node1", "short")]
    by_name = {n.name: n for n in nodes if n.partition != "short"}
    assert {name: n.gpus for name, n in by_name.items()} == {
        "node1": 4,
        "gpu001": 8,
        "gpu002": 8,
        "gpu003": 6,
        "gpu004": 8,
        "cpu1": 0,
    }
    usable = {name for name, n in by_name.items() if n.usable}
    assert usable == {"node1", "gpu001", "gpu003", "cpu1"}  # drained, and not responding (idle*), are not
    assert by_name["gpu003"].memory_mb == 512000 and by_name["cpu1"].cpus == 128


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:4", 4),
        ("gpu:a100:8(S:0-1)", 8),
        ("gpu:a100:4,gpu:v100:2", 6),
        ("gpu", 1),
        ("(null)", 0),
        ("", 0),
        ("shard:8,gpu:2", 2),
        ("gpu:a100:2(S:0,1)", 2),
    ],  # fmt: skip
)
def test_gres_gpus(gres, gpus):
    assert parse.gres_gpus(gres) == gpus


def test_mpi_types_new_and_old_formats():
    new = "MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\nspecific pmix plugin versions available: pmix_v4\n"
    assert parse.mpi_types(new) == (["pmix", "none", "cray_shasta", "pmi2"], ["pmix_v4"])
    old = "srun: MPI types are...\nsrun: none\nsrun: mpi/pmi2\nsrun: mpi/pmix_v3\n"
    types, versions = parse.mpi_types(old)
    assert "pmi2" in types and "pmix" in types and versions == ["pmix_v3"]
    assert parse.mpi_types("MPI plugin types are...\n\tnone\n\tpmi2\n") == (["none", "pmi2"], [])


def test_config_version_memory():
    config = parse.config_values(
        "Configuration data as of 2026-11-23T04:44:01\nAccountingStorageEnforce = associations,limits,qos\n"
        "AccountingStorageType   = accounting_storage/slurmdbd\nMinJobAge               = 300 sec\n"
    )
    assert config == {
        "AccountingStorageEnforce": "associations,limits,qos",
        "AccountingStorageType": "accounting_storage/slurmdbd",
        "MinJobAge": "300 sec",
    }
    assert parse.slurm_version("slurm-wlm 22.05.8\n") == "22.05.8"
    assert parse.slurm_version("slurm 23.11.4") == "23.11.4"
    assert [parse.mem_mb(v) for v in ("64G", "512000M", "512000", "1T", "0", "0G")] == [
        65536,
        512000,
        512000,
        1048576,
        None,
        None,
    ]


LLMAPI_MODEL = {"backend": "tensorrtllm", "workflow": "llmapi", "checkpoint_dir": "."}


def spec(tmp_path: Path, **extra) -> Spec:
    data = {
        "name": "t",
        "workdir": str(tmp_path / "work"),
        "model": {"backend": "cpu", "workflow": "engine", "checkpoint_dir": "."},
    }
    data.update(extra)
    return Spec.model_validate(data)


def test_probe_script_quotes_everything_from_the_spec(tmp_path):
    """A workdir with a space, an env value and a module name that are shell code: the script carries them as
    literal words (bash parses it, and what it would export is the value itself)."""
    hostile = "$(touch /tmp/pwned); `id` 'x\" y"
    s = spec(
        tmp_path / "a dir",
        slurm={"env": {"X": hostile}, "modules": ["cuda/12.4; rm -rf ~"], "time": "00:10:00"},
        triton={"server": "/opt/triton server/bin/tritonserver"},
    )
    script = write_probe(s, Facts(partition="debug", partitions=[]), tmp_path / "a dir" / "probe", "abc123")
    text = script.read_text()
    check_script(script)  # bash parses it, shellcheck finds nothing (as for every rendered script)
    export = next(line for line in text.splitlines() if line.startswith("export X="))
    assert shlex.split(export) == ["export", f"X={hostile}"]
    module = next(line for line in text.splitlines() if line.startswith("module load"))
    assert shlex.split(module) == ["module", "load", "cuda/12.4; rm -rf ~"]
    step = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "/opt/triton server/bin/tritonserver" in shlex.split(step)
    assert "#SBATCH --time=02:00" in text and "#SBATCH -o /dev/null" in text
    # the probe runs its checks with the bundle the script carries, not files of the (maybe unshared) workdir
    out = subprocess.run(
        ["bash", "-c", f"awk '/<<.BUNDLE./{{f=1;next}}/^BUNDLE$/{{f=0}}f' {shlex.quote(str(script))} | base64 -d | tar -tzf -"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    shipped = sorted(
        f"python/{p.relative_to(SOURCE_ROOT)}" for name in SHIPPED_PACKAGES for p in (SOURCE_ROOT / name).rglob("*.py")
    )
    assert sorted(out) == ["node.py", *shipped]  # node.py, and the rank-side code render ships, to import
    assert "python/launcher/node/server.py" in shipped and "python/backend/models/preprocessing.py" in shipped


def test_probe_script_runs_the_container_wrapper(tmp_path):
    s = spec(tmp_path, container={"type": "apptainer", "image": "/img/triton.sif", "python": "python3.12"})
    script = write_probe(s, Facts(partition="gpu"), tmp_path / "probe", "n0nce")
    step = shlex.split(next(line for line in script.read_text().splitlines() if line.startswith("srun ")))
    assert step[3:8] == ["--mpi=pmix", "apptainer", "exec", "--nv", "-B"], "the ranks' srun --mpi, then the wrapper"
    assert "/tmp/hpc-serve-doctor-n0nce:/tmp/hpc-serve-doctor-n0nce" in step  # node.py's folder, mounted
    assert step[step.index("/img/triton.sif") + 1] == "python3.12"
    # node.py names that python as the report will, and imports the modules the CPU spec's python stubs load
    assert step[step.index("--python-label") + 1] == "python3.12 in the container"
    imports = [step[i + 1] for i, arg in enumerate(step) if arg == "--import"]
    assert imports == [
        "backend.models.preprocessing",
        "backend.models.postprocessing",
        "backend.models.bls",
        "backend.models.tensorrt_llm_cpu",
    ]
    case = next(line for line in script.read_text().splitlines() if line.startswith("case $step in "))
    codes = {int(n) for n in case.split()[3].rstrip(")").split("|")}  # node.py's exits: every sum of its bits
    assert {0, 2, 32, 34, 46} <= codes and not codes & {1, 16}


def test_verdicts_from_exit_bits_when_results_cannot_be_read(tmp_path):
    """A workdir the login node does not share: no results file, the job's exit code says it all."""
    s = spec(tmp_path, slurm={"gpus_per_node": 2})
    job = ProbeJob("7", state="FAILED", exit_code=1 | 4, node="node2")
    checks = {c.name: c for c in verdicts(s, job, tmp_path)}
    assert checks["probe job"].status == "ok"
    assert checks["shared workdir"].status == "fail"
    assert (
        "the job did not see the file written here; the job's file is not seen here" in checks["shared workdir"].detail
    )
    assert checks["tritonserver"].status == "ok" and "exit code" in checks["tritonserver"].detail
    assert checks["gpus"].status == "fail" and "not readable here" in checks["gpus"].detail
    assert checks["tensorrt_llm"].status == "skip"


def test_verdicts_from_results(tmp_path):
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text('{"version": "0.12.0", "pretrained_config": {}}')
    s = spec(
        tmp_path,
        slurm={"gpus_per_node": 1},
        model={"backend": "tensorrtllm", "engine_dir": str(engine), "tokenizer_dir": str(tmp_path)},
    )
    results = {
        "node": "gpu001",
        "tritonserver": {"ok": True, "detail": "/opt/tritonserver/bin/tritonserver (NGC default) starts"},
        "gpus": {"ok": True, "detail": "1 GPU(s) visible, 1 asked for"},
        "tensorrt_llm": {"ok": False, "detail": "tensorrt_llm 0.13.0, the engine was built with 0.12.0"},
    }
    job = ProbeJob("8", state="FAILED", exit_code=8, node="gpu001", results=results, saw_node_file=True)
    checks = {c.name: c for c in verdicts(s, job, tmp_path)}
    assert [checks[n].status for n in ("shared workdir", "tritonserver", "gpus", "tensorrt_llm")] == [
        "ok",
        "ok",
        "ok",
        "fail",
    ]
    assert "use an image with tensorrt_llm 0.12.0" in checks["tensorrt_llm"].fix
    step_failed = ProbeJob("9", state="FAILED", exit_code=16, node="gpu001", saw_node_file=True)
    assert [c.name for c in verdicts(s, step_failed, tmp_path)][-1] == "node step"
    cancelled = ProbeJob("10", state="CANCELLED", exit_code=0)
    assert [(c.name, c.status) for c in verdicts(s, cancelled, tmp_path)] == [("probe job", "fail")]


def test_report_rules():
    with pytest.raises(ValueError, match="without a fix"):
        Check("x", "fail", "broken")
    assert exit_code([ok("a", "fine"), Check("b", "warn", "meh", "do this")]) == 0
    assert exit_code([ok("a", "fine"), fail("b", "broken", "do that")]) == 1


def test_profile_values_only_what_passed(tmp_path):
    facts = Facts(
        partition="gpu",
        mpi=["pmix", "pmi2", "pmix_v4"],
        nodes=parse.sinfo_nodes("g1|gpu|idle|64|gpu:8|1000\ng2|gpu|mixed|64|gpu:4|1000\ng3|gpu|down|64|gpu:2|1000"),
        pyxis=True,
    )
    passed = [ok("partition", ""), ok("account/qos", ""), ok("container", "")]
    values, notes = profile_values(spec(tmp_path, slurm={"account": "proj1"}), facts, passed)
    assert values == {"slurm": {"partition": "gpu", "gpus_per_node": 4, "account": "proj1", "mpi": "pmix"}}
    assert notes == ["container runtimes here: pyxis (set container.type and container.image)"]
    s = spec(tmp_path, container={"type": "pyxis", "image": "nvcr.io#nvidia/tritonserver:24.08-trtllm-python-py3"})
    failed = [fail("partition", "no such", "fix"), ok("container", "")]
    values, _ = profile_values(s, facts, failed)
    assert "partition" not in values["slurm"]
    assert values["container"] == {"type": "pyxis", "image": "nvcr.io#nvidia/tritonserver:24.08-trtllm-python-py3"}


def test_node_checks_on_this_machine(tmp_path, tritonserver):
    """node.py as the probe runs it, here: tritonserver (resolved as the launcher does) starts; no nvidia-smi and
    no tensorrt_llm on this machine, so those fail with what is missing, and the exit code carries both bits."""
    import importlib.util
    import json
    import shutil as sh

    from hpc.doctor import node

    if sh.which("nvidia-smi") or importlib.util.find_spec("tensorrt_llm"):
        pytest.skip("this machine has GPUs or TensorRT-LLM")
    results = tmp_path / "node.json"
    rc = node.main([str(results), "--gpus", "2", "--trtllm", "0.12.0"])
    found = json.loads(results.read_text())
    assert rc == node.BITS["gpus"] | node.BITS["tensorrt_llm"], found
    assert found["python"]["ok"] and found["python"]["version"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert found["tritonserver"]["ok"] and found["tritonserver"]["detail"].startswith(tritonserver)
    assert not found["gpus"]["ok"] and "nvidia-smi" in found["gpus"]["detail"]
    assert found["tensorrt_llm"] == {
        "ok": False,
        "detail": f"tensorrt_llm is not installed for {sys.executable}",
        "version": None,
    }


def test_accounting_off_is_a_warning_with_the_fallback():
    from hpc.doctor.login import _accounting

    facts = Facts(config={"AccountingStorageType": "accounting_storage/none", "MinJobAge": "300 sec"})
    check = _accounting(facts)
    assert (check.status, check.detail) == ("warn", "off (AccountingStorageType=accounting_storage/none)")
    assert "squeue/scontrol, which forget a job 300 sec after it ends" in check.fix
    assert not facts.accounting


def test_time_and_partition_rules_from_facts(tmp_path):
    from hpc.doctor.login import _account_qos, _time

    facts = Facts(partitions=parse.scontrol_records(PARTITIONS), partition="gpu")
    long = spec(tmp_path, slurm={"time": "3-00:00:00", "account": "proj3"})
    check = _time(long, facts)
    assert check.status == "fail" and "3-00:00:00 is past gpu's MaxTime 2-00:00:00" in check.detail
    assert check.fix.startswith("set slurm.time to 2-00:00:00 or less, or use a partition that allows it: debug")
    assert _time(spec(tmp_path, slurm={"time": "2-00:00:00"}), facts).status == "ok"
    check = _account_qos(long, facts)  # the partition's AllowAccounts, before any sacctmgr
    assert (check.status, check.detail) == ("fail", "gpu allows account proj1,proj2, not proj3")
    assert check.fix == "set slurm.account to one of: proj1, proj2, or use another partition"


def test_gateway_job_partition_and_time_from_facts(tmp_path):
    """The gateway job (spec `gateway:`) gets its own partition and time checks; values it inherits from slurm:
    say so, and every fix names the gateway. field that overrides them."""
    from hpc.doctor.facts import judge_partition
    from hpc.doctor.gateway import gateway_checks

    short = "PartitionName=short AllowAccounts=ALL Default=NO MaxTime=00:05:00 State=UP TotalNodes=2\n"
    facts = Facts(partitions=parse.scontrol_records(PARTITIONS + short), partition="debug")
    serving, _ = judge_partition("partition", "slurm.partition", None, "the spec names none", facts)
    assert gateway_checks(spec(tmp_path), facts, serving) == []
    assert gateway_checks(spec(tmp_path, gateway={"enabled": False}), facts, serving) == []

    def found(gateway: dict, serving: Check = serving, **slurm) -> list[tuple[str, str, str]]:
        checks = gateway_checks(spec(tmp_path, gateway=gateway, slurm=slurm), facts, serving)
        return [(c.status, c.detail, c.fix) for c in checks]

    renew_hint = "; for a longer service add a renew: section (a successor job takes over)"
    assert found({"partition": "short", "time": "01:00:00"}) == [
        ("ok", "short: UP, 2 nodes", ""),
        (
            "fail",
            "gateway.time 01:00:00 is past short's MaxTime 00:05:00",
            "set gateway.time to 00:05:00 or less, or use a partition that allows it: debug" + renew_hint,
        ),
    ]
    facts.partition = "short"
    assert found({}, partition="short", time="00:04:00") == [
        ("ok", "short (slurm.partition's): UP, 2 nodes", ""),
        ("ok", "gateway.time 00:04:00 (slurm.time's) within short's MaxTime 00:05:00", ""),
    ]
    facts.partition = "debug"
    assert found({"partition": "nosuch"}) == [
        (
            "fail",
            "gateway.partition 'nosuch' does not exist",
            "set gateway.partition to one of: debug (default), gpu, short",
        ),
        ("skip", "needs the partition", ""),
    ]
    assert found({"partition": "gpu"})[0][:2] == ("fail", "gpu is DRAIN")
    ends_first = found({"time": "00:10:00"}, time="02:00:00")[1]
    assert ends_first[0] == "warn" and "ends before the serving job's slurm.time 02:00:00" in ends_first[1]
    assert ends_first[2].startswith("set gateway.time to 02:00:00 or more")
    # on the serving job's partition, which failed: its check says why; on another, it is checked on its own
    broken = fail("partition", "slurm.partition 'nosuch' does not exist", "set slurm.partition")
    assert [c[0] for c in found({}, broken, partition="nosuch")] == ["skip", "skip"]
    assert found({"partition": "debug"}, broken, partition="nosuch")[0] == ("ok", "debug: UP, 2 nodes", "")


def test_llmapi_node_checks_the_model_files_their_generation_and_the_checkpoint(tmp_path):
    """node.py's llmapi checks on folders shaped like an image's: model.py and helpers.py present, model.py's
    generation told by what it contains; a checkpoint with config.json and weights, or without."""
    import json

    from hpc.doctor import node

    files = tmp_path / "llmapi"
    files.mkdir()
    (files / "helpers.py").write_text("")
    (files / "model.py").write_text("from mpi4py.futures import MPICommExecutor\n")
    assert "1.0-1.2 model.py" in node.check_llmapi_files(str(files))["detail"]
    (files / "model.py").write_text("params['gpu_device_ids']\n")
    assert "2026 model.py" in node.check_llmapi_files(str(files))["detail"]
    (files / "helpers.py").unlink()
    assert node.check_llmapi_files(str(files)) == {"ok": False, "detail": f"{files} has no readable helpers.py"}
    hf = tmp_path / "hf"
    hf.mkdir()
    assert not node.check_checkpoint(str(hf))["ok"]
    (hf / "config.json").write_text("{}")
    assert "no *.safetensors" in node.check_checkpoint(str(hf))["detail"]
    (hf / "model.safetensors").write_text("")
    assert node.check_checkpoint(str(hf))["ok"]
    results = tmp_path / "node.json"
    rc = node.main([str(results), "--llmapi-files", str(files), "--checkpoint", str(tmp_path / "nope")])
    found = json.loads(results.read_text())
    assert rc & node.BITS["llmapi_files"] and rc & node.BITS["checkpoint"], found


@pytest.mark.parametrize(
    ("version", "engine", "llmapi"),
    [("0.12.0", True, False), ("1.0.0", True, True), ("1.2.1", True, True), ("1.3.0rc20", True, True)]
    + [("1.3.0rc21", False, True), ("1.3.0", False, True), ("1.10.0", False, True)],
)
def test_which_tensorrt_llm_versions_have_which_workflow(version, engine, llmapi):
    from hpc.doctor import node
    from launcher.contracts import trtllm_versions as tv
    from launcher.contracts.llmapi import WORKFLOWS

    last, first = tv.version_key(tv.LAST_ENGINE), tv.version_key(tv.FIRST_LLMAPI)
    assert (tv.version_key(version) <= last, tv.version_key(version) >= first) == (engine, llmapi)
    assert set(node.workflows_of(version)) == {w for w, has in (("engine", engine), ("llmapi", llmapi)) if has}
    assert set(tv.WORKFLOW_RELEASES) == set(WORKFLOWS)  # one entry per workflow


def test_probe_of_an_llmapi_spec_checks_the_checkpoint_and_the_images_model_files(tmp_path):
    from launcher.contracts.llmapi import IMAGE_MODEL_DIR

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "n_head": 2}')
    (hf / "model.safetensors").write_text("")
    (hf / "tokenizer.json").write_text("{}")
    model = {"backend": "tensorrtllm", "checkpoint_dir": str(hf), "model_files_from": IMAGE_MODEL_DIR}
    s = spec(tmp_path, slurm={"gpus_per_node": 1}, model=model)
    facts = Facts(partition="gpu")
    script = write_probe(s, facts, tmp_path / "probe", "n0nce").read_text()
    assert f"--checkpoint {hf}" in script and f"--llmapi-files {IMAGE_MODEL_DIR}" in script
    assert "--workflow llmapi" in script
    results = {
        "node": "gpu001",
        "tensorrt_llm": {"ok": False, "detail": "tensorrt_llm 0.12.0 predates the llmapi model (1.0.0)"},
        "checkpoint": {"ok": False, "detail": f"{hf}: PermissionError"},
        "llmapi_files": {"ok": True, "detail": f"{IMAGE_MODEL_DIR}: model.py and helpers.py, the 2026 model.py"},
    }
    job = ProbeJob("8", state="FAILED", exit_code=8 | 128, node="gpu001", results=results, saw_node_file=True)
    checks = {c.name: c for c in verdicts(s, job, tmp_path)}
    assert [checks[n].status for n in ("tensorrt_llm", "checkpoint", "llmapi_files")] == ["fail", "fail", "ok"]
    assert "1.0.0 or newer" in checks["tensorrt_llm"].fix and "container.mounts" in checks["checkpoint"].fix


def test_the_gpu_verdict_names_the_ranks_of_a_node_it_is_for(tmp_path):
    """tp × pp ranks over the nodes, rank r on GPU r % gpus_per_node: a node showing fewer GPUs fails with the
    ranks it must hold in the fix (the spec already refuses more ranks a node than gpus_per_node)."""
    s = spec(tmp_path, slurm={"gpus_per_node": 4}, model={**LLMAPI_MODEL, "tp_size": 2, "pp_size": 2})
    script = write_probe(s, Facts(partition="gpu"), tmp_path / "probe", "n0nce").read_text()
    assert "--gpus 4" in script and "--mpi pmix" in script
    results = {"gpus": {"ok": False, "detail": "2 GPU(s) visible, 4 asked for", "count": 2}}
    job = ProbeJob("8", state="FAILED", exit_code=4, node="gpu001", results=results, saw_node_file=True)
    (gpus,) = [c for c in verdicts(s, job, tmp_path) if c.name == "gpus"]
    assert gpus.status == "fail" and "the node's 4 ranks (tp_size 2 × pp_size 2" in gpus.fix, gpus.fix


def test_pmix_check_on_the_node_and_its_verdict(tmp_path, monkeypatch):
    """node.py says whether srun --mpi=pmix gave the step PMIx, and which GDS the site set (the ranks run with
    hash whatever it is). It has no exit bit: without readable results the verdict is a skip, never a pass."""
    from hpc.doctor import node

    monkeypatch.delenv("PMIX_RANK", raising=False)
    monkeypatch.delenv("PMIX_NAMESPACE", raising=False)
    monkeypatch.setenv("PMIX_MCA_gds", "ds21")
    missing = node.check_pmix("pmix")
    assert not missing["ok"] and "without PMIx" in missing["detail"] and "ds21" in missing["detail"]
    assert node.check_pmix("pmi2")["skip"]
    monkeypatch.setenv("PMIX_RANK", "0")
    monkeypatch.setenv("PMIX_NAMESPACE", "slurm.pmix.8.0")
    assert node.check_pmix("pmix_v4")["ok"] and "slurm.pmix.8.0" in node.check_pmix("pmix_v4")["detail"]
    s = spec(tmp_path)
    results = {"pmix": missing}
    job = ProbeJob("8", state="COMPLETED", exit_code=0, node="n1", results=results, saw_node_file=True)
    (pmix,) = [c for c in verdicts(s, job, tmp_path) if c.name == "pmix"]
    assert pmix.status == "fail" and "srun --mpi=list" in pmix.fix
    unread = ProbeJob("8", state="COMPLETED", exit_code=0, node="n1", results={}, saw_node_file=True)
    assert [c.status for c in verdicts(s, unread, tmp_path) if c.name == "pmix"] == ["skip"]


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ("1.2.1", "model.workflow llmapi or engine"),
        ("1.3.0", "model.workflow llmapi"),
        ("0.12.0", "model.workflow engine"),
    ],
)
def test_the_written_profile_says_which_workflow_the_images_tensorrt_llm_serves(tmp_path, version, says):
    """model.workflow is a spec's own (a profile cannot hold `model:`): the profile says it in its header."""
    image = "nvcr.io#nvidia/tritonserver:25.10-trtllm-python-py3"
    s = spec(tmp_path, container={"type": "pyxis", "image": image}, model=LLMAPI_MODEL, slurm={"gpus_per_node": 1})
    _, notes = profile_values(s, Facts(partition="gpu", trtllm_version=version), [])
    (note,) = [n for n in notes if "TensorRT-LLM" in n]
    assert f"the image {image} has TensorRT-LLM {version}: " in note and says in note, note
    assert note.endswith(says), "only the workflows it serves"


def test_test_only_asks_for_what_the_serving_script_asks_for(tmp_path):
    """doctor's `sbatch --test-only` passes the serving job's own #SBATCH options (hpc/render/sbatch.py), all but
    its name and files: doctor cannot approve an allocation that submit then asks for differently."""
    from hpc.render.jobfiles import render_scripts
    from hpc.render.sbatch import test_only_argv
    from launcher.contracts.config import STOP_LEAD_S
    from launcher.contracts.layout import SUB_NAME

    slurm = {"account": "acct", "partition": "cpu", "qos": "high", "mem": "8G", "exclusive": True}
    s = spec(tmp_path, slurm={**slurm, "cpus_per_task": 4, "sbatch_args": ["--mail-type=END"]}, requeue=True)
    script = render_scripts(s, tmp_path / "d")[SUB_NAME]
    asked = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]
    argv = test_only_argv(s)
    assert argv[:2] == ["sbatch", "--test-only"] and argv[-1] == "--wrap=true"
    assert " ".join(argv[2:-1]) == " ".join(a for a in asked if not a.startswith(("-J ", "-o ", "-e "))), asked
    assert {"--exclusive", "--requeue", "--nodes=1", "--mail-type=END", f"--signal=B:USR1@{STOP_LEAD_S}"} <= set(argv)


def test_the_probe_job_is_read_through_the_watcher(tmp_path, monkeypatch):
    """The probe is a job kind (hpc/jobs/kinds.py DoctorProbeJob): its state comes from the process's throttled
    watcher (one sacct per refresh), its exit code and node from one scontrol once it ended."""
    from hpc.doctor import probe
    from hpc.jobs.kinds import DoctorProbeJob
    from hpc.scheduler import slurm, watch
    from hpc.scheduler.index import JobRef
    from launcher.contracts.slurm import Result

    asked: list[str] = []
    states = iter(["PENDING", "RUNNING", "COMPLETED"])

    def cluster(argv, timeout, **_):
        asked.append(argv[0])
        if argv[0] == "sacct":
            return Result(0, f"5|{next(states)}\n", "")
        if argv[0] == "scontrol":
            return Result(0, "JobId=5 JobState=COMPLETED ExitCode=4:0 NodeList=n1\n", "")
        return Result(0, "", "")  # squeue: no longer listed

    gateway = slurm.Slurm(runner=cluster)
    monkeypatch.setattr(slurm, "default", gateway)
    monkeypatch.setattr(watch, "shared", watch.SlurmWatcher(gateway, min_delay_s=0.0))
    job = ProbeJob("5")
    assert probe._wait(job, DoctorProbeJob(JobRef("5", tmp_path / "probe")), timeout_s=60, poll_s=0) is None
    assert (job.state, job.exit_code, job.node) == ("COMPLETED", 4, "n1")
    assert asked.count("sacct") == 3 and asked.count("scontrol") == 1, asked
