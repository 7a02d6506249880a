"""Curves where people look for them: TensorBoard event files in the run dir (issue 47), read
back with TensorBoard's own reader. mode=train's are checked on its own tests' jobs
(tests/test_train_mode.py), the search race's on the CFP job (tests/test_cfp_search.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from launcher import api
from launcher.runtime.scalars import Scalars
from tests.launch import read_result, read_scalars, run_cli

pytestmark = pytest.mark.core


def test_a_programs_context_log_reaches_tensorboard_and_result_json(tmp_path):
    run = tmp_path / "run"
    run_cli("mode=run", "mode.target=tests.run_programs:curves", "mode.kwargs.steps=5", "cluster.cpu_devices_per_task=1",
            run_dir=run)
    scalars = read_scalars(run)
    # Rank 0's calls, every step, the values as given (a Python float, a NumPy and a JAX scalar).
    assert scalars["loss"] == [(s, pytest.approx(1.0 / (s + 1))) for s in range(5)]
    assert scalars["lr"] == [(s, 0.5) for s in range(5)]
    assert scalars["doubled"] == [(s, 2.0 * s) for s in range(5)]
    # every_rank=True: rank 0's into the run dir, rank 1's into a run of its own beside it.
    assert scalars["rank_loss"] == [(s, float(s)) for s in range(5)]
    assert read_scalars(run / "rank1") == {"rank_loss": [(s, 10.0 + s) for s in range(5)]}
    # The job's time accounting beside the program's curves: its one attempt, at step 0.
    for what in ("queued_s", "startup_s", "compile_s", "steps_s", "checkpoint_s", "other_s", "goodput"):
        assert [step for step, _ in scalars[f"time/{what}"]] == [0], what
    # The last value of each, in result.json, where a sweep's table and its objective find them.
    r = read_result(run)
    assert r["logged"] == {"loss": pytest.approx(0.2), "lr": 0.5, "doubled": 8.0, "rank_loss": 4.0}
    assert r["returned"] == {"steps": 5, "final": 0.2}


def test_scalars_keep_numbers_refuse_others_and_go_on_without_tensorboardx(tmp_path, monkeypatch):
    s = Scalars(tmp_path / "a", rank=0)
    s.add(3, {"loss": np.float32(1.5), "n": 2})
    with pytest.raises(TypeError, match="scalar lr='high': not a number"):
        s.add(4, {"lr": "high"})
    s.close()
    assert read_scalars(tmp_path / "a") == {"loss": [(3, 1.5)], "n": [(3, 2.0)]}
    # Another rank writes only when asked, and then into a folder of its own.
    other = Scalars(tmp_path / "b", rank=1)
    other.add(0, {"x": 1.0})
    assert not (tmp_path / "b").exists() and other.last == {}
    other.add(0, {"x": 1.0}, every_rank=True)
    other.close()
    assert read_scalars(tmp_path / "b" / "rank1") == {"x": [(0, 1.0)]}
    # Without tensorboardX: said once, nothing written, the numbers still kept.
    said = []
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    bare = Scalars(tmp_path / "c", rank=0, warn=said.append)
    bare.add(0, {"loss": 1.0})
    bare.add(1, {"loss": 0.5})
    bare.close()
    assert said == ["TensorBoard scalars are not written: tensorboardX is not installed "
                    "(pip install 'xlaunch[tensorboard]')"]
    assert not (tmp_path / "c").exists() and bare.last == {"loss": 0.5} and not bare.written


def test_a_later_attempt_purges_what_earlier_ones_wrote_from_its_first_step(tmp_path):
    first = Scalars(tmp_path, rank=0, attempt=0)
    for step in range(6):
        first.add(step, {"loss": float(step)})
    first.close()
    again = Scalars(tmp_path, rank=0, attempt=1)  # resumed from the checkpoint of step 4
    for step in range(4, 8):
        again.add(step, {"loss": 10.0 + step})
    again.close()
    assert read_scalars(tmp_path)["loss"] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0), (5, 15.0),
                                              (6, 16.0), (7, 17.0)]


def test_a_program_run_by_hand_logs_into_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(api, "_by_hand", None)
    ctx = api.context()
    assert ctx is api.context()  # one writer for the program
    ctx.log(0, loss=2.0)
    ctx.log(1, loss=1.0)
    ctx._scalars.close()
    assert read_scalars(tmp_path) == {"loss": [(0, 2.0), (1, 1.0)]}
