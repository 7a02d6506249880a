"""cluster=slurm against a real SLURM (two slurmd nodes, slurmdbd accounting; see conftest)."""

import pickle
import time

import pytest
from hydra import compose, initialize_config_dir
from submitit.core.utils import JobPaths

from launcher.clusters.base import Cluster
from launcher.cli.schema import register
from tests.launch import REPO, read_result, run_cli

pytestmark = pytest.mark.core


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_check_runs_on_two_nodes_with_two_tasks_each(slurm, tmp_path):
    run = tmp_path / "run"
    run_cli("mode=check", "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=2",
            "mode.allgather_mb=0.25", run_dir=run, env=slurm.env, timeout=240)
    r = read_result(run)
    assert r["cluster"] == "slurm" and r["num_processes"] == 4 and r["global_devices"] == 8
    assert r["psum_ok"] is True and r["psum_value"] == 28.0
    assert sorted(p["process_id"] for p in r["processes"]) == [0, 1, 2, 3]
    # srun placed two tasks on each pretend node: local ranks 0,1 and node ids 0,1.
    for rank, (local, node) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank}/4 (local {local}/2, node {node})" in log and "from slurm" in log
    # The saved script is byte for byte the one sbatch was given (submitit keeps its copy).
    job_id = (run / "submitit").glob("*_submission.sh").__next__().name.split("_")[0]
    assert (run / "submission.sh").read_text() == (run / "submitit" / f"{job_id}_submission.sh").read_text()
    assert "srun --unbuffered" in (run / "submission.sh").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_crashing_rank_fails_the_slurm_job_quickly(slurm, tmp_path):
    run = tmp_path / "run"
    t0 = time.monotonic()
    proc = run_cli("mode=check", "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1",
                   "launcher.fault=crash:1", run_dir=run, env=slurm.env, timeout=240, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 failed" in proc.stderr and "injected crash" in proc.stderr
    assert time.monotonic() - t0 < 120
    # Nothing of the job is left running: no task, srun, batch script or slurmstepd.
    deadline = time.monotonic() + 30
    while slurm.job_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert slurm.job_processes() == []


def test_sbatch_refusal_is_reported_and_metacharacters_stay_inert(slurm, tmp_path):
    owned = tmp_path / "owned"
    proc = run_cli("mode=check", "cluster=slurm", f"cluster.partition='debug; touch {owned}'", run_dir=tmp_path / "run",
                   env=slurm.env, timeout=60, check=False)
    assert proc.returncode == 2
    assert "sbatch refused the job" in proc.stderr and "invalid partition" in proc.stderr.lower()
    assert not owned.exists()


def test_a_job_slurm_still_holds_has_not_ended_whatever_its_tasks_left(slurm, tmp_path, monkeypatch):
    # An attempt the job was requeued from can leave a result file per task (its ranks failing
    # as SLURM stopped them): submitit's done() then says the job ended, and the launcher must
    # not believe it while SLURM holds the job to run it again.
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    register()
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", ["cluster=slurm", "mode=check", "cluster.nodes=2", "cluster.tasks_per_node=1"])
    cluster = Cluster.for_config(cfg, tmp_path)
    executor = cluster.executor()
    executor.update_parameters(additional_parameters={"hold": True})  # pending until released
    job = executor.submit(print, "never run")
    try:
        for task in range(2):
            JobPaths(cluster.folder, job.job_id, task).result_pickle.write_bytes(
                pickle.dumps(("error", "killed as the job was requeued")))
        assert job.done() and cluster.scheduled(job.job_id).state == "queued"
        assert not cluster.ended(job)
    finally:
        cluster.cancel_id(job.job_id)
    assert cluster.ended(job)
