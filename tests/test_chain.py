"""A search, then training with its plan, as one submission (issue 65, point 4):
``mode=train mode.plan=<search run dir> launcher.after=<search run dir>`` on SLURM waits in the
queue for the search (``--dependency=afterok``) and trains with the plan it wrote; a failed
search ends the waiting job with the search's reason; ``xlaunch runs`` shows the chain."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from launcher.cli.jobs import JOB_FILE
from launcher.errors import ModelError, UserError
from launcher.sharding.user.api import FORMAT, VERSION, AutoPlan
from launcher.models.plans import BUILTINS, load_plan
from tests.launch import read_result, run_cli

SLURM = ("cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1")
# The quickest real search of a built-in model: the ILP on 2 devices, dp its one baseline.
SEARCH = ("mode=search", "mode.algorithm=ilp", "model=gpt-tiny", "mode.mesh_shape=[2]", "mode.iterations=2",
          "mode.run_repeats=1", "mode.baselines=[dp]", "mode.price_race=false")
TRAIN = ("mode=train", "model=gpt-tiny", "mode.steps=4", "mode.warmup_steps=1")


def a_submitted_run(path, job_id="4242", backend="slurm"):
    """A run dir as a submission leaves it (its job record), for the checks before submission."""
    path.mkdir(parents=True)
    (path / JOB_FILE).write_text(json.dumps({"job_id": job_id, "backend": backend, "run_dir": str(path)}) + "\n")
    return path


def test_a_search_run_dir_is_a_plan_for_mode_train_and_for_autoplan(tmp_path):
    run = tmp_path / "search"
    run.mkdir()
    with pytest.raises(ModelError, match=r"the run dir holds no plan.json .*xlaunch status"):
        load_plan(str(run))
    (run / "plan.json").write_text(json.dumps(BUILTINS["dp_tp"].to_dict()))
    assert load_plan(str(run)).to_dict() == BUILTINS["dp_tp"].to_dict()
    with pytest.raises(UserError, match=r"plan.json: no such plan file; .*or that search's run dir once it has ended"):
        AutoPlan.load(tmp_path)
    # AutoPlan.load reads a run dir's plan.json (here a built-in model's: refused for what it is)...
    with pytest.raises(UserError, match=r"search/plan.json is not an auto-sharding plan"):
        AutoPlan.load(run)
    # ... and mode=train's plans refuse a user's step's plan for what it is.
    user = tmp_path / "user-search"
    user.mkdir()
    (user / "plan.json").write_text(json.dumps({"format": FORMAT, "version": VERSION, "mesh_shape": [2]}))
    with pytest.raises(ModelError, match=r"a plan for a user's step .* apply it in that program "
                                         r"\(launcher.AutoPlan.load\(path\), its run dir too\)"):
        load_plan(str(user))


def test_after_puts_slurms_dependency_into_the_script(tmp_path):
    search = a_submitted_run(tmp_path / "search")
    run_cli(*TRAIN, *SLURM, f"mode.plan={search}", f"launcher.after={search}", "launcher.dry_run=true",
            run_dir=tmp_path / "train")
    script = (tmp_path / "train" / "submission.sh").read_text()
    assert "#SBATCH --dependency=afterok:4242\n" in script and "#SBATCH --kill-on-invalid-dep=yes\n" in script
    run_cli(*TRAIN, *SLURM, "launcher.after=4243", "launcher.dry_run=true", run_dir=tmp_path / "by-id")
    assert "#SBATCH --dependency=afterok:4243\n" in (tmp_path / "by-id" / "submission.sh").read_text()


def test_after_and_a_run_dir_plan_refuse_what_cannot_work(tmp_path):
    search = a_submitted_run(tmp_path / "search")
    # Without launcher.after the plan must be there already.
    r = run_cli(*TRAIN, *SLURM, f"mode.plan={search}", "launcher.dry_run=true", run_dir=tmp_path / "a", check=False)
    assert r.returncode == 2 and f"mode.plan={search}: the run dir holds no plan.json (its search has not ended, " \
                                  f"or failed: xlaunch status; or wait for it with launcher.after={search})" in r.stderr
    # Only a scheduler that holds jobs can wait for one.
    r = run_cli(*TRAIN, "cluster=local", f"launcher.after={search}", "launcher.dry_run=true", run_dir=tmp_path / "b",
                check=False)
    assert r.returncode == 2 and "launcher.after=" in r.stderr and "cannot hold a job until another has ended " \
                                                                    "(SLURM can: cluster=slurm, lumi)" in r.stderr
    # A run dir with nothing submitted, or another scheduler's job, is no job to wait for.
    r = run_cli(*TRAIN, *SLURM, f"launcher.after={tmp_path}", "launcher.dry_run=true", run_dir=tmp_path / "c",
                check=False)
    assert r.returncode == 2 and f"{tmp_path}: not a run dir (no {JOB_FILE})" in r.stderr, r.stderr
    local = a_submitted_run(tmp_path / "local-run", backend="local")
    r = run_cli(*TRAIN, *SLURM, f"launcher.after={local}", "launcher.dry_run=true", run_dir=tmp_path / "d",
                check=False)
    assert r.returncode == 2 and "job 4242 ran on local, not on slurm" in r.stderr, r.stderr


@pytest.mark.heavy
@pytest.mark.timeout(900)
def test_a_search_then_training_with_its_plan_as_one_submission_on_slurm(slurm, tmp_path):
    search, train = tmp_path / "search", tmp_path / "train"
    run_cli(*SEARCH, *SLURM, "launcher.wait=false", run_dir=search, env=slurm.env, timeout=120)
    # Submitted at once, held by SLURM until the search has ended well.
    run_cli(*TRAIN, *SLURM, f"mode.plan={search}", f"launcher.after={search}", run_dir=train, env=slurm.env,
            timeout=800)
    searched, trained = read_result(search), read_result(train)
    plan = json.loads((search / "plan.json").read_text())
    assert trained["plan"]["name"] == plan["name"] and searched["answer"]["name"] in (plan["name"], "dp")
    assert len(trained["losses"]) == 4
    first = json.loads((search / JOB_FILE).read_text())
    assert json.loads((train / JOB_FILE).read_text())["after"] == {"job_id": first["job_id"], "run_dir": str(search)}
    # The chain in `xlaunch runs`, run where both run dirs lie.
    outputs = tmp_path / "outputs" / "day"
    outputs.mkdir(parents=True)
    for d in (search, train):
        shutil.copytree(d, outputs / d.name, symlinks=True)
    runs = run_cli("runs", cwd=tmp_path, env=slurm.env).stdout
    assert re.search(rf"^\S+ \S+ +outputs/day/train +train +slurm +\d+ after {first['job_id']} +done", runs, re.M), runs


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_a_failed_search_ends_the_job_waiting_for_it_with_its_reason(slurm, tmp_path):
    search, train = tmp_path / "search", tmp_path / "train"
    run_cli(*SEARCH, *SLURM, "launcher.fault=crash:0", "launcher.wait=false", run_dir=search, env=slurm.env,
            timeout=120)
    r = run_cli(*TRAIN, *SLURM, f"mode.plan={search}", f"launcher.after={search}", "launcher.progress_every_s=1",
                run_dir=train, env=slurm.env, timeout=500, check=False)
    assert r.returncode == 1, r.stderr
    first = json.loads((search / JOB_FILE).read_text())["job_id"]
    assert f"waits in the queue for job {first} to end well (launcher.after)" in r.stderr, r.stderr
    assert re.search(r"job \d+ did not run: the job it was to run after \(launcher.after=\S+\) did not end well: "
                     r"job \d+ \(\S+\) failed: .*injected crash", r.stderr), r.stderr
    assert not (train / "result.json").exists()
