"""The embedded default end to end: real processes, real jax.distributed, real gloo collectives."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tests.launch import REPO, read_result, run_cli
from launcher.runtime.watch import RankReporter
from launcher.runtime import status

pytestmark = pytest.mark.core


def test_default_run_checks_every_device(tmp_path):
    run = tmp_path / "run"
    run_cli("mode=check", run_dir=run)
    r = read_result(run)
    assert r["mode"] == "check" and r["cluster"] == "local"
    assert r["num_processes"] == 2 and r["global_devices"] == 8
    assert r["psum_ok"] is True and r["psum_value"] == 28.0  # sum of device indices 0..7
    assert r["allgather_gbps"] > 0
    assert sorted(p["process_id"] for p in r["processes"]) == [0, 1]
    assert all(p["local_devices"] == 4 for p in r["processes"])
    for rank in (0, 1):
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank}/2" in log and "joined in" in log
    # What was run is kept: the resolved config and the exact submission.
    assert yaml.safe_load((run / "resolved_config.yaml").read_text())["cluster"]["tasks_per_node"] == 2
    assert "SUBMITIT_LOCAL_NTASKS=2" in (run / "submission.txt").read_text()
    assert (run / ".hydra" / "config.yaml").exists()


def test_saved_config_reproduces_the_run(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    run_cli("mode=check", "cluster.tasks_per_node=3", "cluster.cpu_devices_per_task=1", "mode.allgather_mb=0.5", run_dir=first)
    run_cli("--config-dir", str(first / ".hydra"), "--config-name", "config", run_dir=again)
    assert (first / "resolved_config.yaml").read_text() == (again / "resolved_config.yaml").read_text()
    assert read_result(again)["num_processes"] == 3 and read_result(again)["global_devices"] == 3


def test_multirun_without_waiting_submits_every_point(tmp_path):
    sweep = tmp_path / "sweep"
    t0 = time.time()
    proc = run_cli("-m", "mode=check", "cluster.tasks_per_node=1,2", "cluster.cpu_devices_per_task=2", "launcher.wait=false",
                   f"hydra.sweep.dir={sweep}")
    submitted_in = time.time() - t0
    assert proc.stderr.count("submitted job") == 2
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(runs) == 2
    deadline = time.time() + 120
    while time.time() < deadline and not all((r / "result.json").exists() for r in runs):
        time.sleep(0.5)
    assert [read_result(r)["num_processes"] for r in runs] == [1, 2]
    assert submitted_in < 30  # returned on submission, not after both jobs


def test_dry_run_submits_nothing(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("mode=check", "launcher.dry_run=true", run_dir=run)
    assert "submitit.local._local" in proc.stdout
    assert (run / "submission.txt").read_text() == proc.stdout
    assert not (run / "job.json").exists() and not (run / "logs").exists()


def test_cfg_job_and_info_behave_as_in_hydra():
    proc = run_cli("--cfg", "job", "cluster.tasks_per_node=5")
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["cluster"]["tasks_per_node"] == 5
    # The embedded default's main job is the CFP pipeline on the tiny GPT (run end to end, on
    # 2 processes x 4 devices, by tests/test_cfp_search.py).
    assert (cfg["mode"]["name"], cfg["cluster"]["name"], cfg["model"]["_target_"]) == ("cfp", "local", "launcher.models.gpt.GPT")
    info = run_cli("--info", "defaults")
    assert "cluster/local" in info.stdout and "container/none" in info.stdout


@pytest.mark.parametrize("override,message", [
    ("cluster=nope", "Could not find 'cluster/nope'"),
    ("cluster.tasks_per_node=two", "could not be converted to Integer"),
    ("cluster.taskz_per_node=2", "taskz_per_node"),
    ("cluster.tasks_per_node=0", "cluster.tasks_per_node=0: must be at least 1"),
    ("cluster.accelerator=fpga", "fpga"),
    ("mode.allgather_mbb=1", "allgather_mbb"),
    ("launcher.fault=explode:1", "expected 'crash:<rank>'"),
])
def test_bad_input_fails_before_submission(tmp_path, override, message):
    run = tmp_path / "run"
    proc = run_cli("mode=check", override, run_dir=run, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (run / "job.json").exists()  # nothing was submitted
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("fault,expected", [
    ("crash:1", "rank 1 failed"),  # a Python exception: reported by the rank itself
    ("abort:1", "rank 1 (pid"),  # SIGABRT, no cleanup: found dead by its pid
])
def test_a_crashing_rank_fails_the_job_fast(tmp_path, fault, expected):
    run = tmp_path / "run"
    t0 = time.time()
    proc = run_cli("mode=check", f"launcher.fault={fault}", run_dir=run, check=False)
    elapsed = time.time() - t0
    assert proc.returncode == 1
    assert expected in proc.stderr and str(run / "logs" / "rank1.log") in proc.stderr
    assert "the other ranks: rank 0: " in proc.stderr  # how the peer ended, or where it was
    assert elapsed < 30, f"took {elapsed:.1f} s to notice"
    assert not _leftover_tasks(run)


def test_a_rank_that_aborted_is_named_before_the_peer_that_lost_its_connection(tmp_path):
    """An aborting rank writes no status, and its peer's collective fails on the closed socket a
    moment later; the peer's error is the first written, but the cause is the dead rank."""

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    peer = RankReporter(tmp_path, 0, 2)
    peer.set("failed", "XlaRuntimeError: FAILED_PRECONDITION: Gloo AllGather failed: [pair.cc:525] Read error "
                       "[127.0.0.1]:44463: Connection reset by peer")
    aborted = RankReporter(tmp_path, 1, 2)
    aborted.status.pid = dead
    aborted.set("joined")
    reason = status.peer_failure(tmp_path, 15, 60)
    assert reason.startswith(f"rank 1 (pid {dead}) died") and "; then rank 0 failed" in reason, reason
    # A rank that failed on its own is the cause, whatever else has died since.
    peer.set("failed", "RuntimeError: injected crash")
    assert status.peer_failure(tmp_path, 15, 60).startswith("rank 0 failed")


def test_a_heartbeat_written_as_the_rank_fails_does_not_undo_its_failure(tmp_path, monkeypatch):
    """The heartbeat thread writes the status file too (when the rank's log moves, as it does
    when the rank logs its error): a beat read before ``set("failed")`` and written after it
    would leave "joined" on file, and the crashed rank would be taken for one that died without
    a word. The beat here is held between its read and its write while the rank fails."""
    reporter = RankReporter(tmp_path, 1, 2)
    reporter.set("joined")
    write, in_beat = status._write_json, threading.Event()

    def slow_beat(path, obj):
        if threading.current_thread() is not threading.main_thread():
            in_beat.set()
            time.sleep(0.5)
        write(path, obj)

    monkeypatch.setattr(status, "_write_json", slow_beat)
    beat = threading.Thread(target=reporter.progressed, args=(time.time() + 5,))
    beat.start()
    assert in_beat.wait(5)
    reporter.set("failed", "RuntimeError: injected crash")
    beat.join()
    st, _ = status.read_statuses(tmp_path)[1]
    assert (st.state, st.message) == ("failed", "RuntimeError: injected crash")


def test_a_rank_that_never_starts_fails_after_init_timeout(tmp_path):
    run = tmp_path / "run"
    t0 = time.time()
    proc = run_cli("mode=check", "launcher.fault=hang:1", "launcher.init_timeout_s=6", run_dir=run, check=False)
    elapsed = time.time() - t0
    assert proc.returncode == 1
    assert "rank 1 on" in proc.stderr and "never reached jax.distributed.initialize" in proc.stderr
    assert "launcher.init_timeout_s=6" in proc.stderr
    assert 6 <= elapsed < 40, f"{elapsed:.1f} s"
    assert not _leftover_tasks(run)


def test_stopping_the_launcher_at_once_stops_ranks_that_have_not_reported_yet(tmp_path, request):
    """Stopped before its ranks wrote their status files, in a launcher started as `nohup ... &`
    starts it (SIGINT ignored, inherited by every child): the ranks must end all the same."""

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    run = tmp_path / "run"
    args = [sys.executable, "-m", "launcher", "mode=check", "launcher.fault=hang:1", "launcher.init_timeout_s=120",
            f"hydra.run.dir={run}"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # (a warning may come first)
        if "submitted job" in line:
            break
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "cancelled" in err
    assert not _leftover_tasks(run)


@pytest.mark.heavy  # waits out a peer timeout (half a minute of sleep)
def test_a_job_frozen_longer_than_the_peer_timeout_goes_on_when_it_wakes(tmp_path):
    """A paused VM (or a suspended laptop, or `kill -STOP`) freezes every process alike while wall
    time goes on: on waking, old heartbeats are not silence."""

    run = tmp_path / "run"
    args = [sys.executable, "-m", "launcher", "mode=train", "model=gpt-tiny", "mode.steps=30",
            "launcher.peer_timeout_s=4", f"hydra.run.dir={run}"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    statuses = [run / ".xlaunch" / "ranks" / f"rank{r}.json" for r in (0, 1)]
    deadline = time.time() + 120
    while time.time() < deadline and not all(p.exists() and json.loads(p.read_text() or "{}").get("state") == "joined"
                                             for p in statuses):
        time.sleep(0.1)
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
    pids = [proc.pid] + [int(line.split()[0]) for line in ps if str(run) in line and "submitit" in line]
    assert len(pids) >= 3, ps
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(10)  # over twice launcher.peer_timeout_s
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert read_result(run)["steps"] == 30


def _leftover_tasks(run) -> list[str]:
    time.sleep(2)  # the controller's SIGINT, then SIGKILL a second later
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(run) in line and "submitit" in line]


def test_a_rank_stuck_while_exiting_is_ended_and_the_job_succeeds(tmp_path):
    """A rank whose process does not exit once it is done (one stuck tearing down its collectives)
    holds the job launcher.exit_timeout_s, not until the time limit: the launcher ends it, says so,
    and the job's result stands. (Once in the README's run a finished two-process job's launcher
    waited 150 s more.)"""
    run = tmp_path / "run"
    t0 = time.monotonic()
    proc = run_cli("mode=run", "mode.target=tests.run_programs:stuck_at_exit", "cluster.tasks_per_node=2",
                   "cluster.cpu_devices_per_task=1", "launcher.exit_timeout_s=3", run_dir=run, timeout=300)
    assert time.monotonic() - t0 < 60, proc.stderr   # not the rank's 600 s at exit
    assert "said it was done 3 s ago, but their processes have not all exited" in proc.stderr, proc.stderr
    assert read_result(run)["returned"] == {"rank": 0}
    states = [json.loads((run / ".xlaunch" / "ranks" / f"rank{r}.json").read_text())["state"] for r in (0, 1)]
    assert states == ["done", "done"]
    assert not _leftover_tasks(run)


def test_peers_end_the_job_even_when_nobody_waits(tmp_path):
    """With launcher.wait=false no launcher watches: the ranks' own watchdog must end the job."""
    run = tmp_path / "run"
    run_cli("mode=check", "launcher.fault=abort:1", "launcher.wait=false", "launcher.peer_timeout_s=5", run_dir=run)
    status0 = run / ".xlaunch" / "ranks" / "rank0.json"
    deadline = time.time() + 60
    state = None
    while time.time() < deadline:
        if status0.exists():
            state = json.loads(status0.read_text())
            if state["state"] in ("stopped", "failed", "done"):
                break
        time.sleep(0.5)
    assert state is not None and state["state"] == "stopped", state
    assert "rank 1" in state["message"]
    assert not _leftover_tasks(run)


def test_xla_dump_lands_in_the_run_dir(tmp_path):
    run = tmp_path / "run"
    run_cli("mode=check", "launcher.xla_dump=true", "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=2", run_dir=run)
    dumps = list((run / "xla_dump" / "rank0").glob("*before_optimizations.txt"))
    assert dumps and any("all-gather" in p.read_text() or "all_gather" in p.read_text() for p in dumps)


def test_shell_completion_is_hydras():
    proc = run_cli("-sc", "install=bash")
    assert "complete" in proc.stdout and "hydra" in proc.stdout.lower()


def test_stopping_the_launcher_stops_the_job(tmp_path):
    run = tmp_path / "run"
    args = [sys.executable, "-m", "launcher", "mode=check", "launcher.fault=hang:1", "launcher.init_timeout_s=120",
            f"hydra.run.dir={run}"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status1 = run / ".xlaunch" / "ranks" / "rank1.json"
    deadline = time.time() + 60
    while time.time() < deadline and not status1.exists():
        time.sleep(0.2)
    assert status1.exists()
    proc.terminate()  # what `timeout` or a scheduler's kill sends
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "interrupted: job" in err and "cancelled" in err
    assert not _leftover_tasks(run)


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_rank_that_takes_seconds_to_stop_is_recorded_as_stopped_not_as_died(tmp_path, sigint):
    """Cancelling a local job sends SIGINT and gives the ranks seconds, not one, to say they
    stopped before SIGKILL: a rank that saves something first (here 2 s, once the program runs), or
    one on a busy machine, is "stopped", not "died without reporting an error". Also where the launcher was
    started with SIGINT ignored, as a non-interactive shell starts `nohup python -m launcher ... &`
    (and so CI scripts, and this suite run so: both cancel tests failed, the rank read as died)."""
    run = tmp_path / "run"
    args = [sys.executable, "-m", "launcher", "mode=run", "mode.target=tests.run_programs:hold",
            f"mode.kwargs.until={tmp_path / 'never'}", "mode.kwargs.stop_delay_s=2", f"mode.kwargs.ready={tmp_path / 'ready'}",
            "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1", f"hydra.run.dir={run}"]
    if sigint == "ignored":   # as such a shell starts it: SIGINT ignored, which exec keeps
        args = ["bash", "-c", 'trap "" INT; exec "$@"', "bash", *args]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank0 = run / ".xlaunch" / "ranks" / "rank0.json"
    assert status.wait_until((tmp_path / "ready").exists, 120, 0.2)   # inside the program: its 2 s are spent
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "interrupted: job" in err, err
    said = json.loads(rank0.read_text())
    assert (said["state"], said.get("message")) == ("stopped", "interrupted"), said


def test_a_rank_still_running_when_the_grace_ends_is_killed_and_recorded_as_stopped(tmp_path):
    """A rank that has not ended 10 s after SIGINT (its saving takes 60 s here; on a busy machine a
    rank that is slow to be scheduled at all) gets SIGKILL, and its status says so: the job was
    cancelled, not crashed. Under three test workers on two cores a stopped sweep's rank once read
    as "died without reporting an error".

    The launcher is stopped twice, the second time while it cancels (an impatient second Ctrl-C,
    or `pkill` matching it again): the cancel goes on and says so. A second SIGTERM once cut it
    short, and a local search's two ranks computed on for twenty minutes with nobody to stop them."""
    run = tmp_path / "run"
    args = [sys.executable, "-m", "launcher", "mode=run", "mode.target=tests.run_programs:hold",
            f"mode.kwargs.until={tmp_path / 'never'}", "mode.kwargs.stop_delay_s=60", f"mode.kwargs.ready={tmp_path / 'ready'}",
            "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1", f"hydra.run.dir={run}"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank0 = run / ".xlaunch" / "ranks" / "rank0.json"
    assert status.wait_until((tmp_path / "ready").exists, 120, 0.2)   # inside the program: SIGINT reaches its handler
    t0 = time.monotonic()
    proc.terminate()
    time.sleep(2)   # the launcher is cancelling: the rank holds its SIGINT for 60 s
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "interrupted: job" in err, err
    assert "still cancelling job" in err, err
    assert time.monotonic() - t0 < 30   # the grace, then SIGKILL: not the rank's 60 s
    said = json.loads(rank0.read_text())
    assert (said["state"], said["message"]) == ("stopped", "interrupted (killed: still running 10 s after SIGINT)"), said
    assert not _leftover_tasks(run)


def test_a_rank_raises_its_open_files_limit_for_gloo_and_warns_when_it_holds_few_groups(tmp_path):
    """gloo's cross-process collectives on CPU devices hold a socket per pair of devices of each
    group for the process's life (2,016 per process for 64 devices over two): each rank raises
    its soft limit to the hard one, and says in its log when even that holds few groups of every
    device (here 400 holds 14 groups of 8 devices, 4 per task: 28 sockets each). A 64-device search
    died for it in its shortlist."""
    run = tmp_path / "run"
    args = ["bash", "-c", 'ulimit -Sn 256 && ulimit -Hn 400 && exec "$@"', "bash", sys.executable, "-m", "launcher",
            "mode=check", "mode.allgather_mb=0.01", "mode.repeats=1", "cluster.cpu_devices_per_task=4",
            f"hydra.run.dir={run}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert "open files: soft limit raised from 256 to its hard limit 400" in log, log
        assert "open files: the limit, 400, holds 14 groups of all 8 devices' gloo sockets (28 each)" in log, log
