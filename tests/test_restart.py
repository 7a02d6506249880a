"""A job whose rank is killed is restarted in its run dir (``launcher.max_restarts``, issue 36)
and ends with the losses of the uninterrupted run (tests/train_reference.py), the time it took
and lost accounted for."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.launch import REPO, read_result, read_scalars, run_cli
from tests.test_operate import wait_for
from tests.train_reference import CHECKPOINT_EVERY, LOCAL, STEPS, TRAIN, uninterrupted


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_training_job_killed_at_one_rank_restarts_and_ends_with_the_uninterrupted_losses(tmp_path):
    run = tmp_path / "run"
    args = [sys.executable, "-m", "launcher", *TRAIN, *LOCAL, "launcher.max_restarts=1", f"hydra.run.dir={run}"]
    launcher = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Killed once its first checkpoint is saved: the restart resumes from it.
        wait_for(lambda: (run / "checkpoints" / str(CHECKPOINT_EVERY)).exists(), 240, "the first checkpoint")
        pid = json.loads((run / ".xlaunch" / "ranks" / "rank1.json").read_text())["pid"]
        os.kill(pid, 9)
        out, err = launcher.communicate(timeout=400)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err
    assert re.search(r"job \d+ failed \(rank 1 .*\); restarted as job \d+ \(restart 1 of at most "
                     r"launcher.max_restarts=1\)", err), err
    resumed, reference = read_result(run), read_result(uninterrupted())
    assert resumed["losses"] == reference["losses"] and len(resumed["losses"]) == STEPS
    assert resumed["resumed_from_step"] >= CHECKPOINT_EVERY
    log = (run / "logs" / "rank1.log").read_text()
    assert "=== restart 1 (restarted after: rank 1" in log
    assert json.loads((run / "job.json").read_text())["restarts"] == 1
    # Where the time went, over both attempts: the steps the first did past the checkpoint the
    # restart resumed from are lost (none, when rank 1 was killed before a step past it ended).
    t = resumed["time"]
    first = json.loads((run / ".xlaunch" / "time" / "attempt0.json").read_text())
    assert t["attempts"] == 2 and first["last_step"] >= resumed["resumed_from_step"]
    assert t["lost_steps"] == first["last_step"] - resumed["resumed_from_step"]
    assert (t["lost_s"] > 0) == (t["lost_steps"] > 0) and 0 < t["goodput"] < 1
    parts = ("queued_s", "startup_s", "compile_s", "steps_s", "checkpoint_s", "other_s")
    assert all(t[k] >= 0 for k in parts) and t["steps_s"] > 0 and t["compile_s"] > 0
    assert sum(t[k] for k in parts) <= t["wall_s"] * 1.05
    # What the restart cost of the time the allocation was held: the second attempt's start-up
    # and compiling, and the steps done again.
    second = json.loads((run / ".xlaunch" / "time" / "attempt1.json").read_text())
    assert second["ended"] - second["started"] < t["held_s"] <= t["wall_s"]   # both attempts', not the queue's
    assert t["restart_s"] >= t["lost_s"] + (second["joined"] - second["started"]) and t["restart_s"] < t["held_s"]
    assert t["restart_share"] == pytest.approx(t["restart_s"] / t["held_s"])
    status = run_cli("status", str(run)).stdout
    assert re.search(r"^time +queued [\d.]+ s, start-up .*; goodput \d+% of [\d.]+ s, 2 attempts \(restarts cost "
                     r"[\d.]+ s, \d+% of the [\d.]+ s the allocation was held\)$", status, re.M), status
    # Its cost: one node (cluster=local) for the time the allocation was held, and its devices.
    cost = re.search(r"^cost +([\d.e-]+) node-hours, ([\d.e-]+) device-hours \(1 node for the ([\d.]+) s", status, re.M)
    assert cost, status
    assert float(cost[1]) == pytest.approx(float(cost[3]) / 3600, rel=0.01)
    assert float(cost[2]) == pytest.approx(resumed["global_devices"] * float(cost[1]), rel=0.01)
    # The curve in TensorBoard: the restart's first step purged what the killed attempt wrote
    # past its checkpoint, so every step has one loss, the uninterrupted run's; each attempt's time.
    curves = read_scalars(run)
    assert curves["loss"] == [(s, pytest.approx(v)) for s, v in enumerate(reference["losses"])]
    attempts = [step for step, _ in curves["time/steps_s"]]  # attempt 0's, unless its rank 0 was killed outright
    assert attempts in ([0, 1], [1]) and curves["time/steps_s"][-1][1] == pytest.approx(
        json.loads((run / ".xlaunch" / "time" / "attempt1.json").read_text())["steps_s"], rel=1e-3)
