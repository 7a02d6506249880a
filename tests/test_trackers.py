"""One tracker run across restarts (issue 65, point 3): ``launcher.tracker=tensorboard|wandb|
mlflow`` (``launcher/runtime/trackers.py``), W&B offline and MLflow's local file store, their
real libraries.

The fast tests open a run as attempt 0 writes it, then again as a restart that resumed from an
older step does; the heavy one kills a rank of a real training job mid-run and reads what the
restarted job left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.runtime.trackers import TRACKER_FILE, params_of
from tests.launch import REPO, read_result, run_cli
from tests.test_operate import wait_for

mlflow_tracking = pytest.importorskip("mlflow.tracking", reason="the mlflow extra: .ci/install.sh installs it")
wandb_pb2 = pytest.importorskip("wandb.proto.wandb_internal_pb2", reason="the wandb extra: .ci/install.sh installs it")

STEPS, CHECKPOINT_EVERY = 32, 8   # mode=train on 2 processes x 1 device, killed after its first checkpoint
TRAIN = ("mode=train", "model=gpt-tiny", f"mode.steps={STEPS}", "mode.warmup_steps=1",
         f"mode.checkpoint_every={CHECKPOINT_EVERY}", "cluster=local", "cluster.tasks_per_node=2",
         "cluster.cpu_devices_per_task=1")
PARAMS = params_of({"model": {"name": "gpt-tiny", "num_layers": 2}, "mode": {"steps": 10}}, "abc123")


def mlflow_steps(run_dir: Path) -> tuple[list, dict]:
    """Every MLflow run under ``run_dir/mlruns``: (run ids, the one run's {metric: [steps]},
    its params)."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3: the file store is opted into
    client = mlflow_tracking.MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    if len(runs) != 1:
        return [r.info.run_id for r in runs], {}
    run = runs[0]
    steps = {k: sorted(m.step for m in client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics}
    return [run.info.run_id], {"steps": steps, "params": run.data.params, "status": run.info.status}


def wandb_runs(run_dir: Path) -> dict[str, list[Path]]:
    """W&B's offline runs under ``run_dir/wandb``, by run id (one folder per attempt, its
    ``run-<id>.wandb`` naming the run)."""
    out: dict[str, list[Path]] = {}
    for d in sorted((run_dir / "wandb").glob("offline-run-*"), key=lambda d: d.stat().st_mtime):
        for f in d.glob("run-*.wandb"):
            out.setdefault(f.stem.removeprefix("run-"), []).append(d)
    return out


def wandb_history(folder: Path, what: str = "history") -> list[dict]:
    """The history rows (``what="run"``: the config the run started with) an offline run's
    ``.wandb`` file holds: W&B's records (its protobuf
    ``Record``) in a LevelDB-style log after a 7-byte header (``:W&B``, magic, version), in
    32 KiB blocks, each piece a 7-byte header (CRC, length, type: 1 whole, 2-4 first, middle,
    last) and its bytes."""
    (path,) = folder.glob("*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    rows, pos, part, block = [], 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:            # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):                     # a whole record, or its last piece
            record = wandb_pb2.Record()
            record.ParseFromString(part)
            part = b""
            if record.WhichOneof("record_type") == what:
                items = record.history.item if what == "history" else record.run.config.update
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return rows


ATTEMPT = """
import json, os, sys
from launcher.runtime.scalars import Scalars
run_dir, tracker, attempt, first, last, params = sys.argv[1:7]
s = Scalars(run_dir, rank=0, attempt=int(attempt), tracker=tracker, params=json.loads(params))
for step in range(int(first), int(last)):
    s.add(step, {"loss": 10.0 - step})
if attempt == "0":   # killed: what was flushed (at a checkpoint) is all it leaves
    s.flush()
    os._exit(0)
s.add(1, {"steps_s": 2.5}, prefix="time/", axis="attempt")   # its time, as it ends
s.close()
"""


def two_attempts(run_dir: Path, tracker: str) -> None:
    """Attempt 0 (a process of its own) logs steps 0-5 and is killed, not closed; attempt 1
    resumes from step 3's checkpoint and logs 3-9, then its time accounting."""
    for attempt, first, last in ((0, 0, 6), (1, 3, 10)):
        subprocess.run([sys.executable, "-c", ATTEMPT, str(run_dir), tracker, str(attempt), str(first), str(last),
                        json.dumps(PARAMS)], cwd=REPO, check=True, timeout=120,
                       env={**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"})


def test_mlflow_keeps_one_run_across_attempts_its_steps_going_on(tmp_path):
    two_attempts(tmp_path, "mlflow")
    ids, run = mlflow_steps(tmp_path)
    assert len(ids) == 1, ids
    assert json.loads((tmp_path / TRACKER_FILE).read_text())["mlflow"] == ids[0]
    assert run["steps"]["loss"] == list(range(10))          # each step once: 3-5 not logged twice
    assert run["steps"]["time/steps_s"] == [1]              # per attempt, on a key of its own
    assert run["params"]["model.num_layers"] == "2" and run["params"]["code_commit"] == "abc123"


def test_wandb_offline_keeps_one_run_id_across_attempts_its_steps_going_on(tmp_path):
    two_attempts(tmp_path, "wandb")
    runs = wandb_runs(tmp_path)
    assert list(runs) == [json.loads((tmp_path / TRACKER_FILE).read_text())["wandb"]], runs
    folders = runs[next(iter(runs))]   # a folder per segment (an attempt, a flush), one run: `wandb sync` joins them
    rows = [row for folder in folders for row in wandb_history(folder)]
    assert sorted({row["_step"] for row in rows if "loss" in row}) == list(range(10))
    config = {k: v for folder in folders for row in wandb_history(folder, "run") for k, v in row.items()}
    assert config["model.num_layers"] == 2 and config["code_commit"] == "abc123"
    attempts = [(row["attempt"], row["time/steps_s"]) for row in rows if "time/steps_s" in row]
    assert attempts == [(1, 2.5)]


def test_a_tracker_that_is_none_or_not_installed_is_refused_before_submission(tmp_path, monkeypatch):
    r = run_cli("launcher.tracker=comet", "launcher.dry_run=true", run_dir=tmp_path / "a", check=False)
    assert r.returncode == 2 and "launcher.tracker=comet: not a tracker; give one of mlflow, none, tensorboard, " \
                                  "wandb" in r.stderr, r.stderr
    # Python's own way of saying a module is not installed: None in sys.modules
    r = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.modules['mlflow'] = None; sys.argv = ["
                        f"'xlaunch', 'launcher.tracker=mlflow', 'launcher.dry_run=true', 'hydra.run.dir={tmp_path / 'b'}'"
                        "]; runpy.run_module('launcher', run_name='__main__')"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "launcher.tracker=mlflow: mlflow is not installed (pip install 'xlaunch[mlflow]')" \
        in r.stderr, r.stderr


@pytest.mark.heavy
@pytest.mark.timeout(900)
@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_job_killed_mid_run_and_restarted_leaves_one_tracker_run_with_continuous_steps(tmp_path, tracker):
    run = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    args = [sys.executable, "-m", "launcher", *TRAIN, "launcher.max_restarts=1", f"launcher.tracker={tracker}",
            f"hydra.run.dir={run}"]
    launcher = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (run / "checkpoints" / str(CHECKPOINT_EVERY)).exists(), 300, "the first checkpoint")
        os.kill(json.loads((run / ".xlaunch" / "ranks" / "rank0.json").read_text())["pid"], 9)
        _, err = launcher.communicate(timeout=600)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err
    result = read_result(run)
    assert result["resumed_from_step"] >= CHECKPOINT_EVERY
    commit = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    if tracker == "mlflow":
        ids, one = mlflow_steps(run)
        assert len(ids) == 1, ids
        assert one["steps"]["loss"] == list(range(STEPS)) and one["status"] == "FINISHED"
        assert one["params"]["mode.steps"] == str(STEPS) and one["params"]["code_commit"] == commit
        return
    runs = wandb_runs(run)
    assert len(runs) == 1, runs
    rows = [row for folder in next(iter(runs.values())) for row in wandb_history(folder)]
    assert sorted({row["_step"] for row in rows if "loss" in row}) == list(range(STEPS))
    losses = {row["_step"]: row["loss"] for row in rows if "loss" in row}
    assert [losses[s] for s in range(STEPS)] == pytest.approx(result["losses"])
