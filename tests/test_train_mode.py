"""mode=train through the real CLI (issue 3): 2 processes x 4 CPU devices under a plan read
from a JSON file give the losses of 1 process x 1 device; result.json holds what the issue
lists; bad input fails with one clear message."""

from __future__ import annotations

import json

import numpy as np
import pytest

from launcher import jaxcompat
from launcher.models.plans import builtin
from tests.launch import read_result, read_scalars, run_cli
from tests.test_models import load_preset
from tests.test_plans import TOLERANCE

pytestmark = pytest.mark.core

STEPS = 6
COMMON = ("mode=train", "model=gpt-tiny", "cluster=local", f"mode.steps={STEPS}")


@pytest.mark.slow
def test_two_processes_with_a_json_plan_match_one_device(tmp_path):
    plan_file = tmp_path / "dp_tp.json"
    builtin("dp_tp").with_axis_sizes(model=4).to_json(plan_file)
    run_cli(*COMMON, "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=4", f"mode.plan={plan_file}",
            run_dir=tmp_path / "multi")
    run_cli(*COMMON, "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1", run_dir=tmp_path / "single")
    multi, single = read_result(tmp_path / "multi"), read_result(tmp_path / "single")

    assert multi["num_processes"] == 2 and multi["global_devices"] == 8
    assert single["num_processes"] == 1 and single["global_devices"] == 1
    assert len(multi["losses"]) == STEPS
    assert np.abs(np.array(multi["losses"]) - np.array(single["losses"])).max() < TOLERANCE

    assert multi["plan"]["name"] == "dp_tp"
    assert multi["plan"]["mesh_shape"] == {"data": 2, "model": 4}
    assert multi["plan"]["rules"] == json.loads(plan_file.read_text())["rules"]
    model = load_preset("gpt-tiny")
    assert multi["flops_per_step"] == model.flops_per_step()
    assert multi["param_count"] == model.param_count()
    times = multi["step_times_s"]
    assert len(times) == STEPS and multi["step_time_s"] == pytest.approx(float(np.median(times[2:])))
    assert multi["tflops"] == pytest.approx(multi["flops_per_step"] / multi["step_time_s"] / 1e12)
    # Parameters and Adam moments are split 4 ways over "model" under dp_tp(model=4), so each
    # device holds less than the single device does.
    assert 0 < multi["peak_memory_bytes"] < single["peak_memory_bytes"]
    # Rank 0's progress bar went to its log.
    assert f"train GPT [dp_tp]: {STEPS}/{STEPS}" in (tmp_path / "multi" / "logs" / "rank0.log").read_text()
    # Its curves, for TensorBoard (read back with TensorBoard's own reader): the loss and the step
    # time once per step (0 to STEPS - 1), as result.json has them; throughput and TFLOPS of each
    # step; the compiled step's memory once; the attempt's time accounting at step 0 (attempt 0).
    curves = read_scalars(tmp_path / "multi")
    assert curves["loss"] == [(s, pytest.approx(v)) for s, v in enumerate(multi["losses"])]
    assert curves["step_time_s"] == [(s, pytest.approx(t)) for s, t in enumerate(times)]
    tokens = model.config.batch_size * model.config.seq_len
    assert curves["tokens_per_s"] == [(s, pytest.approx(tokens / t)) for s, t in enumerate(times)]
    assert curves["tflops"] == [(s, pytest.approx(multi["flops_per_step"] / t / 1e12)) for s, t in enumerate(times)]
    assert multi["tokens_per_s"] == pytest.approx(tokens / multi["step_time_s"])
    assert curves["memory_mib/peak"] == [(0, pytest.approx(multi["peak_memory_bytes"] / 2**20))]
    assert curves["time/steps_s"] == [(0, pytest.approx(sum(times), rel=1e-3))]
    assert {f"time/{k}" for k in ("queued_s", "startup_s", "compile_s", "checkpoint_s", "other_s", "goodput")} < set(curves)


@pytest.mark.parametrize("family, extra", [
    # GPT and LLaMA in the heavy stage: GPT trains under dp_tp on 2 processes through the launcher by
    # default above, and every plan's losses on LLaMA are test_plans.py's by default.
    pytest.param("gpt", [], marks=pytest.mark.heavy), ("bert", []),
    pytest.param("llama2", [], marks=pytest.mark.heavy), ("moe", []),
    # CFP's artifact's models in the heavy stage: the same trainer as the four above
    pytest.param("cfp-gpt", [], marks=pytest.mark.heavy), pytest.param("cfp-moe", [], marks=pytest.mark.heavy),
    # the artifact's learning rate: its constant label is learnt within a few steps at 1e-2
    pytest.param("cfp-llama", ["mode.learning_rate=1e-2"], marks=pytest.mark.heavy),
    # layers stacked and run by lax.scan (MoE's layer pairs stacked); in the heavy stage: a scanned
    # GPT trains by default below, and test_autoshard_scan trains a scanned built-in under every plan
    pytest.param("moe", ["model.scan_layers=true"], marks=pytest.mark.heavy),
])
def test_every_tiny_model_trains_through_the_launcher(tmp_path, family, extra):
    plan = "ep" if family.endswith("moe") else "dp_tp"
    run_cli("mode=train", f"model={family}-tiny", f"mode.plan={plan}", "mode.steps=4", "mode.warmup_steps=1",
            *extra, run_dir=tmp_path)
    r = read_result(tmp_path)
    assert r["num_processes"] == 2 and r["global_devices"] == 8 and r["plan"]["name"] == plan
    assert len(r["losses"]) == 4 and all(np.isfinite(r["losses"]))
    assert r["losses"][-1] < r["losses"][0]  # the synthetic data's signal is being learnt
    assert r["flops_per_step"] == load_preset(f"{family}-tiny").flops_per_step()


def test_a_scanned_model_trains_and_a_rerun_loads_its_compiled_programs(tmp_path):
    """model.scan_layers=true through the launcher; every job keeps what it compiles
    (launcher.compile_cache_dir), so a rerun in the same run dir loads its step instead. Where
    the JAX in use cannot read CPU executables back safely (before 0.5), the cache stays off and
    the log says so."""
    cache = tmp_path / "cache"
    args = ("mode=train", "model=gpt-tiny", "model.scan_layers=true", "mode.plan=dp_tp", "mode.steps=3",
            "mode.warmup_steps=1", f"launcher.compile_cache_dir={cache}")
    run_cli(*args, run_dir=tmp_path / "first")
    first = read_result(tmp_path / "first")
    assert first["losses"][-1] < first["losses"][0]
    log = (tmp_path / "first" / "logs" / "rank0.log").read_text()
    run_cli(*args, run_dir=tmp_path / "again")
    again = read_result(tmp_path / "again")
    assert again["losses"] == first["losses"]
    if not jaxcompat.compilation_cache_env("cpu", str(cache)):
        assert "JAX's persistent compilation cache: off (the JAX in use cannot read CPU executables" in log
        assert "compile_cache" not in first and "compile_cache" not in again
        return
    assert f"JAX's persistent compilation cache: {cache}" in log
    assert len(list(cache.iterdir())) > 0
    assert first["compile_cache"]["misses"] > 0
    assert again["compile_cache"] == {"dir": str(cache), "hits": first["compile_cache"]["misses"], "misses": 0}


def test_bad_input_found_by_a_task_exits_2_with_one_line(tmp_path):
    # Only the task can tell that a searched plan's constraints belong to another training step:
    # it reports bad input as the launcher does before submission (one line, exit status 2).
    plan = json.loads(builtin("dp").to_json())
    plan["constraints"] = {"program": "a step of some other model"}
    (tmp_path / "stale.json").write_text(json.dumps(plan))
    proc = run_cli(*COMMON, "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1",
                   f"mode.plan={tmp_path / 'stale.json'}", run_dir=tmp_path / "run", check=False, timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rank 0" in errors[0] and "constraints were made for a training step" in errors[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("override, message", [
    ("mode.plan=zero3", "unknown plan 'zero3'"),
    ("model.heads=6", "model.heads=6 does not divide model.hidden=64"),
    ("mode.warmup_steps=6", "mode.warmup_steps=6 must be at least 0 and below mode.steps=6"),
])
def test_bad_input_fails_with_one_clear_message(tmp_path, override, message):
    proc = run_cli(*COMMON, "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1", override,
                   run_dir=tmp_path, check=False, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
