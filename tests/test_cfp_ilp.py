"""The Alpa-style ILP (issue 17): cost model, formulation against brute force, the memory budget,
bad input, and the ILP's plan training like one device.

The ILP's pure parts run here on traced programs (no devices). Its calibration and its plans run
in subprocesses with 4 virtual CPU devices, like the other CFP tests.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import sys

import pytest

from launcher.sharding.analysis.core import analyze
from launcher.sharding.measuring.costmodel import COLLECTIVES, CommModel, Line, axis_groups, fit_line
from launcher.sharding.ilp.formulate import formulate
from launcher.sharding.ilp.operators import alpa_strategies, check_decidable, devices_used, operator_graph
from launcher.sharding.ilp.plan import brute_force
from launcher.sharding.ilp.solve import least_memory, solve
from launcher.errors import NoPlanFits, UserError
from tests.launch import read_result, run_cli
from tests.test_cfp_analysis import layer_program, mlp_program
from tests.test_cfp_search import run_python
from launcher.sharding.apply import plan_constraints, spec_json
from launcher.sharding.ilp.formulate import _Pricer
import jax
from launcher.sharding.apply import make_mesh
from launcher.sharding.ilp.plan import ilp_plan
from launcher.sharding.measuring.store import ProfileStore

pytestmark = pytest.mark.core


def comm_model(mesh_shape, gather_latency=1e-4):
    """A cost model with chosen lines: all-reduce cheap, the other collectives slower (so the
    plan of least communication replicates weights, and a memory budget changes the answer)."""
    lines = {}
    for axes in axis_groups(mesh_shape):
        for kind in COLLECTIVES:
            lines[(kind, axes)] = Line(5e-6 * len(axes), 1e9) if kind == "all-reduce" else \
                Line(gather_latency * len(axes), 1e8)
    return CommModel(tuple(mesh_shape), lines, 1e10)


def mlp_problem(mesh_shape):
    step, shapes = mlp_program(8)
    a = analyze(step, shapes, mesh_shape)
    return formulate(operator_graph(a), comm_model(mesh_shape))


# ---------------------------------------------------------------------------------------------
# The cost model


def test_resharding_is_priced_axis_by_axis():
    m = CommModel((4, 2), {(k, g): Line(1e-5 * (i + 1), 1e9) for i, k in enumerate(COLLECTIVES)
                           for g in axis_groups((4, 2))}, 1e10)
    shape, item = (8, 16), 4                      # 512 bytes whole
    rows0, rows01, cols0 = ((0,), ()), ((0, 1), ()), ((), (0,))
    assert m.reshard_seconds(shape, item, ((), ()), rows0) == 0.0           # slicing is local
    assert m.reshard_seconds(shape, item, rows0, rows0) == 0.0
    # Gathering rows split over axis 0: an all-gather over axis 0 whose output is the whole tensor.
    assert m.reshard_seconds(shape, item, rows0, ((), ())) == pytest.approx(m.seconds("all-gather", (0,), 512))
    # Rows to columns over the same axis: one all-to-all of a quarter of the tensor.
    assert m.reshard_seconds(shape, item, rows0, cols0) == pytest.approx(m.seconds("all-to-all", (0,), 128))
    # Split over both axes to axis 0 alone: an all-gather over axis 1 up to a quarter.
    assert m.reshard_seconds(shape, item, rows01, rows0) == pytest.approx(m.seconds("all-gather", (1,), 128))
    assert m.seconds("all-reduce", (), 1e6) == 0.0 and m.seconds("all-reduce", (0,), 0) == 0.0
    assert CommModel.from_json(json.loads(json.dumps(m.to_json()))) == m


def test_a_line_is_fitted_through_measurements_and_never_goes_negative():
    exact = [(n, 2e-5 + n / 3e9) for n in (4096, 65536, 2**20)]
    line = fit_line(exact)
    assert line.latency_s == pytest.approx(2e-5) and line.bytes_per_s == pytest.approx(3e9)
    falling = fit_line([(4096, 3e-4), (65536, 2e-4), (2**20, 1e-4)])   # noise: bigger was faster
    assert falling.latency_s > 0 and math.isinf(falling.bytes_per_s)
    through_origin = fit_line([(4096, 1e-6), (65536, 1e-4), (2**20, 3e-3)])
    assert through_origin.latency_s == 0 and through_origin.bytes_per_s > 0


# ---------------------------------------------------------------------------------------------
# The formulation and the solver


def test_alpa_strategies_use_every_device():
    step, shapes = layer_program()
    a = analyze(step, shapes, [2, 2])
    for op, c in a.contractions.items():
        kept = alpa_strategies(c, [2, 2])
        assert kept and all(devices_used(s, [2, 2]) == 4 for s in kept), a.contraction_line(op)
    og = operator_graph(a)
    # One node per contraction; every operator follows exactly one node.
    assert [b.head for b in og.nodes] == sorted(a.contractions)
    assert sorted(i for b in og.nodes for i in b.ops) == list(range(len(a.graph.ops)))


@pytest.mark.parametrize("mesh_shape", [[4], [2, 2]])
def test_the_ilp_optimum_is_the_brute_force_optimum(mesh_shape):
    p = mlp_problem(mesh_shape)
    assert p.edges and p.space > 100
    best, plan = brute_force(p)
    s = solve(p)
    assert s.status == "optimal"
    assert s.comm_s == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert p.comm_s(s.choice) == pytest.approx(best, rel=1e-9, abs=1e-12)
    # The unconstrained optimum holds more than the least memory; a budget between the two
    # excludes it, and the ILP finds the brute-force optimum of the plans that fit.
    least = min(p.memory_bytes(c) for c in itertools.product(*(range(n) for n in p.sizes)))
    assert p.memory_bytes(plan) > least
    assert least_memory(p)[0] == least
    budget = (p.memory_bytes(plan) + least) / 2
    fits, _ = brute_force(p, budget)
    s = solve(p, budget)
    assert s.memory_bytes <= budget and s.comm_s == pytest.approx(fits, rel=1e-9, abs=1e-12)
    assert s.comm_s > best                        # the budget cost something
    assert s.num_variables > sum(p.sizes)         # the edges' variables are in


def test_a_budget_no_plan_fits_names_the_least_memory_any_plan_needs():
    p = mlp_problem([2, 2])
    least = min(p.memory_bytes(c) for c in itertools.product(*(range(n) for n in p.sizes)))
    with pytest.raises(NoPlanFits) as e:
        solve(p, least - 1)
    message = str(e.value)
    assert "\n" not in message
    assert f"the least memory any plan needs is {least / 2**30:.6g} GB per device" in message
    assert message.startswith(f"no plan fits mode.memory_budget_gb={(least - 1) / 2**30:.6g}")
    assert solve(p, least).memory_bytes == least   # and exactly that much fits


def test_the_layouts_the_ilp_prices_are_the_layouts_the_plan_applies():
    """The ILP charges each program input the layout of the node it follows; plan_constraints
    (how the plan is applied) must give every input exactly that layout, for any choice."""

    step, shapes = layer_program()
    a = analyze(step, shapes, [2, 2])
    og = operator_graph(a)
    pricer = _Pricer(og.analysis, comm_model([2, 2]))
    rng = random.Random(0)
    for _ in range(5):
        choice = [rng.randrange(b.num_plans) for b in og.nodes]
        constraints = plan_constraints(og.analysis, dict(enumerate(choice)))
        for v, name in zip(a.graph.inputs, a.graph.input_names, strict=True):
            u = pricer.decider(v)
            priced = pricer.input_layouts(v, u)[choice[u]] if u is not None else ((),) * len(a.graph.shape(v))
            assert constraints[f"in:{name}"] == spec_json(priced), name


def test_a_solver_stopped_before_any_plan_is_one_clear_message():
    p = mlp_problem([2, 2])
    with pytest.raises(UserError, match=r"^the ILP solver \(HiGHS .*\) did not solve the model: .*time limit"):
        solve(p, time_limit_s=0.0)


# ---------------------------------------------------------------------------------------------
# Bad input before anything is measured


def test_a_missing_solver_is_one_line_and_writes_nothing(tmp_path, monkeypatch):

    step, shapes = mlp_program(8)
    a = analyze(step, shapes, [4])
    store = ProfileStore(tmp_path / "store")
    monkeypatch.setitem(sys.modules, "highspy", None)   # what Python does when it is not installed
    with pytest.raises(UserError, match=r"^the ILP solver is missing .*pip install highspy"):
        ilp_plan(a, make_mesh([4], jax.devices()[:4]), store)
    assert len(store) == 0


def test_a_program_with_no_contraction_to_decide_is_refused():
    step, shapes = mlp_program()
    a = analyze(step, shapes, [1])
    with pytest.raises(UserError, match=r"^the ILP has no contraction to decide: .*mode.mesh_shape"):
        check_decidable(operator_graph(a))


# ---------------------------------------------------------------------------------------------
# On devices: calibration into the store, the plan trains like one device


ILP_TRAINS = r"""
import json, sys
import jax
from launcher.sharding import pipeline
from launcher.sharding.apply import constraints_transform
from launcher.sharding.ilp.plan import ilp_plan
from launcher.sharding.measuring.store import ProfileStore
from launcher.sharding.search.measure import plan_runner
from launcher.models.gpt import GPT
from launcher.models.plans import Plan, builtin
from launcher.models.train import run_training

model = GPT(batch_size=8, seq_len=16, num_layers=1, hidden=32, heads=4, vocab_size=64)
analyzed = pipeline.analyze(model, mesh_shape=[2, 2])
a, program = analyzed.analysis, analyzed.program
mesh = pipeline.make_mesh([2, 2])
store = ProfileStore(sys.argv[1])
planned = ilp_plan(a, mesh, store, repeats=3)
again = ilp_plan(a, mesh, store)
runner = planned.runner(program)
runner.steps(3)
# The per-contraction layouts, whether or not this solution is also a CFP block plan.
per_op = plan_runner(planned.operators.analysis, program, dict(enumerate(planned.solution.choice)), mesh)
per_op.steps(3)
plan = Plan.from_dict(json.loads(planned.plan.to_json()))     # plan.json, as mode=train reads it
trained = run_training(model, plan, 3, optimizer=program.optimizer, transform_step=constraints_transform(plan))
one = run_training(model, builtin("dp"), 3, jax.devices()[:1], optimizer=program.optimizer)
print(json.dumps({"losses": runner.losses, "per_op": per_op.losses, "plan_json": trained.losses,
                  "one_device": one.losses, "calibrated": [planned.calibrated_now, again.calibrated_now],
                  "same_choice": planned.solution.choice == again.solution.choice, "entries": len(store),
                  "summary": planned.summary(), "plan_name": plan.name, "constraints": len(plan.constraints)}))
"""


@pytest.mark.slow
def test_the_ilp_plan_trains_with_the_losses_of_one_device(tmp_path):
    r = run_python(ILP_TRAINS, str(tmp_path / "store"))
    assert r["losses"] == pytest.approx(r["one_device"], rel=1e-5, abs=1e-6)
    assert r["per_op"] == pytest.approx(r["one_device"], rel=1e-5, abs=1e-6)
    assert r["plan_json"] == pytest.approx(r["losses"], rel=1e-5, abs=1e-6)
    # Calibrated once into the store (one entry), read back by the second solve.
    assert r["calibrated"] == [True, False] and r["entries"] == 1 and r["same_choice"]
    s = r["summary"]
    assert s["num_variables"] > s["nodes"] > 0 and s["solve_time_s"] > 0 and s["predicted_step_time_s"] > 0
    assert s["solver_status"] == "optimal"
    assert r["plan_name"] == "alpa_ilp" and r["constraints"] > 0


# ---------------------------------------------------------------------------------------------
# Through the CLI


@pytest.mark.heavy  # the ILP through the CLI end to end; its plan trains in a default test
def test_mode_search_with_the_ilp_writes_a_plan_measured_against_baselines(tmp_path):
    store = f"mode.store_dir={tmp_path / 'store'}"
    # A margin no plan can beat by (99%): the answer falls back to the baseline, dp, whatever the timings.
    proc = run_cli("mode=search", "mode.algorithm=ilp", "model=gpt-tiny", "mode.mesh_shape=[4,2]",
                   "mode.iterations=2", "mode.run_repeats=1", "mode.baselines=[dp]", "mode.verify_margin=0.99", store,
                   run_dir=tmp_path / "ilp", timeout=900)
    result = read_result(tmp_path / "ilp")
    assert result["algorithm"] == "ilp"
    for key in ("step_time_s", "tflops", "memory_gb", "solve_time_s", "num_variables", "predicted_step_time_s"):
        assert key in result, key
    assert set(result["baselines"]["dp"]) >= {"step_time_s", "tflops", "memory_gb"}
    for name in ("plan.json", "alpa_ilp_plan.json", "ilp_plan.txt", "comparison.txt", "comparison.png",
                 "strategy_map.txt", "after_ir.txt", "alpa_ilp_after_ir.txt"):
        assert (tmp_path / "ilp" / name).stat().st_size > 0, name
    answer = result["answer"]
    assert (answer["source"], answer["name"], answer["searched"], answer["best_baseline"]) == \
        ("baseline", "dp", "alpa_ilp", "dp")
    assert answer["vs_best_baseline_paired"] == 1.0 and answer["searched_vs_best_baseline_paired"] > 0
    # The reason ends with the answer, then, where the ILP's plan ran over 1.02x dp, a note on why
    # (sharding/behind.py): timings decide whether it is there, never what it says.
    said, _, behind = answer["why"].partition(". Behind dp: ")
    assert re.fullmatch(r"the Alpa-style ILP's plan ran [\d.]+x the time of the fastest baseline, dp, round by round "
                        r"\(paired over \d+ rounds\): not faster by the 99% mode\.verify_margin asks, so the answer "
                        r"is dp's plan", said), answer["why"]
    assert bool(behind) == (answer["searched_vs_best_baseline_paired"] > 1.02), answer["why"]
    # In a user's words under the table; the whole account, which block differs and why, in the log.
    assert len(behind) <= 200 and "block" not in behind, answer["why"]
    rank0 = (tmp_path / "ilp" / "logs" / "rank0.log").read_text()
    assert not behind or f"why it trails: the Alpa-style ILP's plan ran " \
        f"{answer['searched_vs_best_baseline_paired']:.3f}x dp (over 1.02x): " in rank0
    assert result["plan"]["file"] == str(tmp_path / "ilp" / "alpa_ilp_plan.json")
    table = (tmp_path / "ilp" / "comparison.txt").read_text()
    assert "alpa_ilp" in table and "dp (answer)" in table and answer["why"] in table and answer["why"] in proc.stdout
    assert json.loads((tmp_path / "ilp" / "plan.json").read_text())["mesh_axes"] == [["data", 8]]
    # plan.json, a baseline's, trains like any plan file: the answer's losses and memory in the race.
    run_cli("mode=train", "model=gpt-tiny", f"mode.plan={tmp_path / 'ilp' / 'plan.json'}",
            f"mode.steps={len(answer['losses'])}", run_dir=tmp_path / "train", timeout=600)
    trained = read_result(tmp_path / "train")
    assert trained["losses"] == pytest.approx(answer["losses"], rel=1e-5, abs=1e-6)
    assert trained["peak_memory_bytes"] == round(answer["memory_gb"] * 2**30)


@pytest.mark.parametrize("override,message", [
    ("mode.algorithm=alpa", "mode.algorithm='alpa': choose cfp (CFP's profiling search) or ilp"),
    ("mode.baselines=[dp,alpa]", "mode.baselines: 'alpa' is not a built-in plan"),
])
def test_bad_ilp_settings_fail_before_submission(tmp_path, override, message):
    proc = run_cli("mode=search", override, run_dir=tmp_path / "run", check=False, timeout=300)
    assert proc.returncode == 2, proc.stderr
    first = next(line for line in proc.stderr.splitlines() if line.strip())
    assert message in first, proc.stderr
