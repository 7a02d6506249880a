"""Watching a job's ranks at a cost that does not grow with their number (launcher/runtime/watch.py):
the watcher's verdict reaches every rank, a dead process is found by its host's watch, a watcher
that goes quiet is named, a requeue ends an attempt's watching quietly; and the sizes and run
dirs one watcher cannot serve are refused before submission. The counts at thousands of ranks
are bench/bench_scale.py's; tests/test_scale.py runs real jobs of 32 ranks (the heavy stage)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.cli.console import progress_line, seconds
from launcher.runtime import status
from launcher.runtime.node_watch import NodeWatch
from launcher.runtime.watch import JobWatch, RankReporter, check_size, read_watch, remaining_s
from tests.launch import run_cli
from tests.test_operate import one_line_error


class Job:
    """``n`` ranks of one job as reporters in this process, each joined and following."""

    def __init__(self, run_dir: Path, n: int, peer_timeout_s: float = 15.0, attempt: int = 0) -> None:
        self.ended: dict[int, str] = {}
        self.lock = threading.Lock()
        self.reporters = [RankReporter(run_dir, r, n, attempt=attempt, node_root=run_dir.parent / "node")
                          for r in range(n)]
        for rep in self.reporters:
            rep.set("joined")
            rep.start(peer_timeout_s, 60, on_peer_failure=self._ended(rep.rank))

    def _ended(self, rank: int):
        def record(why: str) -> None:
            with self.lock:
                self.ended[rank] = why
        return record

    def wait(self, predicate, timeout_s: float) -> bool:
        return status.wait_until(predicate, timeout_s, 0.1)

    def stop(self) -> None:
        for rep in self.reporters:
            rep.stop()


@pytest.mark.core
def test_a_failed_rank_reaches_every_rank_and_the_launcher_through_one_file(tmp_path):
    run = tmp_path / "run"
    job = Job(run, 6)
    try:
        assert job.wait(lambda: read_watch(run) is not None and read_watch(run).count("joined") == 6, 10)
        job.reporters[4].set("failed", "RuntimeError: injected")
        assert job.wait(lambda: len(job.ended) == 5, 15), job.ended  # every rank but the failed one
        assert all(why.startswith("rank 4 failed on ") and "injected" in why for why in job.ended.values())
        seen = JobWatch(run, 6, 15, 60).read(0)
        assert not seen.fallback and seen.verdict.startswith("rank 4 failed") and seen.ranks_in("failed") == [4]
    finally:
        job.stop()


@pytest.mark.core
def test_a_killed_process_is_found_by_its_hosts_watch_and_recorded_as_died(tmp_path):
    """One rank runs in a process of its own and is killed; the rank that holds this host's lock
    (here, in this process) finds its pid gone and records it, without a word of its own."""
    run, node = tmp_path / "run", tmp_path / "node"
    leader = NodeWatch(run, 0, 0, root=node)
    assert leader.beat() == [] and leader.leading
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, %r)\n"
        "from pathlib import Path\n"
        "from launcher.runtime.node_watch import NodeWatch\nfrom launcher.runtime.watch import RankReporter\n"
        "r = RankReporter(Path(%r), 1, 2); r.set('joined'); w = NodeWatch(Path(%r), 1, 0, root=Path(%r))\n"
        "print(w.leading or w.beat() or w.leading, flush=True); time.sleep(600)"
    ) % (str(Path(__file__).resolve().parents[1]), str(run), str(run), str(node))], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "False"  # the lock is this process's: it does not lead
        assert leader.beat() == []  # alive
        child.kill()
        child.wait()
        assert leader.beat() == [1] and leader.beat() == []  # recorded once
        st, _ = status.read_statuses(run)[1]
        assert st.state == "failed" and st.died and "died on" in st.message and "without reporting" in st.message
        assert status.peer_failure(run, 15, 60).startswith(f"rank 1 (pid {child.pid}) died")
        # A backend that saw how it ended says so over the mere "died"; a rank's own word stays.
        status.mark_failed(run, 1, "the task process was killed by signal 9 on Ray node 1234")
        assert status.read_statuses(run)[1][0].message.startswith("the task process was killed")
    finally:
        child.kill()
        leader.close()
    assert not (node / "xlaunch-0").exists() or not any((node / "xlaunch-0").rglob("rank*"))


@pytest.mark.core
def test_a_watcher_that_goes_quiet_is_named_by_every_rank(tmp_path):
    run = tmp_path / "run"
    job = Job(run, 3, peer_timeout_s=4)
    try:
        assert job.wait(lambda: read_watch(run) is not None, 10)
        job.reporters[0]._stop.set()  # rank 0's heartbeat, and with it the watch, stops (no last word)
        assert job.wait(lambda: len(job.ended) == 2, 20), job.ended
        # Named by its own status: silent (its heartbeat stopped with the watch).
        assert all(why.startswith("rank 0 stopped responding") for why in job.ended.values()), job.ended
    finally:
        job.stop()


@pytest.mark.core
def test_a_requeued_attempts_watch_ends_without_a_failure(tmp_path):
    run = tmp_path / "run"
    job = Job(run, 3, peer_timeout_s=4)
    try:
        assert job.wait(lambda: read_watch(run) is not None, 10)
        status.write_attempt(run, 1, "requeued after SIGUSR2")
        assert job.wait(lambda: all(not rep._thread.is_alive() for rep in job.reporters), 20)
        assert job.ended == {}  # nobody was told the job failed
        assert read_watch(run).attempt == 0  # the old attempt's watcher stopped publishing
        # The launcher, on attempt 1, does not take the old watch for the new attempt's.
        seen = JobWatch(run, 3, 4, 60).read(1)
        assert seen.fallback and seen.present == set()
    finally:
        job.stop()


def test_ranges_of_ranks_read_back():
    ranks = [0, 1, 2, 3, 5, 7, 8, 9, 4095]
    assert status.rank_ranges(ranks) == "0-3,5,7-9,4095"
    assert status.parse_ranges(status.rank_ranges(ranks)) == ranks
    assert status.ranks_text([3]) == "rank 3" and status.ranks_text(range(4096)) == "ranks 0-4095"


def test_a_job_too_large_for_one_watcher_is_refused_with_what_to_set(tmp_path):
    assert check_size(4096, 15) == ""
    proc = run_cli("mode=check", "cluster.tasks_per_node=20000", "launcher.dry_run=true", run_dir=tmp_path / "run",
                   check=False)
    one_line_error(proc, "20000 ranks: the job's watcher reads every rank's status file")
    assert "launcher.peer_timeout_s=30 or more" in proc.stderr and not (tmp_path / "run" / "job.json").exists()


def test_a_run_dir_only_this_host_sees_is_refused_for_ranks_on_other_hosts(tmp_path):
    proc = run_cli("mode=check", "cluster=mpi-local", "cluster.nodes=2", "cluster.hosts=[gpu-a,gpu-b]",
                   "launcher.dry_run=true", run_dir=tmp_path / "run", check=False)
    one_line_error(proc, "which only this host sees, but cluster=mpi-local may run ranks on gpu-a, gpu-b")
    assert "hydra.run.dir=" in proc.stderr
    # The same hosts named as this one's: fine.
    ok = run_cli("mode=check", "cluster=mpi-local", "cluster.nodes=1", "cluster.hosts=[localhost]",
                 "launcher.dry_run=true", run_dir=tmp_path / "ok", check=False)
    assert ok.returncode == 0, ok.stderr


def test_xlaunch_status_shows_a_large_job_by_state_from_its_watch(tmp_path):
    """A job of more ranks than xlaunch status lists one by one: by state, from one file."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.json").write_text(json.dumps({"job_id": "1", "backend": "local", "submitted": time.time(),
                                              "host": "elsewhere", "run_dir": str(run), "mode": "run",
                                              "cluster": "local", "ranks": 100}))
    (run / "resolved_config.yaml").write_text("cluster: {name: local, backend: local}\n")
    job = Job(run, 100)
    try:
        assert job.wait(lambda: read_watch(run) is not None and read_watch(run).count("joined") == 100, 15)
        job.reporters[7].set("failed", "RuntimeError: injected")
        assert job.wait(lambda: "rank 7 failed" in (read_watch(run).verdict or ""), 10)
        out = run_cli("status", str(run)).stdout
        assert "state" in out and "failed: rank 7 failed on" in out, out
        assert "rank 7 " in out and "failed" in out
    finally:
        job.stop()


def test_the_eta_is_the_pace_since_the_first_unit_done_not_since_the_start():
    """A race compiles every plan (a minute, on a user's model) before its first step: from the
    start, 5 steps of 260 in 72 s said 61 minutes were left, when the rest took 30 s. The pace
    is taken from the first unit done on, and before a second there is none."""
    first = [1000.0 + 72, 5]
    progress = {"description": "measuring 13 plans", "completed": 5, "total": 260, "started": 1000.0, "first": first}
    assert progress_line(progress, "", 0.0, 1072.0).endswith("eta unknown")
    progress["completed"] = 135
    line = progress_line(progress, "", 0.0, 1087.0)   # 130 steps in 15 s: 125 left take 14.4 s
    assert f"elapsed {seconds(87)}, " in line, line
    assert remaining_s(135, 260, first, 1087.0) == pytest.approx(125 * 15 / 130)
    assert line.endswith("eta " + seconds(125 * 15 / 130)), line
    # A report without the pace's start (an older task's): no guess.
    assert remaining_s(135, 260, None, 1087.0) is None
