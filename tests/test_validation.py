"""Every check that can run before submission does: bad input exits 2 with one line naming the key
and the fix, and nothing is submitted (no job.json); good configs still compose."""

import pytest
import yaml

from tests.launch import REPO, run_cli
from hydra import compose, initialize_config_dir
from launcher.cli import schema
from launcher.errors import BAD_INPUT
from omegaconf import OmegaConf
from launcher.sharding.algorithms.ilp import IlpOptions
from launcher.sharding.options import ProfileOptions, SearchOptions
from launcher.modes import MODES as REGISTRY, find
from launcher.cli.schema import mode_codes

CLUSTERS = sorted(p.stem for p in (REPO / "conf" / "cluster").glob("*.yaml"))
MODES = sorted(p.stem for p in (REPO / "conf" / "mode").glob("*.yaml"))


@pytest.mark.parametrize("overrides, key", [
    (["cluster=local", "cluster.partition=x"], "cluster.partition"),
    (["cluster=local", "+cluster.partition=x"], "cluster.partition"),
    (["cluster=local", "cluster.srun_args=[--label]"], "cluster.srun_args"),
    (["cluster=mpi-local", "cluster.account=p"], "cluster.account"),
    (["cluster=slurm", "cluster.tpu_name=p"], "cluster.tpu_name"),
    (["cluster=local", "cluster.mpirun_args=[-v]"], "cluster.mpirun_args"),
    (["+foo=1"], "foo"),
    (["mode=check", "+mode.foo=1"], "mode.foo"),
    (["mode=hlo_replay"], "mode.hlo_file"),
    (["mode=hlo_replay", "mode.hlo_file=/nonexistent/*.txt"], "mode.hlo_file"),
    (["mode=train", "mode.plan=nosuch"], "mode.plan"),
    (["mode=train", "mode.plan=/nonexistent/plan.json"], "mode.plan"),
    (["mode=train", "mode.steps=3", "mode.warmup_steps=3"], "mode.warmup_steps"),
    (["mode=analysis", "mode.mesh_shape=[3,3]"], "mode.mesh_shape"),
    (["mode=search", "mode.mesh_shape=[0,8]"], "mode.mesh_shape"),
    (["mode=cfp", "mode.mesh_shape=[4,4]"], "mode.mesh_shape=[4, 4] has 16 devices but the job has 8"),
    (["mode=cfp", "mode.mesh_shape=autom"], "mode.mesh_shape=autom"),
    (["mode=analysis", "mode.mesh_shape=auto"], "mode=analysis analyses one mesh"),
    (["mode=profile", "mode.hlo_file=x.txt"], "mode.hlo_file"),
    (["mode=search", "mode.baselines=[dp,zero9]"], "mode.baselines"),
    (["mode=check", "mode.steps=3"], "mode.steps"),
    (["mode=check", "mode.repeats=zero"], "mode.repeats"),
    (["mode=train", "model.heads=7"], "model.heads=7 does not divide model.hidden=64"),
])
def test_bad_input_exits_2_with_one_line_and_submits_nothing(tmp_path, overrides, key):
    _refused(tmp_path / "run", overrides, key, dry_run="false")


# A dry run is checked as a submission is: launch() (cli/submit.py) returns for one where it would
# submit, after every check above. So one case of each kind of check keeps it so, not every case
# twice: a key no schema has, a value a schema's validation refuses, a file a mode looks for.
@pytest.mark.parametrize("overrides, key", [
    (["+foo=1"], "foo"),
    (["mode=cfp", "mode.mesh_shape=[4,4]"], "mode.mesh_shape=[4, 4] has 16 devices but the job has 8"),
    (["mode=train", "mode.plan=/nonexistent/plan.json"], "mode.plan"),
])
def test_a_dry_run_refuses_bad_input_as_a_submission_does(tmp_path, overrides, key):
    _refused(tmp_path / "run", overrides, key, dry_run="true")


def _refused(run, overrides, key, dry_run):
    proc = run_cli(*overrides, f"launcher.dry_run={dry_run}", run_dir=run, check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], proc.stderr
    assert not (run / "job.json").exists() and not (run / "submitit").exists()


@pytest.mark.parametrize("overrides, message", [
    (["model.batch_size=-1"], "model.batch_size=-1: must be at least 1"),
    (["model=bert-tiny", "model.mask_prob=0"], "model.mask_prob=0.0: must be in (0, 1]"),
    (["model=llama2-tiny", "model.heads=64"], "model.hidden/model.heads = 1: rotary embeddings"),
    (["model=moe-tiny", "model.expert_group_size=7"], "model.expert_group_size=7 does not divide the 256 tokens"),
    (["model=cfp-moe-tiny", "model.gating=top3"], "model.gating='top3'"),
    # A built-in plan over the job's 8 devices, where the config tells both.
    (["mode=train", "model.batch_size=12"],
     "model.batch_size=12 cannot be split over mesh axis 'data' (size 8) of plan dp on 8 devices"),
    (["mode=train", "mode.plan=dp_tp", "model.batch_size=6"], "mesh axis 'data' (size 4) of plan dp_tp"),
    (["mode=train", "model=moe-tiny", "mode.plan=ep", "model.num_experts=6"], "model.num_experts=6 cannot be split"),
    (["mode=train", "mode.plan=dp_tp", "+mode.mesh_axes.model=3"], "'model'=3 need a device count divisible by 3"),
    # Allowed: a plan that splits no batch, the search's baselines (skipped with a note), and
    # devices the config does not tell.
    (["mode=train", "mode.plan=tp", "model.batch_size=3"], None),
    (["mode=search", "model.batch_size=12"], None),
    (["mode=train", "model.batch_size=12", "cluster=tpu", "cluster.tpu_name=pod"], None),
])
def test_model_fields_that_cannot_work_are_refused_at_composition(overrides, message):

    schema.register()
    with initialize_config_dir(config_dir=str(schema.CONF_DIR), version_base="1.3"):
        cfg = schema.typed(compose("config", overrides=overrides))
    if message is None:
        schema.validate(cfg)
        return
    with pytest.raises(BAD_INPUT) as e:
        schema.validate(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_key_of_another_backend_is_named_with_its_backend(tmp_path):
    proc = run_cli("cluster=local", "cluster.partition=x", run_dir=tmp_path / "run", check=False, timeout=60)
    assert "cluster.partition: cluster=local (backend local) has no such key" in proc.stderr
    assert "backend slurm (cluster=lumi|slurm)" in proc.stderr


def test_a_misspelt_option_lists_only_real_options(tmp_path):
    proc = run_cli("mode=serch", run_dir=tmp_path / "run", check=False, timeout=60)
    assert proc.returncode == 2
    assert "_schema" not in proc.stderr and "schema_" not in proc.stderr
    assert "choose one of analysis, cfp, check, hlo_replay, profile, run, search, train" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_help_lists_every_option_and_no_schema():
    out = run_cli("--help", timeout=60).stdout
    groups = dict(line.split(": ", 1) for line in out.split("== Config ==")[0].splitlines() if ": " in line)
    assert groups["mode"].split(", ") == MODES and groups["cluster"].split(", ") == CLUSTERS
    assert "schema" not in " ".join(groups) and "_schema" not in groups["mode"]


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_every_cluster_composes(cluster):
    cfg = yaml.safe_load(run_cli("--cfg", "job", f"cluster={cluster}", timeout=60).stdout)
    assert cfg["cluster"]["name"] == cluster


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_composes(mode):
    cfg = yaml.safe_load(run_cli("--cfg", "job", f"mode={mode}", timeout=60).stdout)
    assert cfg["mode"]["name"] == mode
    assert cfg["mode"].get("code", mode) == ("search" if mode == "cfp" else mode)  # cfp: a preset of mode=search


def test_every_mode_is_one_entry_of_the_table_and_its_options_have_one_default():
    """launcher/modes/__init__.py: MODES is what the schemas and the task read; every option of
    conf/mode runs one of its entries (a Config without ``code``, not over ModeConfig, is found by its
    name). The CFP modes' defaults are their option objects'."""

    assert set(mode_codes().values()) == set(REGISTRY) and set(mode_codes()) == {*REGISTRY, "cfp"}
    for code, mode in REGISTRY.items():
        assert getattr(mode.config, "code", code) == mode.config.name == code
        assert find({"name": "anything", "code": code}) is mode and find({"name": code}) is mode
        assert callable(mode.load())  # the run its entry names exists
    search = OmegaConf.structured(REGISTRY["search"].config)
    assert ProfileOptions.of(OmegaConf.structured(REGISTRY["profile"].config)) == ProfileOptions()
    assert SearchOptions.of(search, seed=0) == SearchOptions()
    assert IlpOptions.of(search, time_limit_s=search.ilp_time_limit_s) == IlpOptions()


def test_good_configs_pass_the_checks(tmp_path):
    """Each good config's dry run passes the checks and writes what it would run: the resolved
    config with the overrides in it, and the submission (the local tasks' command, or the sbatch
    script: SLURM's partition, LUMI's GPUs, CPU binding and container), named on its last line."""
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    hlo = tmp_path / "m.txt"
    hlo.write_text("HloModule m")
    cases = [
        (["mode=analysis", "mode.mesh_shape=[2,4]"], {"mode.mesh_shape": [2, 4]},
         "submission.txt", ["SUBMITIT_LOCAL_NTASKS=2 ", "-m submitit.local._local "]),
        (["mode=train", f"mode.plan={plan}"], {"mode.plan": str(plan)},
         "submission.txt", ["SUBMITIT_LOCAL_NTASKS=2 "]),
        (["mode=hlo_replay", f"mode.hlo_file={tmp_path}/*.txt"], {"mode.hlo_file": f"{tmp_path}/*.txt"},
         "submission.txt", ["SUBMITIT_LOCAL_NTASKS=2 "]),
        (["cluster=slurm", "cluster.partition=x", "mode=check"], {"cluster.partition": "x", "mode.name": "check"},
         "submission.sh", ["#SBATCH --partition=x\n", "#SBATCH --job-name=xlaunch-check\n", "srun --unbuffered "]),
        (["cluster=lumi", "mode=search", "mode.mesh_shape=[2,4]"], {"cluster.name": "lumi", "mode.mesh_shape": [2, 4]},
         "submission.sh", ["#SBATCH --partition=standard-g\n", "#SBATCH --gpus-per-node=8\n",
                           "#SBATCH --ntasks-per-node=8\n", "--cpu-bind=mask_cpu:", "singularity exec ",
                           "--bind=/var/spool/slurmd ", ".sif bash -c ", "-m submitit.core._submit "]),
    ]
    for i, (overrides, values, name, lines) in enumerate(cases):
        run_dir = tmp_path / f"run{i}"
        proc = run_cli(*overrides, "launcher.dry_run=true", run_dir=run_dir, timeout=60)
        resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
        for key, value in values.items():
            section, field = key.split(".")
            assert resolved[section][field] == value, (overrides, key, resolved[section].get(field))
        submission = run_dir / name
        # The script on stdout, as saved; where it went on stderr (so that stdout pipes the script alone).
        assert proc.stderr.rstrip().endswith(f"# dry run: nothing submitted; saved to {submission}"), proc.stderr
        text = submission.read_text()
        assert text.strip() in proc.stdout, (overrides, proc.stdout)
        for line in lines:
            assert line in text, (overrides, line, text)
