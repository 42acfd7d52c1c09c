"""Site profiles (hpc/spec/site.py): where the profile is looked up, what the spec overrides, where every value
came from (`validate`, `render --explain`), errors at the profile's own lines, a rendered folder that needs no
profile, and `write_profile`. One spec rendered against the two example sites of configs/sites/ (golden files):
tests/test_configs.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpc.render import jobfiles as R
from hpc.spec import SpecError, load_spec, provenance
from hpc.spec.site import SITE_ENV, current_profile, explain, find_profile, write_profile

ROOT = Path(__file__).resolve().parent.parent


def write(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body).lstrip("\n"))
    return path


def cpu_spec(folder: Path, body: str = "") -> Path:
    """A CPU spec (its checkpoint folder exists) with `body` appended under its own keys."""
    (folder / "ckpt").mkdir(parents=True, exist_ok=True)
    text = "name: t\nmodel: {backend: cpu, workflow: engine, checkpoint_dir: ckpt}\n" + textwrap.dedent(body).lstrip(
        "\n"
    )
    (folder / "spec.yaml").write_text(text)
    return folder / "spec.yaml"


def cli(args: list[str], site_file: Path | str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), SITE_ENV: str(site_file)}
    return subprocess.run(
        [sys.executable, "-m", "hpc.cli.main", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )


# ----------------------------------------------------------------------------------------------- lookup
def test_lookup_order(tmp_path):
    home, system = tmp_path / "home", tmp_path / "etc" / "site.yaml"
    user = write(home / ".config/hpc-serve/site.yaml", "slurm: {partition: user}\n")
    write(system, "slurm: {partition: system}\n")
    named = tmp_path / "named.yaml"
    # $HPC_SERVE_SITE first, whether the file exists or not (a typo must not fall through to another profile)
    assert find_profile({SITE_ENV: str(named)}, home, system) == (named, "$HPC_SERVE_SITE")
    assert find_profile({SITE_ENV: ""}, home, system) == (None, "$HPC_SERVE_SITE")  # set but empty: none
    assert find_profile({}, home, system) == (user, str(user))
    user.unlink()
    assert find_profile({}, home, system) == (system, str(system))
    system.unlink()
    assert find_profile({}, home, system) == (None, "")


@pytest.mark.slow
def test_missing_site_file_is_an_error_naming_the_variable(tmp_path):
    spec = cpu_spec(tmp_path)
    result = cli(["validate", str(spec)], tmp_path / "nope.yaml", tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"{tmp_path / 'nope.yaml'}:1: cannot read the site profile named by $HPC_SERVE_SITE: No such file or "
        "directory; fix the path, or set HPC_SERVE_SITE= (empty) to use none\n"
    )


@pytest.mark.slow
def test_bad_profile_lists_every_problem_at_its_line(tmp_path):
    profile = write(
        tmp_path / "site.yaml",
        """
        # a comment line
        slurm:
          partiton: gpu
          time: 8h
          mpi: PMIx v4
        model: {backend: cpu}
        container:
          type: pyxis
          image: $HPC_TEST_SITE_UNSET/tritonserver.sqsh
        """,
    )
    result = cli(["validate", str(cpu_spec(tmp_path / "s"))], profile, tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"{profile}:3: slurm.partiton: unknown key 'partiton'; did you mean 'partition'?",
        f"{profile}:4: slurm.time: '8h' is not a Slurm time; use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
        f"{profile}:5: slurm.mpi: 'PMIx v4' is not a valid srun --mpi type (e.g. pmix, pmix_v4, pmi2; `srun --mpi=list`)",
        f"{profile}:6: model: `model` is the deployment's (what is served and its shape), not the site's; move it "
        "to the spec",
        f"{profile}:9: container.image: uses $HPC_TEST_SITE_UNSET, which is not set; export HPC_TEST_SITE_UNSET="
        "/some/path, or give it a default in the site profile: ${HPC_TEST_SITE_UNSET:-/some/path}",
    ]
    # every problem at once: the unset variable too, behind the schema's refusals; and alone, it is the one
    write(profile, "container:\n  type: pyxis\n  image: $HPC_TEST_SITE_UNSET/tritonserver.sqsh\n")
    result = cli(["validate", str(cpu_spec(tmp_path / "s"))], profile, tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"{profile}:3: container.image: uses $HPC_TEST_SITE_UNSET, which is not set; export HPC_TEST_SITE_UNSET="
        "/some/path, or give it a default in the site profile: ${HPC_TEST_SITE_UNSET:-/some/path}\n"
    )


def test_a_profile_value_that_does_not_fit_the_spec_is_located_in_the_profile(tmp_path):
    """Alone the profile is fine; merged, its gpus_per_node is too small for the spec's 2 ranks per node."""
    profile = write(tmp_path / "site.yaml", "slurm:\n  partition: gpu\n  gpus_per_node: 1\n")
    (tmp_path / "engine").mkdir()
    (tmp_path / "tok").mkdir()
    spec = write(
        tmp_path / "spec.yaml",
        """
        name: t
        slurm: {ntasks_per_node: 2}
        model: {engine_dir: engine, tokenizer_dir: tok, tp_size: 2}
        """,
    )
    with pytest.raises(SpecError) as caught:
        load_spec(spec, site=profile)
    assert [str(p) for p in caught.value.problems] == [
        f"{profile}:3: slurm.gpus_per_node: 2 ranks per node but slurm.gpus_per_node is 1: TensorRT-LLM runs one "
        "rank per GPU"
    ]


def test_a_problem_the_profile_causes_at_the_specs_line_names_the_profile(tmp_path):
    """The spec's tp_size is checked against the profile's gpus_per_node: the problem is at the spec's line (the
    check is the spec's) and says which of the profile's values took part."""
    profile = write(tmp_path / "site.yaml", "slurm:\n  partition: gpu\n  gpus_per_node: 8\n")
    (tmp_path / "engine").mkdir()
    (tmp_path / "tok").mkdir()
    spec = write(tmp_path / "spec.yaml", "name: t\nmodel: {engine_dir: engine, tokenizer_dir: tok, tp_size: 4}\n")
    with pytest.raises(SpecError) as caught:
        load_spec(spec, site=profile)
    assert [str(p) for p in caught.value.problems] == [
        f"{spec}:2: model.tp_size: tp_size 4 × pp_size 1 × replicas 1 = 4 ranks, but slurm.nodes 1 × ntasks_per_node "
        f"8 = 8 tasks; make them equal [with the site profile {profile}: slurm.gpus_per_node (line 3), "
        "slurm.partition (line 2)]"
    ]


# ----------------------------------------------------------------------------------------------- merging
PROFILE = """
slurm:
  partition: gpu
  account: site-account
  qos: normal
  modules: [cuda/12]
  env: {A: "1", B: "2"}
container:
  mounts: [data]
triton:
  server: /opt/tritonserver/bin/tritonserver
workdir: scratch/runs
"""


def test_precedence_spec_over_profile_over_defaults(tmp_path):
    profile = write(tmp_path / "site" / "site.yaml", PROFILE)
    (tmp_path / "site" / "data").mkdir()
    (tmp_path / "spec" / "mine").mkdir(parents=True)
    spec_file = cpu_spec(
        tmp_path / "spec",
        """
        slurm:
          account: my-account
          qos: null
          env: {B: "3"}
        container:
          mounts: [mine]
        """,
    )
    spec = load_spec(spec_file, site=profile)
    s = spec.slurm
    assert (s.partition, s.account, s.qos) == ("gpu", "my-account", None)  # profile; spec; spec's null
    assert s.modules == ["cuda/12"] and s.time == "01:00:00"  # the profile's list; the default
    assert s.env == {"A": "1", "B": "3"}  # mappings merge key by key
    assert spec.container.mounts == [f"{tmp_path / 'spec' / 'mine'}"]  # a list replaces; relative to the spec
    assert spec.triton.server == "/opt/tritonserver/bin/tritonserver" and spec.triton.triton_max_batch_size == 64
    assert spec.workdir == tmp_path / "site" / "scratch" / "runs"  # relative to the profile's folder
    plain = load_spec(spec_file, site=None)
    assert (plain.slurm.partition, plain.slurm.modules, plain.workdir) == (None, [], tmp_path / "spec" / "runs")
    # the profile's own list, when the spec has none, is resolved against the profile's folder too
    spec = load_spec(cpu_spec(tmp_path / "spec"), site=profile)
    assert spec.container.mounts == [f"{tmp_path / 'site' / 'data'}"]


@pytest.mark.slow
def test_explain_says_where_each_value_came_from(tmp_path):
    profile = write(tmp_path / "site" / "site.yaml", PROFILE)
    (tmp_path / "site" / "data").mkdir()
    spec_file = cpu_spec(tmp_path / "spec", "slurm:\n  account: my-account\n  env: {B: '3'}\n")
    validated = cli(["validate", str(spec_file)], profile, tmp_path)
    assert validated.returncode == 0, validated.stderr
    lines = [" ".join(line.split()) for line in validated.stdout.splitlines()]
    at = lines.index(f"site profile: {profile} (gave 7 values; --explain lists where every value came from)")
    assert lines[at + 1 :] == [  # validate: what the profile gave, and what the spec took over from it
        f"workdir profile {profile}:11 {tmp_path / 'site' / 'scratch' / 'runs'}",
        f"slurm.partition profile {profile}:2 gpu",
        f"slurm.account spec {spec_file}:4 (over profile {profile}:3) my-account",
        f"slurm.qos profile {profile}:4 normal",
        f'slurm.modules profile {profile}:5 ["cuda/12"]',
        f"slurm.env.A profile {profile}:6 1",
        f"slurm.env.B spec {spec_file}:5 (over profile {profile}:6) 3",
        f'container.mounts profile {profile}:8 ["{tmp_path / "site" / "data"}"]',
        f"triton.server profile {profile}:10 /opt/tritonserver/bin/tritonserver",
    ]
    rendered = cli(["render", str(spec_file), "-o", "deploy", "--explain"], profile, tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    lines = {" ".join(line.split()) for line in rendered.stdout.splitlines()}
    assert {  # --explain: every value
        f"name spec {spec_file}:1 t",
        f"workdir profile {profile}:11 {tmp_path / 'site' / 'scratch' / 'runs'}",
        "slurm.time default 01:00:00",
        f"model.backend spec {spec_file}:2 cpu",
        "triton.triton_max_batch_size default 64",
        f"slurm.account spec {spec_file}:4 (over profile {profile}:3) my-account",
    } <= lines
    spec = load_spec(spec_file, site=profile)
    assert len(explain(spec)) == len(explain(spec, everything=True)) > len(explain(spec, everything=False)) == 9


def test_opt_in_sections_give_defaults_only_to_a_spec_that_has_them(tmp_path):
    """A profile's `gateway:` (the site's service partition) never starts a gateway job for a spec without one."""
    profile = write(tmp_path / "site.yaml", "gateway:\n  partition: service\n  cpus: 4\n")
    assert load_spec(cpu_spec(tmp_path / "a"), site=profile).gateway is None
    spec = load_spec(cpu_spec(tmp_path / "b", "gateway: {cpus: 1}\n"), site=profile)
    assert spec.gateway is not None and (spec.gateway.partition, spec.gateway.cpus) == ("service", 1)
    write(profile, "gateway:\n  prot: 9000\n")  # checked alone, at its line, whatever the spec
    with pytest.raises(SpecError) as caught:
        load_spec(cpu_spec(tmp_path / "a"), site=profile)
    assert [str(p) for p in caught.value.problems] == [
        f"{profile}:2: gateway.prot: unknown key 'prot'; did you mean 'port'?"
    ]


def test_a_spec_naming_another_container_type_takes_none_of_the_profiles_container(tmp_path):
    profile = write(
        tmp_path / "site.yaml",
        "container:\n  type: pyxis\n  image: nvcr.io#nvidia/tritonserver:24.08\n  name: trt\n  mounts: [/]\n",
    )
    (tmp_path / "t.sif").write_text("")
    same = load_spec(cpu_spec(tmp_path / "a", "container: {type: pyxis, name: mine}\n"), site=profile).container
    assert (same.image, same.name, same.mounts) == ("nvcr.io#nvidia/tritonserver:24.08", "mine", ["/"])
    other = load_spec(
        cpu_spec(tmp_path / "b", f"container: {{type: apptainer, image: {tmp_path / 't.sif'}}}\n"), site=profile
    )
    assert (other.container.image, other.container.name, other.container.mounts) == (str(tmp_path / "t.sif"), None, [])
    assert provenance(other) is not None and provenance(other).given_by_profile() == []  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------------------- rendered
def test_the_rendered_folder_needs_no_profile(tmp_path):
    profile = write(tmp_path / "site.yaml", "slurm: {partition: gpu, account: acct, modules: [cuda/12]}\n")
    spec_file = cpu_spec(tmp_path / "spec")
    out = R.render(load_spec(spec_file, site=profile), tmp_path / "deploy")
    profile.unlink()  # the profile is gone; the folder has what it gave
    sub = out.sub.read_text()
    assert "#SBATCH -p gpu\n" in sub and "#SBATCH -A acct\n" in sub and "module load cuda/12\n" in sub
    assert f"# Site profile: {profile} (its values are written into this script" in sub
    recorded = (out.deploy_dir / "spec.yaml").read_text().splitlines()
    assert recorded[1:3] == [
        f"# site profile: {profile}",
        "#   gave: slurm.account, slurm.modules, slurm.partition",
    ]
    # loading the rendered spec.yaml under another profile merges nothing of it
    other = write(tmp_path / "other.yaml", "slurm: {partition: other, env: {X: '1'}}\n")
    again = load_spec(out.deploy_dir / "spec.yaml", site=other, check_files=False)
    assert (again.slurm.partition, again.slurm.env) == ("gpu", {})
    assert provenance(again) is not None and provenance(again).profile is None


@pytest.mark.slow
def test_submit_says_which_profile_it_used(tmp_path, tiny_gpt2, tritonserver, monkeypatch):
    """`submit` names the site profile on stderr (stdout stays `JOB FOLDER` for scripts): a real local job,
    cancelled at once."""
    from hpc.jobs.local import job_processes
    from tests.e2e import kill_quietly, processes_under

    monkeypatch.setenv("HPC_SERVE_HOME", str(tmp_path / "home"))
    profile = write(tmp_path / "site" / "site.yaml", "workdir: runs\nslurm: {env: {FROM_SITE: '1'}}\n")
    spec_file = write(
        tmp_path / "spec.yaml", f"name: t\nmodel: {{backend: cpu, workflow: engine, checkpoint_dir: {tiny_gpt2}}}\n"
    )
    proc = cli(["submit", str(spec_file), "--executor", "local"], profile, tmp_path)
    assert proc.returncode == 0, proc.stderr
    job, job_dir = proc.stdout.split()
    try:
        assert proc.stderr.splitlines()[0] == f"site profile: {profile} (gave 2 values)"
        assert Path(job_dir).is_relative_to(tmp_path / "site" / "runs")  # and it was used
    finally:
        cli(["cancel", job], profile, tmp_path)
        kill_quietly(job_processes(job))
        kill_quietly(pid for pid, _ in processes_under(Path(job_dir).parent.parent))


@pytest.mark.slow
def test_dry_run_says_which_profile_it_used(tmp_path, monkeypatch):
    """`submit --dry-run` names the profile on stderr as `submit` does (stdout stays the scripts), and the
    scripts hold its values; nothing is written."""
    monkeypatch.setenv("HPC_SERVE_HOME", str(tmp_path / "home"))
    profile = write(tmp_path / "site" / "site.yaml", "workdir: runs\nslurm: {env: {FROM_SITE: '1'}}\n")
    spec_file = cpu_spec(tmp_path / "spec")
    proc = cli(["submit", str(spec_file), "--dry-run"], profile, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == f"site profile: {profile} (gave 2 values)"
    assert "site profile:" not in proc.stdout and "FROM_SITE" in proc.stdout
    none = cli(["submit", str(spec_file), "--dry-run"], "", tmp_path)
    assert none.returncode == 0, none.stderr
    assert none.stderr.splitlines()[0] == f"site profile: none (${SITE_ENV} is set and empty)"
    assert not (tmp_path / "site" / "runs").exists() and not (tmp_path / "home").exists()


@pytest.mark.slow
def test_no_profile_says_where_it_looked(tmp_path, monkeypatch):
    import hpc.spec.site
    from hpc.spec.site import profile_summary

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(SITE_ENV)
    system = tmp_path / "etc" / "site.yaml"  # not the machine's /etc, which may hold one
    monkeypatch.setattr(hpc.spec.site, "SYSTEM_PROFILE", system)
    spec_file = cpu_spec(tmp_path / "spec")
    assert profile_summary(load_spec(spec_file), explained=True) == (
        f"site profile: none (${SITE_ENV} is unset; no {tmp_path}/home/.config/hpc-serve/site.yaml or {system})"
    )
    monkeypatch.setenv(SITE_ENV, "")
    assert profile_summary(load_spec(spec_file)) == f"site profile: none (${SITE_ENV} is set and empty)"
    out = R.render(load_spec(spec_file), tmp_path / "deploy")  # a rendered spec.yaml merges none, by design
    assert profile_summary(load_spec(out.deploy_dir / "spec.yaml", check_files=False)) == (
        "site profile: none (a rendered spec.yaml holds every value already; its header names the profile it "
        "was made with)"
    )


# ----------------------------------------------------------------------------------------------- write_profile
def test_write_profile_writes_a_checked_profile(tmp_path):
    values = {"slurm": {"partition": "gpu", "mpi": "pmi2", "gpus_per_node": 4}, "container": {"type": "none"}}
    path = write_profile(tmp_path / "conf" / "site.yaml", values, header="written by hpc-serve doctor on login1")
    text = path.read_text()
    assert text.startswith("# written by hpc-serve doctor on login1\n# hpc-serve site profile:")
    profile = current_profile(path)
    assert profile is not None and profile.data == values
    with pytest.raises(FileExistsError):
        write_profile(path, values)
    write_profile(path, {"slurm": {"partition": "other"}}, overwrite=True)
    assert current_profile(path).data == {"slurm": {"partition": "other"}}  # type: ignore[union-attr]


def test_write_profile_refuses_bad_values_and_writes_nothing(tmp_path):
    target = tmp_path / "site.yaml"
    with pytest.raises(SpecError) as caught:
        write_profile(target, {"slurm": {"partition": "gpu", "gpus_per_node": -1}, "replicas": 2})
    assert [str(p) for p in caught.value.problems] == [
        f"{target}:8: slurm.gpus_per_node: Input should be greater than or equal to 0",
        f"{target}:9: replicas: `replicas` is the deployment's (what is served and its shape), not the site's; "
        "move it to the spec",
    ]
    assert not target.exists() and not list(tmp_path.iterdir())
