"""More ranks than the rest of the suite starts (the heavy stage, ``pytest -m heavy``): real jobs
of 32 one-device ranks on the embedded default and on the tests' SLURM, launched, every rank
joined, one killed and named, the rest stopped; and the run dir's traffic counted with strace on
real jobs of 4 and 12 ranks, the same per rank. The counts at up to 4,096 ranks:
bench/bench_scale.py."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from launcher.runtime import status
from tests.clusterkit.slurm import LocalSlurm
from tests.launch import REPO
from tests.test_launcher_local import _leftover_tasks

pytestmark = pytest.mark.heavy
SLEEPER = "import time\nfor _ in range(900):\n    time.sleep(1)\n"


def _kill_one_of(n: int, cluster: list[str], tmp_path: Path, env: dict | None = None) -> Path:
    """A job of ``n`` ranks sleeping: every rank joins, rank n/2 is killed, the launcher names it
    within seconds and stops the others."""
    program = tmp_path / "sleeper.py"
    program.write_text(SLEEPER)
    run = tmp_path / "run"
    t0 = time.monotonic()
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "mode=run", f"mode.script={program}",
                                 "cluster.cpu_devices_per_task=1", "launcher.init_timeout_s=900", *cluster,
                                 f"hydra.run.dir={run}"], cwd=REPO, env={**os.environ, **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and launcher.poll() is None:
            statuses = status.read_statuses(run)
            if len(statuses) == n and all(st.state == "joined" for st, _ in statuses.values()):
                break
            time.sleep(2)
        assert launcher.poll() is None, launcher.communicate()[1]
        joined_s = time.monotonic() - t0
        victim = n // 2
        pid = status.read_statuses(run)[victim][0].pid
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        _, err = launcher.communicate(timeout=180)
        named_s = time.monotonic() - killed
    finally:
        launcher.kill()
    assert launcher.returncode == 1, err
    assert re.search(rf"rank {victim} \(pid {pid}\) died on \S+ without reporting an error", err), err
    assert named_s < 60, named_s  # named within seconds; the rest is stopping 31 processes on 2 cores
    print(f"{n} ranks {' '.join(cluster)}: all joined after {joined_s:.0f} s; killed rank named, job ended "
          f"after {named_s:.1f} s")
    return run


@pytest.mark.timeout(1500)
def test_a_job_of_32_ranks_on_local_processes(tmp_path):
    run = _kill_one_of(32, ["cluster=local", "cluster.tasks_per_node=32"], tmp_path)
    assert not _leftover_tasks(run)


@pytest.mark.timeout(1500)
def test_a_job_of_32_ranks_on_slurm(tmp_path):
    """Two pretend nodes of 16 tasks each: the test SLURM declares 16 CPUs a node (its
    slurmd take the declared count as it is), so the 32 tasks share this machine's 2 cores."""
    root = Path(tempfile.mkdtemp(prefix="xlaunch-slurm-", dir="/tmp"))
    root.chmod(0o755)
    slurm = LocalSlurm(root, cpus_per_node=16).start()
    try:
        _kill_one_of(32, ["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=16"], tmp_path, slurm.env)
    finally:
        slurm.stop()
        shutil.rmtree(root, ignore_errors=True)


def _traced_calls_per_rank_s(n: int, tmp_path: Path, seconds: int = 40, stepping: bool = False) -> float:
    """A real mode=run job of ``n`` ranks sleeping ``seconds`` (``stepping``: in steps of 0.2 s,
    each told to the launcher, so that every rank publishes its host time per step), traced with
    strace: calls naming its run dir (launcher and ranks together), per rank and second, counted
    while every rank's program ran (each marks its start and end outside the run dir), so that
    start-up, which this loaded machine stretches, is not spread over the count."""
    marks = tmp_path / f"marks{n}{stepping}"
    marks.mkdir()
    program = tmp_path / f"sleep{n}{stepping}.py"
    sleep = (f"import launcher\nfor _ in range({seconds * 5}):\n    time.sleep(0.2)\n    launcher.context().step()\n"
             if stepping else f"time.sleep({seconds})\n")
    program.write_text("import os, sys, time\n"
                       f"open(os.path.join({str(marks)!r}, f'start.{{os.getpid()}}'), 'w').write(repr(time.time()))\n"
                       + sleep +
                       f"open(os.path.join({str(marks)!r}, f'end.{{os.getpid()}}'), 'w').write(repr(time.time()))\n")
    run = tmp_path / f"run{n}{stepping}"
    trace = tmp_path / f"trace{n}{stepping}.txt"
    subprocess.run(["strace", "-f", "-qq", "-ttt", "--seccomp-bpf", "-e", "trace=%file", "-o", str(trace),
                    sys.executable, "-m", "launcher", "mode=run", f"mode.script={program}",
                    "cluster.cpu_devices_per_task=1", f"cluster.tasks_per_node={n}", f"hydra.run.dir={run}"],
                   cwd=REPO, check=True, capture_output=True, timeout=900)
    starts = [float(p.read_text()) for p in marks.glob("start.*")]
    ends = [float(p.read_text()) for p in marks.glob("end.*")]
    assert len(starts) == len(ends) == n
    window = (max(starts) + 2, min(ends))  # a beat on: every rank's heartbeat running
    assert window[1] - window[0] > seconds / 2, window
    calls = 0
    for line in trace.read_text(errors="replace").splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and str(run) in parts[2] and window[0] <= float(parts[1]) < window[1]:
            calls += 1
    return calls / n / (window[1] - window[0])


@pytest.mark.timeout(1500)
def test_a_traced_job_costs_the_run_dir_the_same_per_rank_at_4_and_12_ranks(tmp_path):
    assert shutil.which("strace"), "strace is not installed: .ci/install.sh installs it (apt-get install strace)"
    at4, at12 = _traced_calls_per_rank_s(4, tmp_path), _traced_calls_per_rank_s(12, tmp_path)
    print(f"run-dir calls per rank per second: {at4:.2f} at 4 ranks, {at12:.2f} at 12")
    assert at4 < 4 and at12 < 3, (at4, at12)
    assert max(at4, at12) / min(at4, at12) < 1.5, (at4, at12)


@pytest.mark.timeout(900)
def test_a_stepping_job_whose_ranks_publish_their_steps_stays_within_3_calls_per_rank_per_second(tmp_path):
    """Each rank's host time per step goes into its status file (runtime/straggler.py) at most
    every 4 s, in place of a heartbeat's touch: 12 ranks stepping five times a second."""
    at12 = _traced_calls_per_rank_s(12, tmp_path, stepping=True)
    print(f"run-dir calls per rank per second, 12 ranks stepping: {at12:.2f}")
    assert at12 < 3, at12
