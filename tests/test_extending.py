"""The house is open to new parts (issue 35): a backend defined in one module outside the
package, with one yaml, runs through the CLI; and nothing in the package branches on a
backend's name outside that backend's own module."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from launcher import console
from launcher.clusters.base import backends
from tests.launch import REPO, read_result, run_cli

TOY = [f"hydra.searchpath=[file://{REPO}/tests/toy_conf]", "cluster=toy"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_backend_from_outside_the_package_runs_through_the_cli(tmp_path):
    run = tmp_path / "run"
    run_cli(*TOY, "mode=check", "mode.allgather_mb=0.25", run_dir=run, timeout=240)
    r = read_result(run)
    assert (r["cluster"], r["num_processes"], r["global_devices"], r["psum_ok"]) == ("toy", 2, 4, True)
    for rank in (0, 1):
        assert f"rank {rank}/2" in (run / "logs" / f"rank{rank}.log").read_text()
        assert "from explicit" in (run / "logs" / f"rank{rank}.log").read_text()
    # submitit found the backend's own job environment in each task (its module, imported there).
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    assert "global_rank=1(2)" in (run / "submitit" / f"{job_id}_1_log.out").read_text()
    # The commands that follow a job work on it as on a built-in backend.
    assert "done: 4 devices, psum ok" in run_cli("status", str(run)).stdout
    # Its dry run, and its own checks.
    dry = run_cli(*TOY, "mode=check", "launcher.dry_run=true", run_dir=tmp_path / "dry")
    assert "export SUBMITIT_EXECUTOR=toy" in dry.stdout and "export XLAUNCH_BACKEND_MODULE=tests.toy_backend" in dry.stdout
    refused = run_cli(*TOY, "mode=check", "cluster.nodes=2", run_dir=tmp_path / "bad", check=False)
    assert refused.returncode == 2 and "cluster.nodes=2: cluster=toy runs on this host only" in refused.stderr
    missing = run_cli(*TOY, "mode=check", "cluster.module=tests.no_such_backend", run_dir=tmp_path / "bad2", check=False)
    assert missing.returncode == 2 and "cluster.module=tests.no_such_backend: cannot be imported" in missing.stderr


def _branches_on(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines comparing something with a backend's name (``== "slurm"``, ``in ("local", "mpi")``)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                lines.append(node.lineno)
    return lines


def test_no_module_branches_on_a_backends_name_outside_its_own():
    classes = backends()
    names = set(classes)
    own = {Path(c.__module__.replace(".", "/") + ".py") for c in classes.values()}
    found = {}
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel in own:
            continue
        lines = _branches_on(ast.parse(path.read_text()), names)
        if lines:
            found[str(rel)] = lines
    assert not found, f"branches on a backend's name outside its module: {found}"


def test_help_names_every_mode_and_every_cluster():
    text = run_cli("--help").stdout
    groups = text.split("Groups (what each chooses)")[1].split("Options of each group")[0]
    for group in ("mode", "cluster"):
        for option in sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml")):
            assert option in groups, (group, option)


def test_a_function_its_module_lacks_is_named_so_before_submission(tmp_path):
    proc = run_cli("mode=run", "mode.target=os.path:nosuch", run_dir=tmp_path / "run", check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines == ["error: mode.target=os.path:nosuch: os.path has no nosuch; name a "
                                              "function of it"], proc.stderr
    assert not (tmp_path / "run" / "job.json").exists()


def test_a_result_is_rendered_by_the_mode_that_ran_not_by_its_name():
    # A preset of search under a name of the user's: the comparison's headline, not a generic one.
    mine = {"mode": "my-search", "mode_code": "search", "step_time_s": 0.1, "answer": {"name": "cfp"}}
    assert console.headline_text(mine) == console.headline_text({**mine, "mode": "cfp"})
    assert console.headline_text(mine).startswith("answer cfp; searched plan")
    # A result written before results carried the code: conf/mode says what its name runs.
    assert console.headline_text({k: v for k, v in mine.items() if k != "mode_code"} | {"mode": "cfp"}) == \
        console.headline_text(mine)
