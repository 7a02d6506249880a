"""mode=run: the user's own program on every task (issue 25).

The programs are the ones in examples/, written without xlaunch in mind (train_jax.py, train_flax.py)
or with its one call (resume.py: launcher.context()). What every launched run must print is what
the same file prints run by hand in one process with as many CPU devices (``reference``): the
same mesh over the same devices, so the same losses, whatever the processes, the cluster or the
container. A stop signal on SLURM is sent as a scheduler sends it (``scancel --signal=USR2``,
tests/test_requeue.py), to a program that ignores it and to one that saves and returns.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from launcher.clusters import _code
from launcher.clusters.base import free_port
from launcher.runtime import status, stop
from launcher.runtime.watch import RankReporter
from tests.launch import REPO, read_result, run_cli, xla_flags
from tests.test_requeue import RESTART_LINE, finish, launch, preempt_on_slurm, wait_for
import logging
from tests.test_containers import podman_overrides

STANDIN_BIN = REPO / "tests" / "clusterkit" / "bin"
HEADER = "process(es), 8 devices, mesh {'data': 4, 'model': 2}"


@functools.lru_cache(maxsize=None)
def reference(example: str, steps: int) -> dict[int, float]:
    """The losses of ``python examples/<example> --steps <steps>`` run by hand: one process with 8
    CPU devices, in a directory of its own (resume.py saves into ./checkpoints)."""
    with tempfile.TemporaryDirectory(prefix="xlaunch-run-reference-") as cwd:
        env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8"), "PYTHONPATH": str(REPO)}
        out = subprocess.run([sys.executable, str(REPO / "examples" / example), "--steps", str(steps)], cwd=cwd,
                             env=env, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "1 process(es), 8 devices" in out or example == "resume.py"
    return losses(out)


def losses(text: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in re.findall(r"^step (\d+) loss (\S+)$", text, re.M)}


def assert_same_losses(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want)
    # Printed to 7 digits; gloo's and the in-process all-reduce may differ in the last bit.
    np.testing.assert_allclose([got[k] for k in sorted(want)], [want[k] for k in sorted(want)], rtol=1e-5)


def log(run: Path, rank: int) -> str:
    return (run / "logs" / f"rank{rank}.log").read_text()


# --- composition: nothing starts ----------------------------------------------------------------

@pytest.mark.core
@pytest.mark.parametrize("overrides, message", [
    (["mode.target=examples.nope:main"],
     "mode.target=examples.nope:main: no module examples.nope in the code directory {repo} nor on the launcher's "
     "python path; give an importable module (run from the directory holding it, or set mode.code_dir)"),
    (["mode.script=examples/nope.py"],
     "mode.script=examples/nope.py (relative to the code directory {repo}): no such file; give the path of your "
     "script"),
    (["mode.target=examples.resume:train", "mode.kwargs.stepz=3"],
     "mode.kwargs.stepz: examples.resume:train takes no keyword argument 'stepz' (its arguments: steps, lr, "
     "save_every, width)"),
    (["mode.target=tests.run_programs:describe"],
     "mode.kwargs.x is required: tests.run_programs:describe has no default for it; add mode.kwargs.x=<value>"),
    ([], "mode=run needs a program: mode.script=path/to/train.py (with mode.args=[...]) or "
         "mode.target=module:function (with mode.kwargs.<name>=<value>)"),
], ids=["target-not-importable", "no-such-script", "kwarg-not-taken", "kwarg-missing", "no-program"])
def test_a_program_that_cannot_run_is_refused_before_submission(tmp_path, overrides, message):
    run = tmp_path / "run"
    proc = run_cli("mode=run", *overrides, run_dir=run, check=False, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == ["error: " + message.format(repo=REPO)]
    assert not (run / "job.json").exists() and not (run / "submitit").exists()  # nothing submitted


@pytest.mark.core
def test_the_code_a_pod_gets_is_what_git_keeps_or_what_include_names(tmp_path):
    code = tmp_path / "code"
    for name in ("train.py", "lib/util.py", "data/big.bin", "notes.log", "outputs/run/result.json"):
        (code / name).parent.mkdir(parents=True, exist_ok=True)
        (code / name).write_text(name)
    (code / ".gitignore").write_text("data/\n*.log\n")
    # No repository: git's own rules all the same; the run dir inside the code dir stays behind.
    assert _code.files(code, [], leave_out=code / "outputs") == [".gitignore", "lib/util.py", "train.py"]
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    subprocess.run(["git", "-C", str(code), "add", "train.py"], check=True)
    (code / "lib" / ".gitignore").write_text("util.py\n")  # a nested rule
    assert _code.files(code, []) == [".gitignore", "lib/.gitignore", "outputs/run/result.json", "train.py"]
    assert _code.files(code, ["*.py", "data/**"]) == ["data/big.bin", "train.py"]
    with pytest.raises(Exception, match=r"mode.include: 'src/\*\*' matches no file"):
        _code.files(code, ["src/**"])


@pytest.mark.core
def test_a_stop_request_reaches_the_program_then_the_job_is_handed_over_even_if_it_never_asks(tmp_path):
    """StopRequests in this process, with a stand-in for submitit's handler (which the task finds
    installed): signalled, told, handed over; a program that never asks is handed over after the
    grace period; a request an earlier run left is not this run's; a peer's request is heard,
    passed on by the job's watcher (a real one: rank 0 of a job of one)."""
    handed_over, ended = [], []

    def submitit_handler(signum, frame):
        handed_over.append(threading.current_thread().name)
        raise SystemExit(-1)  # what submitit does once it has requeued the job

    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    reporters = []

    def watched(attempt):
        reporter = RankReporter(tmp_path, 0, 1, attempt=attempt, node_root=tmp_path / "node")
        reporter.set("joined")
        reporter.start(15, 60, on_peer_failure=lambda why: None)
        reporters.append(reporter)
        return reporter.listen

    try:
        log_ = logging.getLogger("test-stop")
        stops = stop.StopRequests(tmp_path, 0, 1, attempt=0, grace_s=30, log=log_, forced_end=ended.append)
        stops.install(watched(0))
        assert not stops.should_stop()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stops.should_stop() and json.loads(status.stop_file(tmp_path).read_text())["attempt"] == 0
        with pytest.raises(SystemExit):
            stops.after_program()  # the program returned after saving: rank 0 hands over at once
        assert handed_over == ["MainThread"] and ended == []
        reporters.pop().stop()

        # Another rank was signalled (its file), this one was not; the program never asks.
        status.write_attempt(tmp_path, 1, "requeued")
        status.stop_file(tmp_path).write_text(json.dumps({"attempt": 1, "why": "SIGUSR2 on rank 1"}))
        late = stop.StopRequests(tmp_path, 0, 1, attempt=1, grace_s=0.2, log=log_, forced_end=ended.append)
        signal.signal(signal.SIGUSR2, submitit_handler)
        late.install(watched(1))
        deadline = time.monotonic() + 15
        while not ended and time.monotonic() < deadline:
            time.sleep(0.05)
        assert late.requested.is_set() and ended == [True] and handed_over[-1] != "MainThread"  # the grace timer's
        reporters.pop().stop()

        # Attempt 2 does not take attempt 1's request for its own.
        status.write_attempt(tmp_path, 2, "requeued")
        old = stop.StopRequests(tmp_path, 0, 1, attempt=2, grace_s=0.2, log=log_, forced_end=ended.append)
        signal.signal(signal.SIGUSR2, submitit_handler)
        old.install(watched(2))
        time.sleep(2.5 * status.HEARTBEAT_S)
        assert not old.requested.is_set()
        old.close()
    finally:
        signal.signal(signal.SIGUSR2, previous)
        for reporter in reporters:
            reporter.stop()


# --- local processes ---------------------------------------------------------------------------

@pytest.mark.core
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_plain_jax_script_runs_unchanged_on_local_processes(tmp_path):
    run = tmp_path / "run"
    run_cli("mode=run", "mode.script=examples/train_jax.py", "mode.args=[--steps,6]", run_dir=run, timeout=300)
    assert_same_losses(losses(log(run, 0)), reference("train_jax.py", 6))
    r = read_result(run)
    assert (r["mode"], r["program"], r["restart"], r["num_processes"], r["global_devices"]) == \
        ("run", "examples/train_jax.py", 0, 2, 8)
    assert r["code_dir"] == str(REPO) and "returned" not in r
    for rank in (0, 1):  # each rank's log holds what its process printed, after the launcher's lines
        text = log(run, rank)
        assert f"rank {rank}/2" in text and "running examples/train_jax.py in" in text
    assert f"2 {HEADER}" in log(run, 0) and "step 0 loss" not in log(run, 1)  # the script prints on process 0


@pytest.mark.core
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_over_a_functions_kwargs_makes_one_run_per_point(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli("-m", "mode=run", "mode.target=tests.run_programs:describe", "mode.kwargs.x=1,2,3",
                   "cluster.cpu_devices_per_task=1", f"hydra.sweep.dir={sweep}", timeout=300, check=False)
    assert proc.stderr.count("submitted job") == 3
    # The last point's second process exits with status 3: that job fails, naming the rank and its log.
    assert proc.returncode == 1
    failure = proc.stderr[proc.stderr.index("job failed: "):]
    assert re.match(r"job failed: rank 1 failed on \S+: ProgramFailed: mode.target=tests.run_programs:describe "
                    r"exited with status 3 \(log: \S+/logs/rank1.log\)", failure), failure
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert f"--- last lines of {runs[2]}/logs/rank1.log ---" in failure
    assert "describe point: rank 1 of 2, x=3" in log(runs[2], 1)
    for x, run in zip((1, 2), runs[:2], strict=True):
        r = read_result(run)
        assert r["program"] == "tests.run_programs:describe"
        expected = {"x": x, "tag": "point", "rank": 0, "num_processes": 2, "is_main": True, "restart": 0,
                    "run_dir": str(run), "checkpoint_dir": str(run / "checkpoints"), "checkpoint_dir_exists": True,
                    "launched": True, "cwd": str(REPO)}
        if x == 2:  # its own jax.distributed.initialize() found JAX initialised already, and went on
            expected["global_devices"] = 2
            assert "the program called jax.distributed.initialize" in log(run, 1)
        assert r["returned"] == expected
        assert f"describe point: rank 1 of 2, x={x}" in log(run, 1)


# --- clusters and containers -------------------------------------------------------------------

@pytest.mark.core
@pytest.mark.heavy  # a stop signal on SLURM; a stop request reaching the program is the default run's (above)
@pytest.mark.timeout(900)
def test_on_slurm_a_script_and_a_resumable_function_survive_a_stop_signal(slurm, tmp_path):
    """Two jobs at once on the tests' SLURM (2 nodes x 1 task x 4 devices each), both signalled as a
    scheduler does: the plain script ignores the request and is requeued after mode.stop_grace_s,
    runs again from its start and gives the one-process losses; resume.py saves when
    should_stop() says so, is requeued at once and goes on from its save, loss for loss."""
    plain, resumable = tmp_path / "plain", tmp_path / "resumable"
    nodes = ("cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1")
    jobs = {plain: launch(plain, "mode=run", "mode.script=examples/train_jax.py", "mode.args=[--steps,400]",
                          "mode.stop_grace_s=1", *nodes, env=slurm.env),
            resumable: launch(resumable, "mode=run", "mode.target=examples.resume:train", "mode.kwargs.steps=400",
                              *nodes, env=slurm.env)}

    def stop_at_step_10(run: Path) -> None:
        # Each job is signalled as soon as it is at step 10, not once both are: a job waited on
        # while the other starts can finish its 400 steps first (it did in CI), and SLURM then
        # answers the signal with "Invalid job id specified".
        wait_for(jobs[run], lambda: (run / "logs" / "rank0.log").exists() and "step 10 " in log(run, 0), "step 10")
        preempt_on_slurm(slurm, run)  # and lets it start again once requeued

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(stop_at_step_10, jobs))
    for run, proc in jobs.items():
        out = finish(proc, run)
        assert proc.returncode == 0, out
        assert "requeued (requeued after SIGUSR2): restart 1 of at most cluster.max_requeues=3" in out
        assert read_result(run)["restart"] == 1

    before, _, after = log(plain, 0).partition(RESTART_LINE)
    assert "the program has not stopped 1 s after the request (mode.stop_grace_s)" in before
    assert_same_losses(losses(after), reference("train_jax.py", 400))  # the whole run again, unchanged

    before, _, after = log(resumable, 0).partition(RESTART_LINE)
    assert "should_stop() is True" in before and "should_stop() is True" in log(resumable, 1).partition(RESTART_LINE)[0]
    first, second = losses(before), losses(after)
    stopped_at = max(first) + 1
    assert f"resuming from step {stopped_at} (restart 1)" in after and min(second) == stopped_at
    assert_same_losses({**first, **second}, reference("resume.py", 400))
    returned = read_result(resumable)["returned"]
    assert returned["steps"] == 400 and returned["restart"] == 1


@pytest.mark.core
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mpirun_runs_the_script_unchanged(tmp_path):
    run = tmp_path / "run"
    run_cli("mode=run", "mode.script=examples/train_jax.py", "mode.args=[--steps,6]", "cluster=mpi-local",
            run_dir=run, timeout=300)  # 4 ranks x 2 devices
    assert f"4 {HEADER}" in log(run, 0)
    assert_same_losses(losses(log(run, 0)), reference("train_jax.py", 6))
    assert read_result(run)["num_processes"] == 4


@pytest.mark.slow
@pytest.mark.heavy  # tasks inside podman run by default in test_containers.py; this is mode=run's example there
@pytest.mark.timeout(600)
def test_the_flax_example_runs_in_a_podman_container_and_a_bad_kwarg_is_refused_there(container_image, tmp_path):

    # In a container the launcher's python cannot look into the task's: the task refuses it when it
    # starts, and the launcher ends as for any bad input: one line, exit status 2.
    bad = run_cli("mode=run", "mode.target=examples.resume:train", "mode.kwargs.stepz=3",
                  *podman_overrides(container_image), run_dir=tmp_path / "bad", check=False, timeout=300)
    assert bad.returncode == 2 and (tmp_path / "bad" / "job.json").exists()
    assert bad.stderr.strip().splitlines()[-1].endswith(
        "mode.kwargs.stepz: examples.resume:train takes no keyword argument 'stepz' (its arguments: steps, lr, "
        "save_every, width)")

    run = tmp_path / "run"
    run_cli("mode=run", "mode.script=examples/train_flax.py", "mode.args=[--steps,5]",
            *podman_overrides(container_image), run_dir=run, timeout=300)
    assert f"2 {HEADER}" in log(run, 0)
    assert_same_losses(losses(log(run, 0)), reference("train_flax.py", 5))
    status = json.loads((run / ".xlaunch" / "ranks" / "rank0.json").read_text())
    assert status["pid"] == 1 and status["state"] == "done"  # it ran in the container


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_tpu_pod_runs_a_copy_of_the_code(tmp_path):
    code, pod, run = tmp_path / "code", tmp_path / "pod", tmp_path / "2030-01-01" / "run"
    (code / "data").mkdir(parents=True)
    (code / "train.py").write_text((REPO / "examples" / "train_jax.py").read_text())
    (code / "data" / "big.bin").write_text("not code")
    (code / ".gitignore").write_text("data/\n")
    env = {"PATH": f"{STANDIN_BIN}:{os.environ['PATH']}", "XLAUNCH_STANDIN_TPU_ROOT": str(pod),
           "XLAUNCH_STANDIN_TPU_WORKERS": "2", "PYTHONPATH": str(REPO)}  # the workers' xlaunch is this one
    run_cli("mode=run", f"mode.code_dir={code}", "mode.script=train.py", "mode.args=[--steps,6]", "cluster=tpu",
            "cluster.tpu_name=pod-a", "cluster.nodes=2", "cluster.accelerator=cpu", "cluster.cpu_devices_per_task=4",
            f"cluster.remote_python={sys.executable}", f"launcher.coordinator_port={free_port()}", run_dir=run,
            env=env, timeout=300)
    assert_same_losses(losses(log(run, 0)), reference("train_jax.py", 6))
    for w in (0, 1):  # each worker ran the program from its own copy: what git keeps, no data
        copy = pod / f"worker{w}" / "xlaunch-runs" / "2030-01-01" / "run-code"
        assert (copy / "train.py").read_text() == (code / "train.py").read_text() and not (copy / "data").exists()
        assert f"running train.py in {copy}" in (run / "logs" / f"rank{w}.log").read_text()
    assert read_result(run)["code_dir"] == str(pod / "worker0" / "xlaunch-runs" / "2030-01-01" / "run-code")
    calls = [json.loads(line) for line in (pod / "calls.log").read_text().splitlines()]
    assert [c[3] for c in calls] == ["ssh", "scp", "scp", "ssh", "scp", "scp"]  # mkdir, task, code, run, 2 x back
    assert calls[2][4:] == [str(run / "code.tar.gz"), "pod-a:xlaunch-runs/2030-01-01/run-code/", "--worker=all"]
    assert calls[3][5].startswith("--command=set -e\ntar -xzf xlaunch-runs/2030-01-01/run-code/code.tar.gz -C "
                                  "xlaunch-runs/2030-01-01/run-code\nexport XLAUNCH_CODE_DIR=\"$HOME\"/")
    script = (run / "submission.sh").read_text()
    assert 'scp "$local/code.tar.gz" pod-a:xlaunch-runs/2030-01-01/run-code/ --worker=all' in script
