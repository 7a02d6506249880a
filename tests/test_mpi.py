"""cluster=mpi-local: real Open MPI (mpirun) and mpi4py, through our submitit plugin."""

import json
import subprocess
import sys
import time

import pytest

from tests.launch import read_result, run_cli

pytestmark = pytest.mark.core


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_check_runs_as_four_mpi_ranks(tmp_path):
    run = tmp_path / "run"
    owned = tmp_path / "owned"
    run_cli("mode=check", "cluster=mpi-local", "cluster.tasks_per_node=4", "cluster.cpu_devices_per_task=2", "mode.allgather_mb=0.25",
            f"+cluster.env.XLAUNCH_PROBE='$(touch {owned}); `touch {owned}`'", run_dir=run, timeout=240)
    r = read_result(run)
    assert r["cluster"] == "mpi-local" and r["num_processes"] == 4 and r["global_devices"] == 8
    assert r["psum_ok"] is True and r["psum_value"] == 28.0
    for rank in range(4):
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank}/4 (local {rank}/4" in log and "from openmpi" in log
    # The script that ran is the one saved in the run dir (and printed by a dry run).
    script = (run / "submission.sh").read_text()
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    assert (run / "submitit" / f"{job_id}_submission.sh").read_text() == script
    assert "exec mpirun -np 4" in script
    # submitit's view inside each rank came from our job environment (OMPI_COMM_WORLD_*).
    out = (run / "submitit" / f"{job_id}_0_log.out").read_text()
    for rank in range(4):
        assert f"local_rank={rank}(4), node=0(1), global_rank={rank}(4)" in out
    # A value with command substitutions was exported, quoted, and never ran.
    assert not owned.exists()
    export = next(line for line in script.splitlines() if line.startswith("export XLAUNCH_PROBE="))
    seen = subprocess.run(["bash", "-c", f'{export}; printf %s "$XLAUNCH_PROBE"'], capture_output=True, text=True)
    assert seen.stdout == f"$(touch {owned}); `touch {owned}`"


@pytest.mark.timeout(300)
def test_no_wait_returns_at_submission_and_the_job_still_finishes(tmp_path):
    run = tmp_path / "run"
    t0 = time.monotonic()
    proc = run_cli("mode=check", "cluster=mpi-local", "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=1",
                   "launcher.wait=false", run_dir=run, timeout=120)
    assert "submitted job" in proc.stderr
    assert not (run / "result.json").exists()  # returned before the ranks could finish
    while not (run / "result.json").exists() and time.monotonic() - t0 < 180:
        time.sleep(0.5)
    assert read_result(run)["num_processes"] == 2


def test_mpi_plugin_is_registered_with_submitit(tmp_path):
    # Entry points (pyproject.toml): submitit itself finds our executor and job environment.
    code = ("import submitit; from submitit.core import plugins; "
            "print(plugins.get_executors()['mpi'].__module__, plugins.get_job_environments()['mpi'].name())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["launcher.clusters.mpi", "mpi"]
