"""cluster=ray against a real Ray cluster started here: a head and a second worker node, 2 CPUs
each (tests/clusterkit/ray.py), the way the SLURM tests run against a real two-node SLURM.

One cluster for the module (one xdist unit: tests/conftest.py). Every job names the head's
address; nothing here uses ``auto``, so a Ray cluster someone else runs on the machine is not met.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.clusterkit.ray import LocalRay
from tests.launch import REPO, read_result, run_cli
from tests.test_hang import OTHERS, RANK1, STUCK
from tests.test_operate import job_processes, one_line_error, state_of, wait_for
from tests.test_run import HEADER, assert_same_losses, log, losses, reference

pytestmark = pytest.mark.slow

# A job that runs until it is ended: a program that waits on its first run (no compile to pay).
WAITS = ["mode=run", "mode.script=tests/programs/preempted.py", "cluster.cpu_devices_per_task=1"]


@pytest.fixture(scope="module")
def ray_cluster():
    cluster = LocalRay(nodes=2).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def on_ray(cluster: LocalRay, *overrides: str) -> list[str]:
    return ["cluster=ray", f"cluster.address={cluster.address}", *overrides]


def placement(run: Path) -> list[dict]:
    return json.loads((run / "submitit" / "ray_placement.json").read_text())["ranks"]


@pytest.mark.timeout(400)
def test_a_training_script_gives_the_losses_it_gives_on_local_processes(ray_cluster, tmp_path):
    run = tmp_path / "run"
    run_cli(*on_ray(ray_cluster, "mode=run", "mode.script=examples/train_jax.py", "mode.args=[--steps,6]",
                    "cluster.nodes=2", "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=2"),
            run_dir=run, env=ray_cluster.env, timeout=300)
    assert f"4 {HEADER}" in log(run, 0)
    assert_same_losses(losses(log(run, 0)), reference("train_jax.py", 6))
    assert read_result(run)["num_processes"] == 4


@pytest.mark.timeout(400)
def test_a_killed_rank_is_named_within_seconds_and_a_cancel_stops_every_task(ray_cluster, tmp_path):
    # Killed: the waiting launcher names rank 1 and how it ended, and every task ends.
    run = tmp_path / "killed"
    args = [sys.executable, "-m", "launcher", *on_ray(ray_cluster, *WAITS, "cluster.nodes=2",
                                                    "cluster.tasks_per_node=1"), f"hydra.run.dir={run}"]
    launcher = subprocess.Popen(args, cwd=REPO, env={**os.environ, **ray_cluster.env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (run / "job.json").exists() and all(
            r["state"] == "joined" for r in state_of(run, REPO, ray_cluster.env)["ranks"]), 120, "both ranks joined")
        pid = json.loads((run / ".xlaunch" / "ranks" / "rank1.json").read_text())["pid"]
        killed = time.monotonic()
        os.kill(pid, 9)
        _, err = launcher.communicate(timeout=60)
        ended = time.monotonic() - killed
    finally:
        launcher.kill()
    assert launcher.returncode == 1 and ended < 10, (ended, err)
    assert "job failed: rank 1 failed" in err and "killed by signal 9 on Ray node" in err
    assert not job_processes(run)

    # Cancelled from another shell while nobody waits: every task ends, the run dir says so.
    run = tmp_path / "cancelled"
    run_cli(*on_ray(ray_cluster, *WAITS, "cluster.nodes=2", "cluster.tasks_per_node=1", "launcher.wait=false"),
            run_dir=run, env=ray_cluster.env)
    wait_for(lambda: all(r["state"] == "joined" for r in state_of(run, REPO, ray_cluster.env)["ranks"]), 120,
             "both ranks joined")
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    assert f"cancelled job {job_id} on ray" in run_cli("cancel", str(run), env=ray_cluster.env).stdout
    assert state_of(run, REPO, ray_cluster.env)["state"] == "cancelled"
    assert not job_processes(run)
    one_line_error(run_cli("cancel", str(run), env=ray_cluster.env, check=False), "has already ended (cancelled")


@pytest.mark.heavy  # a sweep of Ray jobs; sweeps are the default run's on cluster=local
@pytest.mark.timeout(400)
def test_a_sweep_makes_one_ray_job_per_point(ray_cluster, tmp_path):
    proc = run_cli("-m", *on_ray(ray_cluster, "mode=check", "cluster.cpu_devices_per_task=1,2",
                                 "mode.allgather_mb=0.25"), f"hydra.sweep.dir={tmp_path / 'sweep'}",
                   env=ray_cluster.env, timeout=300)
    results = sorted(json.loads(p.read_text())["global_devices"] for p in (tmp_path / "sweep").glob("*/result.json"))
    assert results == [2, 4], proc.stderr


@pytest.mark.timeout(300)
def test_what_the_cluster_cannot_give_is_refused_before_submission_or_ends_the_job(ray_cluster, tmp_path):
    def refused(*overrides: str, words: tuple[str, ...]) -> None:
        run = tmp_path / f"refused{len(list(tmp_path.iterdir()))}"
        proc = run_cli(*overrides, "mode=check", run_dir=run, env=ray_cluster.env, check=False)
        one_line_error(proc, *words)
        assert not (run / "job.json").exists()  # nothing submitted

    refused("cluster=ray", "cluster.address=127.0.0.1:1", words=("cluster.address=127.0.0.1:1",
                                                                 "no Ray head answers", "ray start --head"))
    refused(*on_ray(ray_cluster, "cluster.nodes=3"), words=("cluster.nodes=3", "has 2 alive node(s)"))
    refused(*on_ray(ray_cluster, "+cluster.resources.TPU=4"), words=("short of TPU", "cluster.resources"))
    refused(*on_ray(ray_cluster, "cluster.cpus_per_task=3"), words=('{"CPU": 6.0}', "short of CPU"))
    refused("cluster=ray", "cluster.address=nowhere", words=("cluster.address='nowhere'", "ray://host:10001"))

    # Resources the cluster has, but other work holds: the job waits launcher.init_timeout_s for
    # its placement group, then ends saying what it waited for.
    holder = tmp_path / "holder"
    run_cli(*on_ray(ray_cluster, *WAITS, "cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.cpus_per_task=2",
                    "cluster.cpu_devices_per_task=1", "launcher.wait=false"), run_dir=holder, env=ray_cluster.env)
    try:
        wait_for(lambda: (holder / "submitit" / "ray_placement.json").exists(), 60, "the first job placed")
        t0 = time.monotonic()
        proc = run_cli(*on_ray(ray_cluster, "mode=check", "launcher.init_timeout_s=5"), run_dir=tmp_path / "late",
                       env=ray_cluster.env, check=False)
        assert proc.returncode == 1 and time.monotonic() - t0 < 60
        assert 'could not place 1 bundle(s) of {"CPU": 2.0}' in proc.stderr
        assert "launcher.init_timeout_s=5 s" in proc.stderr and "CPU=0 of 4" in proc.stderr
    finally:
        run_cli("cancel", str(holder), env=ray_cluster.env, check=False)


@pytest.mark.timeout(120)
def test_ray_is_needed_only_where_cluster_ray_submits(tmp_path):
    # The CLI imports nothing of Ray, a dry run of cluster=ray included; submitting without Ray
    # installed is one line naming the fix. (sys.modules["ray"] = None: `import ray` fails.)
    code = ("import sys, runpy\n"
            "if sys.argv[1] == 'none':\n    sys.modules['ray'] = None\n"
            "sys.argv = ['launcher', *sys.argv[2:]]\n"
            "try:\n    runpy.run_module('launcher', run_name='__main__')\n"
            "finally:\n    print('ray imported:', sys.modules.get('ray') is not None, file=sys.stderr)")
    for cluster in ("local", "ray"):
        proc = subprocess.run([sys.executable, "-c", code, "installed", f"cluster={cluster}", "mode=check",
                               "launcher.dry_run=true", f"hydra.run.dir={tmp_path / cluster}"], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "ray imported: False" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-c", code, "none", "cluster=ray", "mode=check",
                           f"hydra.run.dir={tmp_path / 'none'}"], cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(lines) == 1 and "pip install 'xlaunch[ray]'" in lines[0], proc.stderr
    assert not (tmp_path / "none" / "job.json").exists()


@pytest.mark.heavy  # a restart is the launcher's on every backend: test_restart.py's on local processes by default
@pytest.mark.timeout(300)
def test_a_failed_task_restarts_the_job_in_its_run_dir(ray_cluster, tmp_path):
    # launcher.max_restarts on Ray: the program waits on its first run, where rank 1 is killed.
    run = tmp_path / "run"
    args = [sys.executable, "-m", "launcher", *on_ray(ray_cluster, "mode=run", "mode.script=tests/programs/preempted.py",
                                                    "cluster.nodes=2", "cluster.tasks_per_node=1",
                                                    "cluster.cpu_devices_per_task=1", "launcher.max_restarts=1"),
            f"hydra.run.dir={run}"]
    launcher = subprocess.Popen(args, cwd=REPO, env={**os.environ, **ray_cluster.env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (run / "logs" / "rank1.log").exists() and "restart 0" in (run / "logs" / "rank1.log").read_text(),
                 120, "the first run")
        os.kill(json.loads((run / ".xlaunch" / "ranks" / "rank1.json").read_text())["pid"], 9)
        _, err = launcher.communicate(timeout=200)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err
    assert "killed by signal 9 on Ray node" in err and "restarted as job" in err
    assert read_result(run)["restart"] == 1 and "done" in (run / "logs" / "rank0.log").read_text()


@pytest.mark.heavy  # a hang is found by the same watch on every backend: test_hang.py's on local processes by default
@pytest.mark.timeout(300)
def test_a_stuck_rank_is_shown_and_the_job_ends(ray_cluster, tmp_path):
    proc = run_cli(*on_ray(ray_cluster, *STUCK, "cluster.nodes=2", "cluster.tasks_per_node=1"), run_dir=tmp_path / "run",
                   env=ray_cluster.env, check=False, timeout=240)
    line = next((line for line in proc.stderr.splitlines() if "the job hung" in line), proc.stderr)
    assert proc.returncode == 1 and RANK1.search(line) and OTHERS.search(line), proc.stderr


@pytest.mark.timeout(300)
def test_check_runs_two_tasks_on_each_of_two_ray_nodes_through_ray_client(ray_cluster, tmp_path):
    # ray://host:port, as a KubeRay head is reached from outside its Kubernetes cluster (the other
    # tests name the head's own address).
    run = tmp_path / "run"
    run_cli("cluster=ray", f"cluster.address={ray_cluster.client_address}", "mode=check", "cluster.nodes=2",
            "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=2", "mode.allgather_mb=0.25",
            run_dir=run, env=ray_cluster.env, timeout=240)
    r = read_result(run)
    assert r["cluster"] == "ray" and r["num_processes"] == 4 and r["global_devices"] == 8
    assert r["psum_ok"] is True and r["psum_value"] == 28.0
    # One placement-group bundle per node: ranks 0-1 on one Ray node, 2-3 on the other.
    ranks = placement(run)
    nodes = [p["node_id"] for p in ranks]
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    assert {n["id"] for n in ray_cluster.alive_nodes()} == set(nodes)
    for rank in range(4):
        text = log(run, rank)
        assert f"rank {rank}/4 (local {rank % 2}/2, node {rank // 2})" in text and "from explicit" in text
    # submitit's view inside each task came from our job environment (the XLAUNCH_* variables).
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    out = (run / "submitit" / f"{job_id}_3_log.out").read_text()
    assert "local_rank=1(2), node=1(2), global_rank=3(4)" in out
    # The status of a finished Ray job, and its logs, as on every backend.
    status = run_cli("status", str(run), env=ray_cluster.env).stdout
    assert "on ray (ray)" in status and "done: 8 devices, psum ok" in status
    assert run_cli("logs", "--rank", "3", str(run)).stdout == (run / "logs" / "rank3.log").read_text()
