"""A slow rank named (launcher/runtime/straggler.py, issue 65): each rank's host-side work per
step, the job's watcher scoring the ranks, the launcher's one line, and what xlaunch status,
result.json and TensorBoard keep.

The jobs (heavy stage) run tests/programs/straggler.py: 8 ranks meeting in an all-reduce every
step, one rank's NumPy work 1.3x the others', and nothing but ``context().log(step, loss=...)``
told to the launcher. The scale bench (bench/bench_scale.py --slow) names one at 4,096 ranks.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.runtime import status, straggler
from launcher.runtime.watch import JobWatch, RankReporter, Watch, read_watch
from tests.launch import REPO, read_result, read_scalars, run_cli
from tests.test_operate import one_line_error

WARNING = re.compile(r"rank (\d+) on (\S+) is slow: its host-side work took more than launcher\.straggler\.factor=")


class Ticks:
    """A CPU clock the test moves by hand: what a rank's main thread spent."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_step_is_what_the_program_says_one_is():
    cpu = Ticks()
    clock = straggler.StepClock(3, cpu=cpu)
    for spent in (5.0, 0.1, 0.2, 0.3):   # the first mark only starts the count (a compile before it)
        cpu.now += spent
        clock.mark()
    assert clock.steps == 3 and clock.figures()["host_s"] == pytest.approx(0.2)
    assert clock.figures()["low_s"] == pytest.approx(0.1)
    # Numbered steps (log): every tenth logged counts ten; a second scalar of a step counts none;
    # step() calls are not counted again once the program numbers its steps.
    clock = straggler.StepClock(4, cpu=cpu)
    clock.mark(0)
    cpu.now += 2.0
    clock.mark(10)
    clock.mark(10)
    clock.mark()
    assert clock.steps == 10 and clock.figures()["host_s"] == pytest.approx(0.2)
    # A restart's steps start below the last: the count starts again from there, nothing negative.
    cpu.now += 1.0
    clock.mark(3)
    assert clock.steps == 10
    cpu.now += 0.4
    clock.mark(4)
    assert clock.steps == 11 and clock.figures()["host_s"] == pytest.approx(0.2)


def test_scores_against_the_median_rank_and_a_rank_s_own_best():
    # Every rank's steps swing with the load (its fastest 0.08 s, its median 0.10 s).
    f = {r: ("n1", {"steps": 20, "host_s": 0.10, "low_s": 0.08, "best_s": 0.10}) for r in range(7)}
    f[3] = ("n2", {"steps": 20, "host_s": 0.13, "low_s": 0.10, "best_s": 0.13})      # slow, even at its best
    f[5] = ("n1", {"steps": 20, "host_s": 0.13, "low_s": 0.09, "best_s": 0.065})     # slow at times only
    median, ranked = straggler.scores(f, factor=1.2)
    assert median == pytest.approx(0.10)
    assert [s.rank for s in ranked[:2]] == [3, 5]
    assert ranked[0].relative == pytest.approx(0.10 / 0.13) and ranked[0].slow and ranked[0].node == "n2"
    assert not ranked[1].slow and ranked[1].individual == pytest.approx(0.5)
    entry = straggler.watch_entry(median, ranked)
    assert [s["rank"] for s in entry["slow"]] == [3] and entry["relative"]["3"] == pytest.approx(0.7692, abs=1e-4)
    scalars = straggler.tensorboard(entry)
    assert scalars["slowest_rank"] == 3 and scalars["slow_ranks"] == 1 and scalars["individual_min"] == 0.5
    assert scalars["relative/rank3"] == entry["relative"]["3"]
    # Its next window dips under the line (0.118 s a step): found slow, it stays named slow.
    f[3] = ("n2", {"steps": 30, "host_s": 0.118, "low_s": 0.10, "best_s": 0.118})
    later = straggler.watch_entry(*straggler.scores(f, factor=1.2))
    assert later["slow"] == [] and [s["rank"] for s in later["slowest"][:2]] == [5, 3]
    kept = straggler.keep_found(later, entry)
    assert kept["slow"] == entry["slow"] and kept["slowest"] == later["slowest"]


def test_a_rank_slow_for_one_window_of_two_is_not_named():
    """Once the ranks have two windows of steps, the window before must say slow too: a burst of
    ten slow steps (as shared cores give one rank now and then) is not a slow rank."""
    clocks = {r: straggler.StepClock(4) for r in range(5)}
    for r, clock in clocks.items():
        clock.record(0.10 if r != 2 else 0.13, 0.2, steps=4)
    first = straggler.scores({r: ("n", c.figures()) for r, c in clocks.items()}, factor=1.2)[1]
    assert [s.rank for s in first if s.slow] == [2] and first[0].over == 4   # slow from the start: its first window
    for r, clock in clocks.items():
        clock.record(0.13 if r in (2, 4) else 0.10, 0.2, steps=4)   # rank 4's burst: one window
    figures = {r: ("n", c.figures()) for r, c in clocks.items()}
    assert figures[4][1]["before_s"] == pytest.approx(0.10) and figures[4][1]["host_s"] == pytest.approx(0.13)
    later = straggler.scores(figures, factor=1.2)[1]
    assert [s.rank for s in later if s.slow] == [2] and {s.over for s in later} == {8}
    # Its score too is its better window's: the burst is not what it is ranked by.
    assert later[0].relative == pytest.approx(0.10 / 0.13) and {s.rank: s.relative for s in later}[4] == 1.0
    text = straggler.warning(later[0].to_dict(), 0.10, 1.2, 4)
    assert "over its last 8 steps" in text and "relative score 0.77" in text


@pytest.mark.core
def test_the_watch_names_a_slow_rank_from_the_ranks_status_files(tmp_path):
    """Six ranks (the real reporters and watcher, in this process) publish their figures; the
    launcher's reading of the watch names the one that stayed slow, and xlaunch status shows it."""
    run = tmp_path / "run"
    run.mkdir()
    # The job's process, as the local backend knows one: its pid, its command line naming the run dir.
    job = subprocess.Popen(["sh", "-c", f"sleep 120 # {run}"])
    (run / "job.json").write_text(json.dumps({"job_id": str(job.pid), "backend": "local", "submitted": time.time(),
                                              "host": socket.gethostname(), "run_dir": str(run), "mode": "run",
                                              "cluster": "local", "ranks": 6}))
    (run / "resolved_config.yaml").write_text("cluster: {name: local, backend: local}\n"
                                              "launcher: {straggler: {factor: 1.2, steps: 5}}\n")
    ended: dict[int, str] = {}
    reporters = [RankReporter(run, r, 6, node_root=tmp_path / "node") for r in range(6)]
    for rep in reporters:
        rep.step_clock = straggler.StepClock(5)
        rep.set("joined")
        rep.start(15, 60, on_peer_failure=lambda why, r=rep.rank: ended.setdefault(r, why), straggler_factor=1.2)
    stop = threading.Event()

    def steps() -> None:
        while not stop.wait(0.05):
            for rep in reporters:
                rep.step_clock.record(0.026 if rep.rank == 4 else 0.020, 0.03)

    feeder = threading.Thread(target=steps, daemon=True)
    feeder.start()
    try:
        assert status.wait_until(lambda: (read_watch(run) or Watch()).stragglers.get("scored") == 6, 20)
        seen = JobWatch(run, 6, 15, 60, 1.2).read(0)
        assert [s["rank"] for s in seen.stragglers["slow"]] == [4] and not ended
        assert seen.stragglers["slowest"][0]["relative"] == pytest.approx(0.020 / 0.026, abs=1e-3)
        out = run_cli("status", str(run)).stdout
        assert re.search(r"slowest ranks +host work a step against the median rank's 20\.0 ms \(6 ranks scored\)", out)
        assert re.search(r"rank 4 on \S+: relative 0\.77, individual 1\.00, 26\.0 ms \(slow\)", out), out
    finally:
        stop.set()
        for rep in reporters:
            rep.stop()
        job.kill()


@pytest.mark.parametrize("setting, message", [
    ("launcher.straggler.factor=1", "launcher.straggler.factor=1.0: must be more than 1"),
    ("launcher.straggler.steps=2", "launcher.straggler.steps=2: must be at least 3"),
])
def test_a_straggler_setting_that_cannot_work_is_refused(tmp_path, setting, message):
    r = run_cli("mode=check", setting, "launcher.dry_run=true", run_dir=tmp_path / "run", check=False)
    one_line_error(r, message)


# --- real jobs (the heavy stage) ------------------------------------------------------------

PROGRAM = ["mode=run", "mode.script=tests/programs/straggler.py", "cluster.cpu_devices_per_task=1"]


def _job(tmp_path: Path, args: list[str], cluster: list[str], env: dict | None = None) -> tuple[Path, list, str]:
    """Runs the program; returns its run dir, each launcher stderr line with when it came, and
    all of stderr."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *PROGRAM, f"mode.args=[{','.join(args)}]", *cluster,
                             "launcher.progress_every_s=10", f"hydra.run.dir={run}"], cwd=REPO,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.time(), line) for line in proc.stderr), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=500)
    finally:
        proc.kill()
    reader.join(10)
    err = "".join(line for _, line in lines)
    assert proc.returncode == 0, err
    return run, lines, err


def _named_slow(run: Path, lines: list, rank: int, node: str) -> None:
    """One warning, for ``rank`` on ``node``, within 20 of the job's steps; and kept."""
    warnings = [(t, m) for t, line in lines if (m := WARNING.search(line))]
    assert [(int(m[1]), m[2]) for _, m in warnings] == [(rank, node)], [line for _, line in lines]
    ended = json.loads((run / "step_times.json").read_text())
    steps_before = sum(1 for t in ended if t < warnings[0][0])
    assert steps_before <= 20, steps_before
    # result.json: the rank found slow (kept as it was found, though its last window may dip under
    # the line), the slowest at the end, every other rank's relative score over 1 / factor.
    r = read_result(run)
    assert [s["rank"] for s in r["stragglers"]["slow"]] == [rank] and r["stragglers"]["slowest"][0]["rank"] == rank
    assert r["stragglers"]["slow"][0]["relative"] < 1 / 1.2 < r["stragglers"]["slowest"][1]["relative"]
    assert r["time"]["slowest"]["rank"] == rank and r["time"]["slow"] == [rank]
    out = run_cli("status", str(run)).stdout
    assert re.search(rf"rank {rank} on {re.escape(node)}: relative 0\.\d\d, individual \d\.\d\d, [\d.]+ ms \(slow\)", out)
    # Rank 0's event files: the slow rank's relative score and the job's lowest, as curves.
    scalars = read_scalars(run)
    assert "straggler/relative_min" in scalars, scalars.keys()
    assert min(v for _, v in scalars[f"straggler/relative/rank{rank}"]) < 1 / 1.2


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_a_rank_with_slower_host_work_is_named_with_its_host_within_20_steps(tmp_path):
    run, lines, _ = _job(tmp_path, ["--steps", "30", "--work", "4000", "--slow-rank", "3", "--slow-factor", "1.3"],
                         ["cluster.tasks_per_node=8"])
    _named_slow(run, lines, 3, os.uname().nodename)


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_an_even_job_runs_200_steps_with_no_warning(tmp_path):
    run, lines, err = _job(tmp_path, ["--steps", "200", "--work", "400"], ["cluster.tasks_per_node=8"])
    assert not WARNING.search(err) and "is slow" not in err, err
    r = read_result(run)
    assert r["stragglers"]["slow"] == [] and r["stragglers"]["scored"] == 8
    assert min(r["stragglers"]["relative"].values()) > 1 / 1.2


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_a_slow_rank_over_two_slurm_nodes_is_named_with_its_node(slurm, tmp_path):
    run, lines, _ = _job(tmp_path, ["--steps", "30", "--work", "4000", "--slow-rank", "5", "--slow-factor", "1.3"],
                         ["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=4"], env=slurm.env)
    _named_slow(run, lines, 5, "node2")
