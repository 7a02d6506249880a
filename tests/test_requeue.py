"""Requeue on timeout and preemption (issue 18).

On the tests' real SLURM (conftest: two pretend nodes, real accounting), a job is sent submitit's
preemption signal the way a scheduler sends it (``scancel --signal=USR2 <job>``: every task gets
it; SLURM's own ``--signal=USR2@90`` before the time limit is the same signal) in the middle of
training and in the middle of a CFP profile: rank 0's submitit handler asks the task for the
job's next pickle and runs ``scontrol requeue``; the same job id runs again in the same run dir
and ends with what an uninterrupted run gives. cluster=local says it cannot requeue and keeps
what was computed, from which the same command resumes.

SLURM holds a requeued job until its step credentials expire (``CredExpire``, 120 s by default)
before it may start again; the tests start it as soon as it is pending (``scontrol update
StartTime=now``, what an administrator may do) instead of waiting two minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.clusters.base import Cluster, requeuing_backends
from launcher.runtime.watch import RankReporter
from launcher.runtime import requeue, status
from launcher.runtime.context import Launch
from launcher.runtime.task import Task
from tests.launch import REPO, read_result, run_cli
from tests.train_reference import CHECKPOINT_EVERY, LOCAL, SLURM, STEPS, TRAIN, uninterrupted
import pickle
from launcher.cli.schema import register
from hydra import compose, initialize_config_dir

RESTART_LINE = "=== restart 1 (requeued after SIGUSR2) ==="


def cfg(cluster: str = "slurm", backend: str = "slurm", max_requeues: int = 3):
    return OmegaConf.create({"cluster": {"name": cluster, "backend": backend, "max_requeues": max_requeues}})


# --- the pieces, in this process ------------------------------------------------------------------

@pytest.mark.core
def test_only_slurm_requeues_and_at_most_max_requeues_times(tmp_path):
    def why_not(c, attempt):  # as a task asks, with what the launcher told it of its backend
        return requeue.why_not(c, tmp_path, attempt, Cluster.of(c.cluster).requeues, requeuing_backends())

    assert why_not(cfg(), attempt=2) == ""
    refused = why_not(cfg(), attempt=3)
    assert "cluster.max_requeues=3 reached" in refused and f"hydra.run.dir={tmp_path}" in refused
    for name, backend in (("local", "local"), ("mpi-local", "mpi"), ("tpu", "tpu")):
        why = why_not(cfg(name, backend), attempt=0)
        assert f"cluster={name} cannot requeue a job (only SLURM can)" in why and "SIGUSR2" in why


@pytest.mark.core
def test_the_attempt_is_the_pickled_one_or_slurms_restart_count():
    assert requeue.attempt_of(0, {}) == (0, "")
    assert requeue.attempt_of(1, {"SLURM_RESTART_COUNT": "1"}) == (1, "requeued after SIGUSR2")
    # SLURM requeued the job by itself (a node failure with --requeue): the pickle is the old one.
    assert requeue.attempt_of(0, {"SLURM_RESTART_COUNT": "2"}) == (2, "requeued by SLURM")


@pytest.mark.core
def test_a_run_ended_by_the_requeue_is_told_from_a_failure():
    killed = subprocess.CalledProcessError(-15, ["scontrol", "requeue", "1"])   # by the requeue it asked for
    refused = subprocess.CalledProcessError(1, ["scontrol", "requeue", "1"])
    requeued, restarted = {"attempt": 1, "reason": "requeued after SIGUSR2"}, {"attempt": 1, "reason": "restarted after: x"}
    # The rank that requeued: submitit's exit, or its scontrol killed by the requeue; not scontrol refusing.
    assert requeue.ended_by_requeue(SystemExit(-1), 0, True, requeued)
    assert requeue.ended_by_requeue(killed, 0, True, requeued)
    assert not requeue.ended_by_requeue(refused, 0, True, requeued)
    # The others: anything, once the run dir is on a requeued later attempt (not a launcher's restart).
    lost = RuntimeError("Gloo all-reduce failed: Connection closed by peer")
    assert requeue.ended_by_requeue(lost, 0, False, requeued)
    assert not requeue.ended_by_requeue(lost, 1, False, requeued)
    assert not requeue.ended_by_requeue(lost, 0, False, restarted)
    assert not requeue.ended_by_requeue(lost, 0, False, {"attempt": 0})


@pytest.mark.core
def test_the_ranks_of_a_requeued_attempt_are_not_read_as_failures(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    old = RankReporter(tmp_path, 0, 2, attempt=0)
    old.set("joined")
    old.status.pid = int(dead)  # it was killed when SLURM requeued the job
    old.set("joined")
    assert "died" in status.peer_failure(tmp_path, 15, 60)
    status.write_attempt(tmp_path, 1, "requeued after SIGUSR2")
    assert status.peer_failure(tmp_path, 15, 60) == "" and status.read_statuses(tmp_path) == {}
    status.write_attempt(tmp_path, 0, "late writer")  # never back to an earlier attempt
    assert status.read_attempt(tmp_path)["attempt"] == 1
    RankReporter(tmp_path, 1, 2, attempt=1).set("joined")
    assert list(status.read_statuses(tmp_path)) == [1]


@pytest.mark.core
def test_the_task_hands_submitit_its_next_attempt_or_says_why_not(tmp_path):

    register()

    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        slurm = compose("config", ["cluster=slurm", "mode=check"])
        local = compose("config", ["cluster=local", "mode=check"])
    # What the launcher hands each task (launcher/cli/submit.py): SLURM can requeue, local cannot.
    task = Task(slurm, tmp_path, Launch(12345, "launcher.modes.runs.check:run", "check", requeues=True))
    nxt = task.checkpoint()
    assert nxt.function is not task and nxt.function.attempt == 1 and task.attempt == 0
    assert status.read_attempt(tmp_path)["reason"] == "requeued after SIGUSR2"
    again = pickle.loads(pickle.dumps(nxt.function))  # what the requeued job loads
    assert again.attempt == 1 and again._running == {} and again.cfg == task.cfg
    assert Task(local, tmp_path / "local", Launch(1, "launcher.modes.runs.check:run", "check")).checkpoint() is None


@pytest.mark.core
@pytest.mark.parametrize("override, message", [
    ("cluster.max_requeues=-1", "cluster.max_requeues=-1: must be 0 (never requeue) or more"),
    ("mode.checkpoint_every=-2", "mode.checkpoint_every=-2: must be 0 (no checkpoints) or a number of steps"),
])
def test_bad_requeue_and_checkpoint_settings_are_refused_before_submission(tmp_path, override, message):
    # 8 devices, which split the tiny GPT's batch of 8 (the slurm default's 16 would not).
    proc = run_cli("mode=train", "cluster=slurm", "cluster.cpu_devices_per_task=2", override, "launcher.dry_run=true",
                   run_dir=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == f"error: {message}"
    assert not (tmp_path / "submission.sh").exists()  # nothing was written as if submitted


# --- end to end -----------------------------------------------------------------------------------

def launch(run: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    """The CLI in the background, its output in <run>.out."""
    run.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "launcher", *overrides, f"hydra.run.dir={run}"], cwd=REPO,
                            env={**os.environ, **(env or {})}, stdout=open(f"{run}.out", "w"),
                            stderr=subprocess.STDOUT, text=True)


def wait_for(proc: subprocess.Popen, ready, what: str, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the job ended before {what}:\n{_output_of(proc)}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def _output_of(proc: subprocess.Popen, lines: int = 30) -> str:
    """The last lines of what ``launch`` wrote to <run>.out (why a job ended early)."""
    run = next(a.split("=", 1)[1] for a in proc.args if str(a).startswith("hydra.run.dir="))
    try:
        return "\n".join(Path(f"{run}.out").read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no output: {e})"


def finish(proc: subprocess.Popen, run: Path, timeout: float = 600) -> str:
    proc.wait(timeout=timeout)
    return Path(f"{run}.out").read_text()


def preempt_on_slurm(slurm, run: Path) -> None:
    """``scancel --signal=USR2`` to every task of the run's job, then, once SLURM holds the
    requeued job, lets it start (see the module's docstring)."""
    job = json.loads((run / "job.json").read_text())["job_id"]
    subprocess.run(["scancel", "--signal=USR2", job], check=True, env=slurm.environ(), timeout=30)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                               env=slurm.environ(), timeout=30).stdout.strip()
        if state == "PENDING":
            # What `xlaunch status` says of a job waiting to run again.
            seen = json.loads(run_cli("status", str(run), "--json", env=slurm.env, timeout=60).stdout)
            assert seen["state"] == "requeued" and seen["attempt"] == 1, seen
            assert "requeued after SIGUSR2" in seen["detail"] and seen["scheduler"].startswith("SLURM PENDING")
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True,
                           env=slurm.environ(), timeout=30)
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job} was not requeued within 120 s of the signal")


def assert_restarted_once(run: Path, ranks: int = 2) -> None:
    for rank in range(ranks):
        log = (run / "logs" / f"rank{rank}.log").read_text()
        before, _, after = log.partition(RESTART_LINE)
        # One file per rank across both runs: the first run's lines, the marker, the second's.
        assert after and "joined in" in before and "joined in" in after and RESTART_LINE not in after


@pytest.mark.core
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_job_preempted_in_the_middle_of_training_is_requeued_and_ends_as_if_uninterrupted(slurm, tmp_path):
    reference = read_result(uninterrupted())
    run = tmp_path / "run"
    proc = launch(run, *TRAIN, *SLURM, env=slurm.env)
    wait_for(proc, lambda: (run / "checkpoints" / str(CHECKPOINT_EVERY)).is_dir(), "the first checkpoint")
    preempt_on_slurm(slurm, run)
    out = finish(proc, run)
    assert proc.returncode == 0, out
    assert "requeued (requeued after SIGUSR2): restart 1 of at most cluster.max_requeues=3" in out
    result = read_result(run)
    assert CHECKPOINT_EVERY <= result["resumed_from_step"] <= STEPS
    assert result["losses"] == reference["losses"]  # loss for loss, as the uninterrupted run
    assert_restarted_once(run)
    assert "SIGUSR2: requeueing the job (restart 1" in (run / "logs" / "rank0.log").read_text()


@pytest.mark.heavy  # not core: the profile store's resumption is the same on every JAX, and it is the longest
@pytest.mark.timeout(900)
def test_a_job_preempted_in_the_middle_of_profiling_is_requeued_and_measures_nothing_twice(slurm, tmp_path):
    run, store = tmp_path / "run", tmp_path / "store"
    small = ["model=gpt-tiny", "model.num_layers=1", "model.hidden=6", "model.heads=2", "model.ffn_dim=6",
             "model.vocab_size=512", "model.seq_len=16", "model.batch_size=8"]
    # The race the suite once lost: submitit's `scontrol requeue` runs inside the job step that
    # the requeue stops, and may be killed before it returns. Here it always is (the request made,
    # then SIGTERM), so rank 0's run ends in an error from submitit's handler; the attempt must still
    # end as a requeue (no failed result for submitit to write) and the launcher wait for the next.
    wrapped = tmp_path / "bin"
    wrapped.mkdir()
    (wrapped / "scontrol").write_text(f'#!/bin/sh\n{shutil.which("scontrol")} "$@"\nstatus=$?\n'
                                      '[ "$1" = requeue ] && kill -TERM $$\nexit $status\n')
    (wrapped / "scontrol").chmod(0o755)
    path = f"cluster.setup=['export PATH={wrapped}:$PATH']"
    proc = launch(run, "mode=profile", *small, "mode.repeats=2", "mode.max_segment_space=9",
                  f"mode.store_dir={store}", *SLURM, path, env=slurm.env)
    wait_for(proc, lambda: len(list(store.glob("*.json"))) >= 2, "two stored profile entries")
    preempt_on_slurm(slurm, run)
    # What the first run measured, as it was: the requeued run must read it, not measure it again.
    first = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in store.glob("*.json")}
    out = finish(proc, run)
    assert proc.returncode == 0, out
    result = read_result(run)
    assert result["reused_configs"] >= 1
    assert result["measured_configs"] + result["reused_configs"] == result["profiled_configs"]
    for name, (mtime, data) in first.items():
        p = store / name
        assert (p.stat().st_mtime_ns, p.read_bytes()) == (mtime, data), f"{name} was measured again"
    assert_restarted_once(run)
    rank0 = (run / "logs" / "rank0.log").read_text()
    # Rank 0's run ends in the handler's error, or, where the error lands inside code that turns
    # every exception into a warning (JAX's compilation-cache write does), goes on until the
    # requeue's stop ends it: either way the attempt ended as a requeue (above).
    assert ("this run ends here: the job was requeued (CalledProcessError: Command '['scontrol', 'requeue'" in rank0
            or "Error writing persistent compilation cache entry for" in rank0
            and "CalledProcessError: Command '['scontrol', 'requeue'" in rank0), rank0[-3000:]
    # An uninterrupted run over the same store finds everything there: the requeued run left the
    # store an uninterrupted run leaves.
    run_cli("mode=profile", *small, "mode.repeats=2", "mode.max_segment_space=9", f"mode.store_dir={store}",
            *SLURM, run_dir=tmp_path / "again", env=slurm.env, timeout=600)
    again = read_result(tmp_path / "again")
    assert again["measured_configs"] == 0 and again["profiled_configs"] == result["profiled_configs"]


@pytest.mark.core
@pytest.mark.heavy  # a training run stopped and resumed by hand; SLURM's requeue is the default run's
@pytest.mark.timeout(900)
def test_cluster_local_says_it_cannot_requeue_and_the_same_command_resumes(tmp_path):
    reference = read_result(uninterrupted())
    run = tmp_path / "run"
    proc = launch(run, *TRAIN, *LOCAL)
    wait_for(proc, lambda: (run / "checkpoints" / str(CHECKPOINT_EVERY)).is_dir(), "the first checkpoint")
    # As submitit's local controller signals a job near its time limit: every task.
    for st, _ in status.read_statuses(run).values():
        os.kill(st.pid, signal.SIGUSR2)
    out = finish(proc, run)
    assert proc.returncode == 1, out
    assert "cluster=local cannot requeue a job (only SLURM can)" in out and f"hydra.run.dir={run}" in out
    assert (run / "checkpoints" / str(CHECKPOINT_EVERY)).is_dir()  # what was computed is kept

    run_cli(*TRAIN, *LOCAL, run_dir=run, timeout=600)  # the same command, in the same run dir
    result = read_result(run)
    assert result["resumed_from_step"] >= CHECKPOINT_EVERY and result["losses"] == reference["losses"]
