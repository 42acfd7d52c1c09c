"""One GPU per rank: the mapping for each Slurm style (launcher/contracts/gpu.py), the auto policy (hpc/render/gpu_binding.py), and
the rendered side that must agree with it (launch.json `gpu_binding`, tensorrt_llm `gpu_device_ids` / `num_nodes`).
The device proof (two real ranks on two GPUs) is scripts/gpu/prove_gpu_binding.sh."""

from __future__ import annotations

import json

import pytest

from hpc.render import jobfiles as R
from hpc.render.deployment_plan import plan_deployment
from hpc.render.gpu_binding import bound_parameters, decide, describe, gpu_decision
from hpc.spec import SpecError
from launcher.contracts.gpu import NONE, PER_RANK, GpuBindingError, node_gpu_count, rank_gpus
from launcher.contracts.plan import LaunchPlan, PlanError
from launcher.contracts.rank import RankInfo, Role
from launcher.node.server import ServerBinary
from launcher.node.server_env import child_env
from tests.test_render import cpu_spec, gpu_spec


# ----------------------------------------------------------------------------------------------- the mapping
def test_gpus_per_task_is_kept_as_slurm_narrowed_it():
    env = {"CUDA_VISIBLE_DEVICES": "3", "SLURM_LOCALID": "1", "SLURM_GPUS_PER_TASK": "1"}
    got = rank_gpus(env, PER_RANK, 1)
    assert (got.visible, got.style) == (None, "per-task")
    assert got.apply(dict(env)) == env  # nothing changed


def test_gpus_per_task_of_several_takes_the_tasks_first():
    got = rank_gpus({"CUDA_VISIBLE_DEVICES": "4,5", "SLURM_GPUS_PER_TASK": "2"}, PER_RANK, 1)
    assert (got.visible, got.style) == ("4", "per-task")


@pytest.mark.parametrize(
    ("visible", "local", "want"),
    [
        ("0,1,2,3", 2, "2"),
        ("2,3", 1, "3"),  # a step sharing the node (hpc/spec/placement.py --gres=gpu:2): entries, not ordinals
        ("GPU-aaa,GPU-bbb", 0, "GPU-aaa"),
    ],
)
def test_gres_per_node_picks_the_local_rank_through_the_visible_list(visible, local, want):
    got = rank_gpus({"CUDA_VISIBLE_DEVICES": visible}, PER_RANK, local)
    assert (got.visible, got.style) == (want, "per-node")
    env = got.apply({"CUDA_VISIBLE_DEVICES": visible, "PATH": "/bin"})
    assert env == {"CUDA_VISIBLE_DEVICES": want, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PATH": "/bin"}


def test_step_gpus_when_cuda_visible_devices_is_unset():
    assert rank_gpus({"SLURM_STEP_GPUS": "1,3"}, PER_RANK, 1).visible == "3"


def test_the_nodes_gpus_when_nothing_names_them():
    # a local mpirun on a GPU box: without this every rank would see all GPUs and use the first
    assert rank_gpus({}, PER_RANK, 1, node_gpus=2).visible == "1"
    assert rank_gpus({"CUDA_VISIBLE_DEVICES": "3,4"}, PER_RANK, 1, node_gpus=8).visible == "4"  # Slurm's list wins


def test_node_gpu_count_reads_the_drivers_folder(tmp_path):
    for bus in ("0000:06:00.0", "0000:07:00.0"):
        (tmp_path / bus).mkdir()
    assert node_gpu_count(str(tmp_path)) == 2
    assert node_gpu_count(str(tmp_path / "absent")) == 0


def test_a_site_device_order_is_kept():
    env = rank_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, PER_RANK, 0).apply({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


@pytest.mark.parametrize("env", [{}, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, {"CUDA_VISIBLE_DEVICES": ""}])
def test_no_gpus_leaves_the_environment(env):
    got = rank_gpus(env, PER_RANK, 0)
    assert (got.visible, got.style) == (None, "none")
    assert got.apply(dict(env)) == env


def test_binding_off_leaves_every_gpu_visible():
    got = rank_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, NONE, 1)
    assert (got.visible, got.style) == (None, "off")


def test_more_ranks_than_gpus_on_a_node_is_refused_with_the_fix():
    with pytest.raises(GpuBindingError, match=r"node-local rank 2 sees only 2 GPUs.*slurm.gpus_per_node"):
        rank_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, PER_RANK, 2)


def test_the_launcher_gives_tritonserver_the_ranks_gpu(tmp_path):
    plan = LaunchPlan(
        deployment_dir=tmp_path, model_repository="m", replicas=2, world_size_per_replica=1, gpu_binding=PER_RANK
    )
    info = RankInfo(rank=1, local_rank=1, world_size=2, node="n", job_id="7", source="slurm")
    env = child_env(plan, ServerBinary("tritonserver"), {"CUDA_VISIBLE_DEVICES": "0,1"}, info, Role(1, 0, True))
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_launch_json_gpu_binding_is_checked(tmp_path):
    plan = {"version": 1, "model_repository": "m", "replicas": 1, "world_size_per_replica": 1, "gpu_binding": "auto"}
    (tmp_path / "launch.json").write_text(json.dumps(plan))
    with pytest.raises(PlanError, match="gpu_binding must be one of per-rank, none, got 'auto'"):
        LaunchPlan.read(tmp_path)


# ----------------------------------------------------------------------------------------------- the policy
def test_auto_binds_when_no_two_ranks_of_a_replica_share_a_node():
    assert decide("auto", 8, 1, 8).binding == PER_RANK  # tp 1 replicas
    assert decide("auto", 1, 4, 1).binding == PER_RANK  # tp 4 over 4 nodes of one GPU each


def test_auto_keeps_the_node_visible_for_peers_on_one_node():
    decision = decide("auto", 8, 2, 8)
    assert decision.binding == NONE and "all-reduce" in decision.why


def test_no_gpus_or_orchestrator_or_none_never_bind():
    assert decide("auto", 0, 1, 4).binding == NONE
    assert decide("per-rank", 8, 1, 8, orchestrator=True).binding == NONE
    assert decide("none", 8, 1, 8).binding == NONE


def test_forced_per_rank_with_peers_on_a_node_warns():
    decision = decide("per-rank", 8, 2, 8)
    assert decision.binding == PER_RANK and "WARNING" in decision.why


def test_bound_parameters_make_tensorrt_llm_agree():
    assert bound_parameters(4) == {"gpu_device_ids": "0", "num_nodes": "4"}
    assert decide("per-rank", 2, 4, 1).parameters == bound_parameters(4)
    assert decide("auto", 8, 2, 8).parameters == decide("none", 8, 1, 1).parameters == {}


# ----------------------------------------------------------------------------------------------- rendered
def test_tp1_replicas_render_per_rank_and_the_tensorrt_llm_parameters(tmp_path):
    spec = gpu_spec(tmp_path, tp=1, replicas=2, slurm={"gpus_per_node": 2})
    assert gpu_decision(spec).binding == PER_RANK
    assert "GPU binding: per-rank" in describe(spec)
    R.render(spec, tmp_path / "d")
    assert json.loads((tmp_path / "d" / "launch.json").read_text())["gpu_binding"] == PER_RANK
    pbtxt = (tmp_path / "d" / "triton_model_repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'key: "gpu_device_ids"\n  value: {\n    string_value: "0"' in pbtxt
    assert 'key: "num_nodes"\n  value: {\n    string_value: "1"' in pbtxt


def test_tp2_on_one_node_renders_no_binding(tmp_path):
    spec = gpu_spec(tmp_path, tp=2)
    assert gpu_decision(spec).binding == NONE
    assert "gpu_device_ids" not in R.repository_parameters(plan_deployment(spec, tmp_path / "d"))


def test_cpu_backend_never_binds(tmp_path):
    assert gpu_decision(cpu_spec(tmp_path, slurm={"gpu_binding": "per-rank"})).binding == NONE


def test_spec_names_the_field_of_a_wrong_policy(tmp_path):
    with pytest.raises(SpecError, match="gpu_binding"):
        cpu_spec(tmp_path, slurm={"gpu_binding": "each"})
