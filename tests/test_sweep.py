"""A sweep at a glance (issue 47): `-m` ends with one table of its points, a chart and a CSV;
`xlaunch sweep` prints it again from any shell, also while a sweep not waited on runs; Hydra's
Optuna sweeper optimizes a point's headline figure, failed points reported as failed; bad input
refused before the first job. Real jobs on the embedded default (cluster=local)."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.launch import REPO, read_result, run_cli

# Not in the core suite (which CI runs again on the oldest JAX): what is tested here asks nothing
# of JAX, and its jobs (mode=check, mode=run) are the core suite's own on every JAX.

CHECK = ("mode=check", "cluster.cpu_devices_per_task=2", "mode.allgather_mb=0.25")


def table_rows(text: str) -> dict[str, list[str]]:
    """The table's rows by point number: its cells (split on two spaces or more)."""
    lines = text[text.index("\n#  ") + 1:].splitlines()
    return {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[1:])
            if cells[0].isdigit()}


@pytest.fixture(scope="module")
def check_sweep(tmp_path_factory):
    """The issue's sweep: `-m mode=check cluster.tasks_per_node=1,2`, waited on."""
    sweep = tmp_path_factory.mktemp("sweep") / "check"
    proc = run_cli("-m", *CHECK, "cluster.tasks_per_node=1,2", f"hydra.sweep.dir={sweep}")
    return sweep, proc


def test_a_sweep_ends_with_a_table_of_its_points_and_a_chart(check_sweep, tmp_path):
    sweep, proc = check_sweep
    out = proc.stdout[proc.stdout.index(f"sweep {sweep}: 2 point(s) (2 done)"):]
    assert "objective bandwidth (higher is better)" in out.splitlines()[0]
    header = out.splitlines()[1].split()
    assert header[:4] == ["#", "cluster.tasks_per_node", "bandwidth", "(GB/s)"] and header[-3:] == ["run", "dir", "state"]
    results = {n: read_result(sweep / f"{n}-check-local") for n in (0, 1)}
    rows = table_rows(out)
    held = {}
    for n, tasks in ((0, "1"), (1, "2")):  # each point: its override, its bandwidth, its cost, its run dir, done
        row = rows[str(n)]
        assert row[:3] + row[4:] == [str(n), tasks, f"{results[n]['allgather_gbps']:.4g}", f"{n}-check-local", "done"]
        # What it cost: one node (cluster=local) for the time its allocation was held.
        held[n] = json.loads(run_cli("status", "--json", str(sweep / f"{n}-check-local")).stdout)["time"]["held_s"]
        assert float(row[3]) == pytest.approx(held[n] / 3600, rel=0.01)
    best = max((0, 1), key=lambda n: results[n]["allgather_gbps"])
    assert f"best: #{best} cluster.tasks_per_node={best + 1}: bandwidth " in out
    assert f"chart: {sweep / 'sweep.png'} (bandwidth over cluster.tasks_per_node)" in out
    assert (sweep / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(sweep / "sweep.csv") as f:
        saved = list(csv.DictReader(f))
    assert [(r["num"], r["cluster.tasks_per_node"], float(r["bandwidth (GB/s)"]), r["state"]) for r in saved] == \
        [(str(n), str(n + 1), results[n]["allgather_gbps"], "done") for n in (0, 1)]
    assert [float(r["node_hours"]) for r in saved] == pytest.approx([held[n] / 3600 for n in (0, 1)], rel=1e-3)
    # From another shell (any directory): the same table.
    again = run_cli("sweep", str(sweep), cwd=tmp_path)
    assert again.stdout.strip() == out.strip()
    assert run_cli("sweep", str(sweep / "0-check-local"), cwd=tmp_path).stdout == again.stdout  # a point names its sweep
    # Bad input: one line, exit 2.
    for args, message in ((["sweep", str(tmp_path)], "not a sweep dir"), (["sweep"], "no sweep under ./multirun"),
                          (["runs", "--sweep"], "no sweep under ./multirun")):
        proc = run_cli(*args, cwd=tmp_path, check=False)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_a_failed_point_stays_in_the_table_with_its_error(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli("-m", *CHECK, "cluster.tasks_per_node=2,1", "launcher.fault=crash:1", f"hydra.sweep.dir={sweep}",
                   check=False)
    assert proc.returncode == 1  # the sweep went on to the next point, and says one failed
    assert "job failed: rank 1 failed on" in proc.stderr and "submitted job" in proc.stderr.split("job failed")[1]
    rows = table_rows(proc.stdout)
    assert rows["0"][:2] == ["0", "2"] and rows["0"][-1].startswith(
        "failed: rank 1 failed on ") and "RuntimeError: launcher.fault=crash:1: injected crash" in rows["0"][-1]
    assert rows["1"][-1] == "done" and float(rows["1"][2]) > 0
    assert f"sweep {sweep}: 2 point(s) (1 done, 1 failed)" in proc.stdout


def test_a_sweep_not_waited_on_shows_its_unfinished_points(tmp_path):
    sweep, release = tmp_path / "sweep", tmp_path / "release"
    proc = run_cli("-m", "mode=run", "mode.target=tests.run_programs:hold", f"mode.kwargs.until={release}",
                   "mode.kwargs.x=1,2", "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1",
                   "launcher.wait=false", f"hydra.sweep.dir={sweep}")
    assert proc.stderr.count("submitted job") == 2
    assert "2 point(s) not finished (submitted with launcher.wait=false?)" in proc.stdout
    rows = table_rows(run_cli("sweep", str(sweep), cwd=tmp_path).stdout)
    assert [rows[n][:2] for n in ("0", "1")] == [["0", "1"], ["1", "2"]]
    assert all(re.match(r"(queued|running)\b", rows[n][-1]) for n in rows), rows
    release.touch()
    deadline = time.time() + 120
    while True:  # as the jobs end, from another shell
        text = run_cli("sweep", str(sweep), cwd=tmp_path).stdout
        rows = table_rows(text)
        if all(rows[n][-1] == "done" for n in rows) or time.time() > deadline:
            break
        time.sleep(1)
    # Each point's cost too, in node-hours: a job that ran is never free.
    assert [rows[n][:3] + rows[n][4:] for n in ("0", "1")] == [["0", "1", "1", "0-run-local", "done"],
                                                                ["1", "2", "2", "1-run-local", "done"]]
    assert all(float(rows[n][3]) > 0 for n in ("0", "1")), rows
    assert "x" in text.splitlines()[1].split()  # the program's returned figure is a column


def test_stopping_a_sweep_stops_its_job_and_its_later_points(tmp_path):
    """SIGTERM (what `timeout` or a scheduler sends; Ctrl-C alike) while the first point runs: its
    job is cancelled, the next point never starts, and the table says so."""
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "launcher", "-m", "mode=run", "mode.target=tests.run_programs:hold",
            f"mode.kwargs.until={tmp_path / 'never'}", "mode.kwargs.x=1,2", "cluster.tasks_per_node=1",
            "cluster.cpu_devices_per_task=1", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    joined = sweep / "0-run-local" / ".xlaunch" / "ranks" / "rank0.json"
    deadline = time.time() + 120
    while time.time() < deadline and '"joined"' not in (joined.read_text() if joined.exists() else ""):
        time.sleep(0.2)
    proc.terminate()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "interrupted: job" in err and err.count("submitted job") == 1
    rows = table_rows(out)
    assert rows["0"][-1].startswith("failed: rank 0 stopped on") and rows["1"][-1] == "not run"
    assert not (sweep / "1-run-local").exists()


def test_a_sweep_of_200_points_prints_one_screen(check_sweep, tmp_path):
    """Made of the check sweep's first point, copied 200 times with its figure changed (plus
    three that failed before submission): the best and worst few, the failures, the rest in CSV."""
    source, _ = check_sweep
    sweep = tmp_path / "big"
    template = source / "0-check-local"
    points = []
    for n in range(200):
        run_dir = sweep / f"{n}-check-local"
        shutil.copytree(template, run_dir, ignore=shutil.ignore_patterns("jax_cache", "submitit"))
        (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"mode.allgather_mb={n + 1}"]))
        result = json.loads((run_dir / "result.json").read_text())
        (run_dir / "result.json").write_text(json.dumps({**result, "allgather_gbps": 1.0 + (n * 37 % 200)}))
        if n in (5, 50, 150):
            (run_dir / "job.json").unlink()
            (run_dir / "failure.txt").write_text(f"point {n} refused\nmore\n")
        points.append({"num": n, "overrides": [f"mode.allgather_mb={n + 1}"], "run_dir": str(run_dir)})
    record = json.loads((source / "sweep.json").read_text())
    (sweep / "sweep.json").write_text(json.dumps({**record, "points": points, "ended": time.time()}))
    out = run_cli("sweep", str(sweep), cwd=tmp_path).stdout
    lines = out.splitlines()
    assert len(lines) <= 30, out
    assert lines[0].startswith(f"sweep {sweep}: 200 point(s) (197 done, 3 failed)")
    rows = table_rows(out)
    values = {n: 1.0 + (n * 37 % 200) for n in range(200) if n not in (5, 50, 150)}
    order = sorted(values, key=lambda n: -values[n])
    assert list(rows) == [str(n) for n in order[:8] + order[-8:]]
    assert "... 184 more point(s) between these (all in sweep.csv)" in out
    assert [line for line in lines if line.startswith("failed #")] == \
        [f"failed #{n} mode.allgather_mb={n + 1}: point {n} refused" for n in (5, 50, 150)]
    assert f"best: #{order[0]} mode.allgather_mb={order[0] + 1}: bandwidth {values[order[0]]:.4g} GB/s" in out
    with open(sweep / "sweep.csv") as f:
        saved = list(csv.DictReader(f))
    assert len(saved) == 200 and saved[50]["state"] == "failed" and saved[50]["detail"] == "point 50 refused"


def test_a_3_trial_optuna_search_on_the_embedded_default_names_its_best_point(tmp_path):
    """Optuna's grid sampler (each value once, so the test knows the three points) over the
    all-gather's size on the embedded default (2 processes x 4 devices), maximizing the
    bandwidth as mode=check's objective says."""
    sweep = tmp_path / "optuna"
    proc = run_cli("-m", "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=3",
                   "mode=check", "mode.allgather_mb=choice(0.25,0.5,1)", f"hydra.sweep.dir={sweep}")
    assert "Directions: ['maximize']" in proc.stdout  # set from launcher.objective (bandwidth: higher is better)
    results = {}
    for run_dir in sorted(sweep.glob("*-check-local")):
        r = read_result(run_dir)
        assert (r["num_processes"], r["global_devices"]) == (2, 8)
        results[r["allgather_bytes_per_device"] / 2**20] = (run_dir.name.split("-")[0], r["allgather_gbps"])
    assert sorted(results) == [0.25, 0.5, 1.0]
    best = max(results, key=lambda mb: results[mb][1])
    num, gbps = results[best]
    found = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert found["best_params"] == {"mode.allgather_mb": best} and found["best_value"] == pytest.approx(gbps)
    out = proc.stdout[proc.stdout.index(f"sweep {sweep} by hydra/sweeper=optuna: 3 point(s) of 3 trials (3 done)"):]
    assert f"best: #{num} mode.allgather_mb={best:g}: bandwidth {gbps:.4g} GB/s" in out
    assert f"optuna's best: mode.allgather_mb={best:g}: bandwidth {gbps:.4g} GB/s" in out
    assert sorted(r[1] for r in table_rows(out).values()) == ["0.25", "0.5", "1"]


@pytest.mark.heavy
@pytest.mark.timeout(1800)
def test_a_2_trial_optuna_search_of_the_default_job(tmp_path):
    """`python -m launcher`'s own job (mode=cfp on the tiny GPT, 2 processes x 4 devices) as two
    Optuna trials over the batch size, minimizing the answer's time over the fastest baseline's:
    each trial a whole search (minutes), so in the heavy stage. Each trial is the default job's
    pipeline whole (analysis, profile, search, races), on one logical mesh (the 1-D one) and with
    shorter races and shortlists: with 16 rounds, even on the one mesh [4,2], each trial took 4
    minutes here and the test 13; with 4 rounds on [8], 8 minutes in the heavy stage on a slow day.
    Two trials are the fewest that make Optuna choose (three took 6.5 minutes on 2026-11-28;
    Optuna's table and choice over three points are the mode=check sweep's, above); the
    two-process search over every mesh is test_cfp_search's."""
    sweep = tmp_path / "optuna"
    proc = run_cli("-m", "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=2",
                   "model.batch_size=choice(8,16)", "launcher.objective.figure=vs_best_baseline",
                   "mode.mesh_shape=[8]", "mode.run_repeats=4", "mode.verify_repeats=2", "mode.profile_top_k=2",
                   "mode.verify_top_k=1",
                   f"mode.store_dir={tmp_path / 'store'}", f"hydra.sweep.dir={sweep}", timeout=1700)
    assert "Directions: ['minimize']" in proc.stdout
    results = {}
    for run_dir in sorted(sweep.glob("*-cfp-local")):
        r = read_result(run_dir)
        assert (r["mode"], r["num_processes"], r["global_devices"]) == ("cfp", 2, 8)
        batch = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())["model"]["batch_size"]
        results[batch] = r["answer"]["vs_best_baseline_paired"]
    assert sorted(results) == [8, 16]
    found = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert found["best_value"] == pytest.approx(min(results.values()))
    assert results[found["best_params"]["model.batch_size"]] == pytest.approx(min(results.values()))
    out = proc.stdout[proc.stdout.index(f"sweep {sweep} by hydra/sweeper=optuna: 2 point(s) of 2 trials (2 done)"):]
    assert out.splitlines()[1].split()[:8] == ["#", "model.batch_size", "vs", "best", "baseline", "step", "time",
                                               "answer"]  # the objective's column first
    assert f"optuna's best: model.batch_size={found['best_params']['model.batch_size']}: vs_best_baseline " in out


def test_a_failed_trial_is_reported_to_optuna_as_failed_not_as_zero(tmp_path):
    """The first trial's rank 0 crashes (launcher.fault names the job's own number, so only job 0
    has such a rank to crash); the search minimizes the bandwidth, so a failed trial taken for
    zero would be its best. It is a failed trial, and the best is a point that ran."""
    sweep = tmp_path / "optuna"
    proc = run_cli("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1",
                   "hydra.sweeper.max_failure_rate=1.0", "hydra.sweeper.sampler.seed=0", "mode=check",
                   "cluster.cpu_devices_per_task=2", "cluster.tasks_per_node=1", "mode.allgather_mb=choice(0.25,1)", "launcher.fault=crash:${hydra:job.num}",
                   "launcher.objective.lower_is_better=true", f"hydra.sweep.dir={sweep}")
    assert "Directions: ['minimize']" in proc.stdout
    assert proc.stdout.count("Failed experiment: rank 0 failed on") == 1  # what Optuna was told
    ran = {n: read_result(sweep / f"{n}-check-local")["allgather_gbps"] for n in (1, 2)}
    assert not (sweep / "0-check-local" / "result.json").exists()
    found = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert found["best_value"] == pytest.approx(min(ran.values())) and found["best_value"] > 0
    rows = table_rows(proc.stdout)
    assert rows["0"][-1].startswith("failed: rank 0 failed on") and "injected crash" in rows["0"][-1]
    assert [rows[n][-1] for n in ("1", "2")] == ["done", "done"]


@pytest.mark.parametrize("args, message", [
    # points that share no run-dir root
    (["cluster.tasks_per_node=1,2", "hydra.sweep.subdir={tmp}/elsewhere/${hydra.job.num}"],
     "point #0 would run in {tmp}/elsewhere/0, outside the sweep dir {tmp}/sweep"),
    (["mode=check,train", "hydra.sweep.dir={tmp}/${mode.name}"],
     "point #0 would run in {tmp}/check/0-check-local, outside the sweep dir {tmp}/cfp"),
    (["cluster.tasks_per_node=1,2", "hydra.sweep.subdir=same"], "points #0 and #1 would both run in {tmp}/sweep/same"),
    # an objective no mode reports; a point refused
    (["cluster.tasks_per_node=1,2", "launcher.objective.figure=step_time"],
     "point #0 (mode=check cluster.tasks_per_node=1 launcher.objective.figure=step_time): launcher.objective.figure"
     "=step_time: mode=check reports no such figure; it reports bandwidth (GB/s, higher is better)"),
    (["cluster.tasks_per_node=1,0"], "point #1 (mode=check cluster.tasks_per_node=0): cluster.tasks_per_node=0"),
    (["mode.allgather_mb=interval(1,2)"], "Hydra's grid sweeper takes lists (a,b,c), choice(...) and range(...); to "
                                          "search an interval use hydra/sweeper=optuna"),
    # Optuna: a search space it cannot parse, an objective it cannot have, results it cannot wait for
    (["hydra/sweeper=optuna", "mode.allgather_mb=glob(*)"], "hydra.sweeper.params: Optuna's search space cannot"),
    (["hydra/sweeper=optuna", "mode.allgather_mb=interval(4,1)"],
     "Optuna's search space cannot be parsed (The `low` value must be smaller than or equal to the `high`"),
    (["hydra/sweeper=optuna", "mode=analysis", "cluster.tasks_per_node=1,2"],
     "hydra/sweeper=optuna optimizes one figure, and mode=analysis has none of its own"),
    (["hydra/sweeper=optuna", "cluster.tasks_per_node=1,2", "launcher.wait=false"], "it needs every job's result"),
    (["hydra/sweeper=optuna", "cluster.tasks_per_node=1,2", "hydra.sweeper.direction=minimize"],
     "hydra.sweeper.direction=minimize, but the objective is bandwidth (higher is better)"),
])
def test_a_bad_sweep_is_refused_in_one_line_before_any_job(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    mode = [] if any(a.startswith("mode=") for a in args) else ["mode=check"]
    where = [] if any(a.startswith("hydra.sweep.dir=") for a in args) else [f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = run_cli("-m", *mode, *args, *where, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message.replace("{tmp}", str(tmp_path)) in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr and "submitted job" not in proc.stderr
    assert not list(tmp_path.rglob("job.json"))


def test_an_optuna_search_space_in_a_config_file_that_cannot_be_parsed(tmp_path):
    conf = tmp_path / "conf" / "hydra" / "sweeper"
    conf.mkdir(parents=True)
    (conf / "search.yaml").write_text("defaults: [optuna]\nn_trials: 2\nparams:\n  mode.allgather_mb: choice(0.5, 1\n")
    proc = run_cli("-m", "--config-dir", str(tmp_path / "conf"), "hydra/sweeper=search", "mode=check",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}", check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: hydra.sweeper.params: Optuna's search space cannot be parsed (no viable alternative at input "
        "'choice(0.5, 1'); give each key choice(a,b,...), range(start,stop,step) or interval(low,high), e.g. "
        "hydra.sweeper.params.model.batch_size='choice(8,16)'"]
    assert not Path(tmp_path / "sweep").exists() or not list((tmp_path / "sweep").rglob("job.json"))
