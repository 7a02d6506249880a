"""Following and stopping jobs nobody waits on (``xlaunch status|logs|cancel|runs``), on real
backends: local processes, the tests' SLURM, mpirun; and the waiting launcher's plain progress
lines and answer when it has no terminal."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.launch import run_cli

pytestmark = pytest.mark.core

# A job that runs until it is cancelled (minutes of steps), on 2 ranks x 2 CPU devices.
ENDLESS = ["mode=train", "model=gpt-tiny", "mode.steps=100000", "cluster.cpu_devices_per_task=2"]


def xlaunch(*args: str, cwd: Path, env: dict | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, env=env, check=check, timeout=timeout)


def state_of(run: Path, cwd: Path, env: dict | None = None) -> dict:
    return json.loads(xlaunch("status", str(run), "--json", cwd=cwd, env=env).stdout)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.5)


def joined(run: Path, cwd: Path, env: dict | None = None) -> bool:
    ranks = state_of(run, cwd, env)["ranks"]
    return all(r["state"] == "joined" for r in ranks)


def one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def snapshot(run: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run.rglob("*")) if p.is_file()}


def job_processes(run: Path) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(run) in line and "ps -ww" not in line]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_local_jobs_are_followed_to_their_end_cancelled_and_listed(tmp_path):
    here = tmp_path / "work"  # a user's working dir: runs land in its outputs/
    here.mkdir()
    t0 = time.monotonic()
    run_cli("mode=check", "cluster.cpu_devices_per_task=2", "mode.allgather_mb=0.25", "launcher.wait=false", cwd=here)
    (first,) = [p.parent for p in (here / "outputs").glob("*/*/job.json")]
    # Submitted without waiting: back before the job ends. (Checked at once: the check job takes
    # seconds, and by the time ``xlaunch status`` has started it may be done, as CI saw.)
    assert not (first / "result.json").exists()
    assert state_of(first, here)["state"] in ("running", "done")

    # Followed to its end (the latest run: no run dir named), the ranks' logs as one stream.
    follow = xlaunch("logs", "-f", cwd=here, timeout=180)
    lines = follow.stdout.splitlines()
    assert {line.split(" | ")[0] for line in lines} == {"rank0", "rank1"}
    assert sum("psum over 4 devices" in line for line in lines) == 2
    stamps = [m.group(1) for m in map(re.compile(r"rank\d \| (\d{4}-\d\d-\d\d [\d:,]{12}) ").match, lines) if m]
    assert len(stamps) > 10 and stamps == sorted(stamps)  # in time order across ranks
    assert "done: 4 devices, psum ok" in follow.stderr and (first / "result.json").exists()
    # One rank's log as it is; the status of a finished job.
    assert xlaunch("logs", "--rank", "1", str(first), cwd=here).stdout == (first / "logs" / "rank1.log").read_text()
    status = xlaunch("status", cwd=here).stdout
    assert re.search(r"^state +done: 4 devices, psum ok", status, re.M), status
    assert re.search(r"^rank 1 +done on ", status, re.M) and str(first) in status

    # A second job, cancelled while it trains: every process of it ends, the run dir says so.
    run_cli(*ENDLESS, "launcher.wait=false", cwd=here)
    (second,) = [p.parent for p in (here / "outputs").glob("*/*/job.json") if p.parent != first]
    wait_for(lambda: joined(second, here), 120, "both ranks joined")
    assert state_of(second, here)["state"] == "running"
    cancelled = xlaunch("cancel", cwd=here)
    assert f"cancelled job {json.loads((second / 'job.json').read_text())['job_id']} on local" in cancelled.stdout
    after = state_of(second, here)
    assert after["state"] == "cancelled" and "xlaunch cancel" in after["detail"]
    assert not job_processes(second)
    assert time.monotonic() - t0 < 400

    # The list: newest first, each with mode, cluster, job id, state and the headline result.
    rows = xlaunch("runs", cwd=here).stdout.splitlines()
    assert rows[0].split() == ["SUBMITTED", "RUN", "MODE", "CLUSTER", "JOB", "STATE", "NODE-H", "DEVICE-H",
                               "RESULT"] and len(rows) == 3
    newest, older = rows[1].split(), rows[2].split()  # the time of submission is two words
    assert newest[2:5] == [str(second.relative_to(here)), "train", "local"] and newest[6] == "cancelled"
    assert older[2:5] == [str(first.relative_to(here)), "check", "local"] and older[6] == "done"
    # What each cost: one node (cluster=local) for the time its allocation was held, and its
    # devices (the check's result names them; the cancelled job wrote none: "-").
    for row, run in ((newest, second), (older, first)):
        held = json.loads(xlaunch("status", "--json", str(run), cwd=here).stdout)["time"]["held_s"]
        assert float(row[7]) == pytest.approx(held / 3600, rel=0.01, abs=3 / 3600), (row, held)
    assert newest[8] == "-" and float(older[8]) == pytest.approx(4 * float(older[7]), rel=0.01)
    assert "4 devices, psum ok" in rows[2]

    # Bad input: one line, exit 2, nothing in a run dir changed.
    before = {run: snapshot(run) for run in (first, second)}
    one_line_error(xlaunch("cancel", str(second), cwd=here, check=False), "has already ended (cancelled")
    one_line_error(xlaunch("cancel", str(first), cwd=here, check=False), "has already ended (done")
    one_line_error(xlaunch("logs", "--rank", "2", str(first), cwd=here, check=False), "ranks 0 to 1")
    one_line_error(xlaunch("status", str(here), cwd=here, check=False), "not a run dir")
    one_line_error(xlaunch("status", str(tmp_path / "nowhere"), cwd=here, check=False), "no such directory")
    run_cli("mode=check", "launcher.dry_run=true", run_dir=tmp_path / "dry", cwd=here)
    one_line_error(xlaunch("cancel", str(tmp_path / "dry"), cwd=here, check=False), "nothing was submitted")
    one_line_error(xlaunch("status", cwd=tmp_path / "dry", check=False), "no submitted run under ./outputs")
    assert {run: snapshot(run) for run in (first, second)} == before
    assert "usage: xlaunch logs" in xlaunch("logs", "--help", cwd=here).stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_slurm_jobs_are_followed_cancelled_running_and_queued(slurm, tmp_path):
    env = slurm.env
    common = ["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=2"]
    first, second, queued = tmp_path / "first", tmp_path / "second", tmp_path / "queued"
    run_cli("mode=check", *common, "mode.allgather_mb=0.25", "launcher.wait=false", run_dir=first, env=env)
    follow = xlaunch("logs", "-f", str(first), cwd=tmp_path, env=env, timeout=240)
    assert {line.split(" | ")[0] for line in follow.stdout.splitlines()} == {"rank0", "rank1"}
    assert "from slurm" in follow.stdout and "done: 4 devices, psum ok" in follow.stderr
    assert state_of(first, tmp_path, env)["state"] == "done"

    # Cancelled while its ranks run under srun: scancel, and nothing of it is left.
    run_cli(*ENDLESS, *common, "launcher.wait=false", run_dir=second, env=env)
    wait_for(lambda: joined(second, tmp_path, env), 180, "both ranks joined")
    running = xlaunch("status", str(second), cwd=tmp_path, env=env).stdout
    assert re.search(r"^state +running", running, re.M) and re.search(r"^scheduler +SLURM RUNNING", running, re.M)
    xlaunch("cancel", str(second), cwd=tmp_path, env=env)
    assert state_of(second, tmp_path, env)["state"] == "cancelled"
    wait_for(lambda: not slurm.job_processes(), 30, "the job's processes ended")

    # A job SLURM cannot start yet (3 nodes of a 2-node cluster): queued, then cancelled.
    run_cli("mode=check", *common[:1], "cluster.nodes=3", "cluster.tasks_per_node=1", "launcher.wait=false",
            run_dir=queued, env=env)
    pending = state_of(queued, tmp_path, env)
    assert pending["state"] == "queued" and pending["scheduler"].startswith("SLURM PENDING"), pending
    xlaunch("cancel", str(queued), cwd=tmp_path, env=env)
    assert state_of(queued, tmp_path, env)["state"] == "cancelled"

    # A run whose job SLURM no longer knows, with nothing in the run dir to say how it ended.
    forgotten = tmp_path / "forgotten"
    shutil.copytree(first, forgotten, ignore=shutil.ignore_patterns("result.json", ".xlaunch"))
    record = json.loads((forgotten / "job.json").read_text())
    (forgotten / "job.json").write_text(json.dumps({**record, "job_id": "999999"}))
    before = snapshot(forgotten)
    for command in ("status", "cancel"):
        one_line_error(xlaunch(command, str(forgotten), cwd=tmp_path, env=env, check=False),
                       "SLURM has no job 999999")
    assert snapshot(forgotten) == before


@pytest.mark.slow
@pytest.mark.heavy  # the same status and cancel as local processes' and SLURM's, which run by default
@pytest.mark.timeout(300)
def test_an_mpirun_job_is_followed_and_cancelled(tmp_path):
    run = tmp_path / "run"
    run_cli(*ENDLESS, "cluster=mpi-local", "launcher.wait=false", run_dir=run)
    wait_for(lambda: joined(run, tmp_path), 120, "both ranks joined")
    status = state_of(run, tmp_path)
    assert status["state"] == "running" and status["scheduler"].startswith("process ")
    logs = xlaunch("logs", str(run), cwd=tmp_path).stdout
    assert "rank0 | " in logs and "rank1 | " in logs and "from openmpi" in logs
    assert any("mpirun" in line for line in job_processes(run))
    xlaunch("cancel", str(run), cwd=tmp_path)
    assert state_of(run, tmp_path)["state"] == "cancelled"
    assert not job_processes(run)  # mpirun and both ranks


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_a_terminal_the_launcher_prints_progress_lines_then_the_answer(tmp_path):
    run = tmp_path / "run"
    # stderr is a pipe here, as under nohup, in CI or in a batch step.
    proc = run_cli("mode=train", "model=gpt-tiny", "mode.steps=12", "launcher.progress_every_s=0.5", run_dir=run,
                   timeout=240)
    lines = [line for line in proc.stderr.splitlines() if re.match(r"\d\d:\d\d:\d\d job \d+: ", line)]
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    assert lines and all(f" job {job_id}: " in line for line in lines)
    stepped = [line for line in lines if "train GPT [dp]: " in line]
    assert stepped, proc.stderr  # what, how far, elapsed, ETA
    assert re.search(r"train GPT \[dp\]: \d+/12 \(\d+%\), elapsed [\d.]+ m?s, eta ", stepped[-1]), stepped[-1]
    assert any("ranks started" in line or "running on 2 ranks" in line for line in lines)
    # The answer first (loss, step time, TFLOPS), then the run dir; no table of every field.
    out = proc.stdout.splitlines()
    assert re.match(r"train GPT under plan dp .* 12 steps, loss [\d.]+ -> [\d.]+$", out[0]), out
    assert re.match(r"step time .* TFLOPS", out[1])
    assert out[-1].startswith(f"run dir: {run} ") and len(out) <= 4
    assert "│" not in proc.stdout + proc.stderr and "allgather" not in proc.stdout
