"""A rank alive and stuck is found and shown (issue 36): a job none of whose ranks progresses
for ``launcher.hang_timeout_s`` dumps every rank's stacks into its log, the launcher says where
each rank was and ends the job; ``xlaunch stacks`` asks a running job for the same. And a job
whose rank is killed is restarted (tests/test_restart.py).

The stuck program (tests/programs/hang.py): rank 1 sleeps where the others enter an all-gather,
as a rank whose data loader never returns does; every process is alive, every heartbeat fine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.runtime import requeue
from tests.launch import REPO, run_cli
from tests.test_operate import one_line_error, state_of, wait_for

HANG_S = 10
STUCK = ["mode=run", "mode.script=tests/programs/hang.py", "cluster.cpu_devices_per_task=1",
         f"launcher.hang_timeout_s={HANG_S}"]
# Where each rank is: the line of the program it waits at.
RANK1 = re.compile(r"rank 1 at hang\.py:\d+ in <module> \(time\.sleep\(3600\)\)")
OTHERS = re.compile(r"ranks? 0(,\d+)* at hang\.py:\d+ in <module> \(total = multihost_utils\.process_allgather")


def _hung(cluster: list[str], tmp_path: Path, env: dict | None = None) -> None:
    run = tmp_path / "run"
    log0 = run / "logs" / "rank0.log"
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", *STUCK, *cluster, f"hydra.run.dir={run}"], cwd=REPO,
                                env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        wait_for(lambda: log0.exists() and "step 2 " in log0.read_text(), 200, "the three steps")
        stuck_since = time.monotonic()  # the last progress any rank made
        _, err = launcher.communicate(timeout=HANG_S + 60)
        ended = time.monotonic() - stuck_since
    finally:
        launcher.kill()
    assert launcher.returncode == 1, err
    line = next(line for line in err.splitlines() if "the job hung" in line)
    assert "no rank progressed for" in line and f"launcher.hang_timeout_s={HANG_S}" in line
    assert RANK1.search(line) and OTHERS.search(line), line
    assert ended < HANG_S + 30, ended
    # Every rank's log holds its threads' stacks, its main thread's at the line it waited at.
    program = (REPO / "tests" / "programs" / "hang.py").read_text().splitlines()
    for rank, waits_at in ((0, "total = multihost_utils.process_allgather(jnp.ones(2))"), (1, "time.sleep(3600)")):
        line_no = next(i for i, text in enumerate(program, 1) if text.strip().startswith(waits_at))
        dump = (run / "logs" / f"rank{rank}.log").read_text().split(f"=== xlaunch: the stacks of rank {rank}'s")[1]
        assert f'hang.py", line {line_no} in <module>' in dump, dump
    assert re.search(r"^rank 1 +hung on ", run_cli("status", str(run), env=env).stdout, re.M)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stuck_rank_on_local_processes_is_shown_and_the_job_ends(tmp_path):
    _hung(["cluster=local"], tmp_path)


# The same watch and the same stacks on the other backends, in the heavy stage: what differs there
# is how a job ends, which the default run proves on each (tests/test_operate.py: a SLURM job and an
# mpirun job cancelled; tests/test_ray.py: a Ray job's cancel stops every task).
@pytest.mark.heavy
@pytest.mark.timeout(300)
def test_a_stuck_rank_under_mpirun_is_shown_and_the_job_ends(tmp_path):
    _hung(["cluster=mpi-local", "cluster.tasks_per_node=2"], tmp_path)


@pytest.mark.heavy
@pytest.mark.timeout(400)
def test_a_stuck_rank_on_slurm_is_shown_and_the_job_ends(slurm, tmp_path):
    _hung(["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1"], tmp_path, env=slurm.env)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_xlaunch_stacks_shows_where_each_rank_of_a_running_job_is(tmp_path):
    run = tmp_path / "run"
    stuck = [a for a in STUCK if not a.startswith("launcher.hang_timeout_s")]
    run_cli(*stuck, "launcher.wait=false", run_dir=run)
    try:
        wait_for(lambda: "step 2 " in (run / "logs" / "rank0.log").read_text()
                 if (run / "logs" / "rank0.log").exists() else False, 120, "the three steps")
        out = run_cli("stacks", str(run)).stdout
        first = out.splitlines()[0]
        assert RANK1.search(first) and OTHERS.search(first), out
        assert f"rank 1: every thread's stack is in {run / 'logs' / 'rank1.log'}" in out
        assert state_of(run, REPO)["state"] == "running"  # asking does not disturb the job
    finally:
        run_cli("cancel", str(run), check=False)
    one_line_error(run_cli("stacks", str(run), check=False), "is not running (cancelled")


@pytest.mark.parametrize("override, message", [
    ("launcher.hang_timeout_s=1", "launcher.hang_timeout_s=1.0: must be more than the ranks' heartbeat interval"),
    ("launcher.max_restarts=-1", "launcher.max_restarts=-1: must be 0 (never restart) or more"),
    ("launcher.exit_timeout_s=0", "launcher.exit_timeout_s=0.0: must be more than 0 (seconds the ranks have to exit"),
    ("launcher.max_restarts=1 launcher.wait=false", "launcher.max_restarts=1 needs launcher.wait=true"),
    ("launcher.compile_cache_dir=/proc/xlaunch-cache", "launcher.compile_cache_dir=/proc/xlaunch-cache: cannot be "
                                                       "written"),
])
def test_bad_hang_and_restart_settings_are_refused_before_submission(tmp_path, override, message):
    run = tmp_path / "run"
    proc = run_cli("mode=check", *override.split(), run_dir=run, check=False)
    one_line_error(proc, message)
    assert not (run / "job.json").exists()


def test_on_slurm_launcher_max_restarts_also_bounds_requeues(tmp_path):
    cfg = OmegaConf.create({"cluster": {"name": "slurm", "backend": "slurm", "max_requeues": 3},
                            "launcher": {"max_restarts": 1}})
    assert requeue.why_not(cfg, tmp_path, 0, requeues=True) == ""
    assert "not requeued again, launcher.max_restarts=1 reached" in requeue.why_not(cfg, tmp_path, 1, requeues=True)
    cfg.launcher.max_restarts = 0  # unset: cluster.max_requeues, as before
    assert requeue.why_not(cfg, tmp_path, 2, requeues=True) == "" and "cluster.max_requeues=3 reached" in \
        requeue.why_not(cfg, tmp_path, 3, requeues=True)
