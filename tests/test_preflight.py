"""A node checked before it costs a run (launcher/runtime/preflight.py, issue 65): every rank's
all-reduce and matmul before the program starts; a node slowed on purpose (``launcher.fault=
slow:<node>``: its matmul does eight times the work it reports) is named in one line, and the job
stops, or restarts without it (SLURM's --exclude) on the tests' SLURM."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from launcher.runtime import preflight
from tests.clusterkit.slurm import LocalSlurm
from tests.launch import read_result, run_cli
from tests.test_operate import one_line_error

PROGRAM = ["mode=run", "mode.script=tests/programs/straggler.py", "mode.args=[--steps,3,--work,1]",
           "cluster.cpu_devices_per_task=1"]
SLOW = re.compile(r"preflight: node node2 is slow: its matmul ran at [\d.]+ GFLOP/s, 0\.\d\dx the other nodes' median "
                  r"[\d.]+ \(launcher\.preflight_min=0\.6\)")


def test_on_by_default_for_a_job_of_more_than_one_node():
    class Lc:
        preflight = None

    assert preflight.enabled(Lc, 2) and not preflight.enabled(Lc, 1)
    Lc.preflight = False
    assert not preflight.enabled(Lc, 8)
    Lc.preflight = True
    assert preflight.enabled(Lc, 1)


@pytest.mark.parametrize("setting, message", [
    ("launcher.preflight_min=1.5", "launcher.preflight_min=1.5: must be between 0 and 1"),
    ("launcher.fault=slow:", "launcher.fault='slow:': expected 'crash:<rank>', 'abort:<rank>', 'hang:<rank>' or "
                             "'slow:<node>'"),
])
def test_a_preflight_setting_that_cannot_work_is_refused(tmp_path, setting, message):
    one_line_error(run_cli("mode=check", setting, "launcher.dry_run=true", run_dir=tmp_path / "run", check=False),
                   message)


@pytest.mark.heavy
@pytest.mark.timeout(300)
def test_the_preflight_on_one_node_checks_its_all_reduce_and_keeps_its_figures(tmp_path):
    run = tmp_path / "run"
    run_cli(*PROGRAM, "cluster.tasks_per_node=4", "launcher.preflight=true", run_dir=run, timeout=240)
    found = read_result(run)["preflight"]
    assert list(found["nodes"]) == [json.loads((run / ".xlaunch" / "ranks" / "rank0.json").read_text())["node"]]
    assert found["slow"] == [] and found["median_gflops"] > 0 and found["allreduce_s"] > 0
    assert "preflight passed in" in (run / "logs" / "rank3.log").read_text()


@pytest.mark.heavy
@pytest.mark.timeout(300)
def test_a_slow_node_stops_the_job_in_one_line_before_the_program_starts(slurm, tmp_path):
    run = tmp_path / "run"
    r = run_cli(*PROGRAM, "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=2", "launcher.fault=slow:node2",
                run_dir=run, env=slurm.env, timeout=240, check=False)
    assert r.returncode == 1, r.stderr
    assert SLOW.search(r.stderr), r.stderr
    assert not (run / "step_times.json").exists()   # the program never started
    found = json.loads((run / ".xlaunch" / "preflight.json").read_text())
    assert sorted(found["nodes"]) == ["node1", "node2"] and found["exclude"] == ["node2"]


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_the_restart_leaves_the_slow_node_out_with_sbatch_exclude(tmp_path):
    """Three pretend nodes; the job takes two. node2 is slowed: the first attempt stops in its
    preflight, the restart is submitted with --exclude=node2 and runs on node1 and node3."""
    root = Path(tempfile.mkdtemp(prefix="xlaunch-slurm-", dir="/tmp"))
    root.chmod(0o755)
    slurm = LocalSlurm(root, nodes=("node1", "node2", "node3")).start()
    try:
        run = tmp_path / "run"
        r = run_cli(*PROGRAM, "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=2",
                    "launcher.fault=slow:node2", "launcher.max_restarts=1", run_dir=run, env=slurm.env, timeout=500)
        assert SLOW.search(r.stderr), r.stderr
        line = next(x for x in r.stderr.splitlines() if "restarted as job" in x)
        assert line.endswith(", without node node2 (sbatch --exclude=node2)"), line
        restart_id = re.search(r"restarted as job (\d+)", line)[1]
        assert "#SBATCH --exclude=node2\n" in (run / "submitit" / f"{restart_id}_submission.sh").read_text()
        result = read_result(run)
        assert sorted(result["preflight"]["nodes"]) == ["node1", "node3"] and result["preflight"]["slow"] == []
        assert json.loads((run / "step_times.json").read_text())   # the program ran, on the nodes left
    finally:
        slurm.stop()
        shutil.rmtree(root, ignore_errors=True)
