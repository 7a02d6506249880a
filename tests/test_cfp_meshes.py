"""mode.mesh_shape=auto (or a list of meshes): which logical meshes are searched, which plans they offer, and how
their shortlists are merged (launcher/sharding/search/meshes.py). The whole path through the CLI is
in tests/test_cfp_search.py (test_two_processes_agree_and_the_saved_plan_trains)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from omegaconf import OmegaConf

from launcher.modes.analysis import Config as AnalysisMode
from launcher.modes.checks import Job
from launcher.modes.search import Config as SearchMode
from launcher.sharding import pipeline
from launcher.sharding.analysis.contractions import Contraction, LoopDim as Dim
from launcher.sharding.analysis.strategies import enumerate_strategies
from launcher.sharding.algorithms.cfp import CfpOptions, within_reach
from launcher.sharding.algorithms.cfp.algorithm import _log_shortlist
from launcher.sharding.options import SearchOptions
from launcher.sharding.search.dp import Candidate
from launcher.sharding.search.meshes import (auto_shapes, crossings, for_each_mesh, is_several, merge_shortlists,
                                             mesh_shapes, natural_shape)
from launcher.sharding.user.step import step_program
from launcher.models.plans import Plan, arranged
from launcher.errors import NoPlanFits, UserError
from tests import user_programs
from tests.test_cfp_search import run_python
from launcher.sharding.measuring.costmodel import CommModel, Line
from launcher.sharding.ilp.gate import arranged_model

pytestmark = pytest.mark.core


def test_auto_searches_the_1d_mesh_and_every_2d_factorisation():
    assert auto_shapes(8) == [[8], [4, 2], [2, 4]]
    assert auto_shapes(16) == [[16], [8, 2], [4, 4], [2, 8]]
    assert auto_shapes(4) == [[4], [2, 2]]
    assert auto_shapes(7) == [[7]] and auto_shapes(1) == [[1]]
    assert mesh_shapes("auto", 8) == auto_shapes(8)
    assert mesh_shapes([], 8) == [[8]] and mesh_shapes([2, 4], 8) == [[2, 4]]


def test_over_several_processes_auto_adds_the_3d_meshes_whose_first_axis_crosses_them():
    assert auto_shapes(8, processes=2) == [[8], [4, 2], [2, 4], [2, 2, 2]]
    assert auto_shapes(16, processes=2) == [[16], [8, 2], [4, 4], [2, 8], [2, 4, 2], [2, 2, 4]]
    assert auto_shapes(8, processes=8) == auto_shapes(8)   # one device each: nothing within a process to split
    assert mesh_shapes("auto", 8, 2)[-1] == [2, 2, 2]
    # Which axes the processes may change along: those their count divides, on a mesh of several axes.
    assert crossings([2, 4], 2) == [0, 1] and crossings([2, 2, 2], 2) == [0, 1, 2]
    assert crossings([8], 2) == [] and crossings([4, 2], 1) == []


def test_devices_are_ordered_by_process_and_the_axis_across_them_is_chosen():
    class Dev:
        def __init__(self, i, p):
            self.id, self.process_index = i, p

    # Two processes of 4 devices each, listed out of order.
    devs = [Dev(i, i // 4) for i in (5, 0, 7, 2, 1, 4, 6, 3)]
    ids = lambda grid: [[d.id for d in row] for row in grid]
    procs = lambda grid, k: {tuple(sorted({d.process_index for d in line}))
                             for line in np.moveaxis(grid, k, -1).reshape(-1, grid.shape[k])}
    assert ids(arranged(devs, (2, 4))) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert procs(arranged(devs, (2, 4)), 0) == {(0, 1)} and procs(arranged(devs, (2, 4)), 1) == {(0,), (1,)}
    across = arranged(devs, (4, 2), across=1)   # the second axis between the processes
    assert procs(across, 1) == {(0, 1)} and procs(across, 0) == {(0,), (1,)}
    cube = arranged(devs, (2, 2, 2), across=2)
    assert procs(cube, 2) == {(0, 1)} and procs(cube, 0) == procs(cube, 1) == {(0,), (1,)}
    # plan.json names the axis between processes, and a plan read back lays its mesh out so.
    plan = Plan("cfp", (("cfp0", 4), ("cfp1", 2)), {}, {}, across="cfp1")
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again.across == "cfp1" and json.loads(plan.to_json())["across"] == "cfp1"
    assert "across" not in json.loads(Plan("dp", (("data", 8),), {}).to_json())


def test_3d_meshes_split_the_batch_over_the_axis_across_processes():
    c = Contraction(op=0, kind="dot", lhs=0, rhs=1, out=2, lhs_shape=(8, 8, 8), rhs_shape=(8, 8),
                    out_shape=(8, 8, 8), dims=(Dim("batch", 8, 0, None, 0), Dim("lhs_free", 8, 1, None, 1),
                                               Dim("rhs_free", 8, None, 1, 2), Dim("contracting", 8, 2, 0, None)))
    three = enumerate_strategies(c, [2, 2, 2], two_axis_only=True)
    two = enumerate_strategies(c, [2, 2], two_axis_only=True)
    assert len(three) == len(two) == 12   # the pairs of the two axes within each process
    for s in three:
        assert 0 in s.axes[0], s          # the batch, split over the axis between processes


def test_each_builtin_plan_has_the_mesh_it_lays_itself_out_on():
    assert natural_shape("dp", 8) == [8]
    assert natural_shape("tp", 8) == [8]
    assert natural_shape("dp_tp", 8) == [4, 2]


def _matmul() -> Contraction:
    # C[i, j] = A[i, k] B[k, j]: one lhs-free, one rhs-free and one contracting dimension
    dims = (Dim("lhs_free", 8, 0, None, 0), Dim("rhs_free", 8, None, 1, 1), Dim("contracting", 8, 1, 0, None))
    return Contraction(op=0, kind="dot", lhs=0, rhs=1, out=2, lhs_shape=(8, 8), rhs_shape=(8, 8),
                       out_shape=(8, 8), dims=dims)


def test_auto_2d_meshes_offer_only_plans_that_split_two_roles():
    c = _matmul()
    full = enumerate_strategies(c, [4, 2])
    two = enumerate_strategies(c, [4, 2], two_axis_only=True)
    # 3 roles: 6 ordered pairs, 3 over both axes (1-D plans of 8), 6 with an axis left repeating
    assert len(full) == 15 and len(two) == 6
    for s in two:
        used = [ax for ax in s.axes if ax]
        assert sorted(used) == [(0,), (1,)], s
    assert set(two) <= set(full)
    # a contraction with one splittable role has no pair: it keeps the full rule
    only = Contraction(op=0, kind="dot", lhs=0, rhs=1, out=2, lhs_shape=(8, 3), rhs_shape=(3, 3),
                       out_shape=(8, 3), dims=(Dim("lhs_free", 8, 0, None, 0), Dim("rhs_free", 3, None, 1, 1),
                                               Dim("contracting", 3, 1, 0, None)))
    assert enumerate_strategies(only, [4, 2], two_axis_only=True) == enumerate_strategies(only, [4, 2])


def _c(t: float, source: str) -> Candidate:
    return Candidate([0], t, 0, source)


def test_merged_shortlist_keeps_every_optimum_and_nearest_plan_then_the_fastest_others():
    shorts = [[_c(3.0, "search optimum"), _c(2.5, "nearest dp"), _c(1.0, "uniform 0"), _c(4.0, "runner-up")],
              [_c(2.0, "search optimum"), _c(2.2, "nearest dp_tp"), _c(1.5, "runner-up")],
              [_c(5.0, "search optimum"), _c(0.5, "uniform 1")]]
    merged = merge_shortlists(shorts, k=4)
    got = [(i, c.source, c.predicted_time_s) for i, c in merged]
    assert got == [(1, "search optimum", 2.0), (0, "search optimum", 3.0), (2, "search optimum", 5.0),
                   (1, "nearest dp_tp", 2.2), (0, "nearest dp", 2.5),
                   (2, "uniform 1", 0.5)]  # k=4 less the 3 optima leaves room for one more
    one = merge_shortlists(shorts[:1], k=2)
    assert [c for _, c in one] == shorts[0]


def test_a_shortlisted_plan_predicted_far_slower_is_not_measured_but_the_fastest_incumbent_always_is():
    """cfp.within_reach: a whole-step compile and its rounds saved per plan the profile predicts
    over verify_slower_than times the fastest; the plan nearest a baseline that the others must
    beat is measured however slow it is predicted."""
    short = [(0, _c(1.0, "search optimum")), (1, _c(1.9, "search optimum")), (2, _c(2.5, "search optimum")),
             (0, _c(3.5, "nearest fsdp")), (1, _c(2.6, "nearest dp")), (1, _c(2.6, "nearest dp, state stored split"))]
    keep, why = within_reach(short, incumbents=[3, 4, 5], slower_than=2.0)
    assert keep == [0, 1, 4]   # nearest dp: the fastest incumbent (the first of two alike)
    assert why == {k: f"predicted {r:.2f}x the fastest plan's time, over mode.verify_slower_than=2 (0 measures "
                      "every one)" for k, r in ((2, 2.5), (3, 3.5), (5, 2.6))}
    assert within_reach(short, incumbents=[3, 4], slower_than=0) == (list(range(6)), {})   # 0: every one
    assert within_reach(short, incumbents=[], slower_than=3.0)[0] == [0, 1, 2, 4, 5]
    with pytest.raises(UserError, match=r"mode.verify_slower_than=1: must be a factor above 1"):
        CfpOptions(verify_slower_than=1)


def _row(source, ratio, over, *, rounds=4, chosen=False, incumbent=False, duel=None):
    """A shortlist row as shortlist.pick makes it (the figures the log reads)."""
    return {"source": source, "assignment": [0, 1], "mesh_shape": [4, 2], "predicted_step_time_s": 0.2,
            "measured_step_time_s": 0.1 * ratio, "paired_ratio": ratio, "over_incumbent_paired": over,
            "chosen": chosen, "incumbent": incumbent, "duel_over_incumbent_paired": duel, "rounds": rounds,
            "duel_rounds": 8 if duel is not None else 0, "won_clearly": False}


def test_the_shortlists_log_says_why_a_plan_ahead_by_the_margin_was_not_kept():
    """The default job of 2026-12-08: the plan measured fastest over all the shortlist's rows
    (0.884 of the plan nearest dp_tp, round by round) was neither kept nor raced alone, as the
    plan first among those that ran every round raced it alone and lost; the log had said the
    fastest one missed the 0.980 it had met."""
    said = []
    rows = [_row("search optimum", 0.841, 0.90, duel=1.002), _row("nearest dp_tp", 0.998, 1.0, chosen=True,
                                                                    incumbent=True, duel=1.0),
            _row("search optimum, cfp1 across processes", 0.812, 0.884)]
    _log_shortlist(rows, 4, 5, 0.02, said.append)
    assert said[-1] == ("kept nearest dp_tp ([0, 1]): search optimum, cfp1 across processes ([0, 1]) measured 0.884 "
                        "of its time round by round, but search optimum ([0, 1]) came first among the plans that ran "
                        "every round (each round's median taken over them) and raced it alone instead")
    assert not any("not the 0.980" in line for line in said)
    # Cut from the short rounds: only a plan that ran every one replaces it.
    said.clear()
    _log_shortlist([rows[1], _row("runner-up", 0.8, 0.85, rounds=2)], 4, 5, 0.02, said.append)
    assert said[-1].endswith("measured 0.850 of its time round by round, but it ran 2 of 4 rounds, and only a plan "
                             "that ran every one replaces it")
    # Behind the margin: as it was.
    said.clear()
    _log_shortlist([rows[1], _row("runner-up", 0.99, 0.99)], 4, 5, 0.02, said.append)
    assert said[-1] == ("kept nearest dp_tp ([0, 1]): runner-up measured 0.990 of its time round by round, not the "
                        "0.980 (mode.verify_margin=0.02) needed to replace a plan nearest a baseline")


def test_a_mesh_that_refuses_is_left_out_and_one_typed_error_when_every_mesh_does():
    """for_each_mesh, the loop of the analysis, the search's DP and the ILP over the meshes."""
    def attempt(i, bad=(1,)):
        if i in bad:
            raise NoPlanFits(f"too big {i}")
        return 10 * i

    none_fit = lambda why: NoPlanFits("none fits: " + why)
    lines = []
    shapes = [[8], [4, 2], [2, 4]]
    assert for_each_mesh(shapes, attempt, refuse=NoPlanFits, none_fit=none_fit, log=lines.append) == \
        ([0, None, 20], [None, "too big 1", None])
    assert lines == ["mesh [4, 2]: left out: too big 1"]
    with pytest.raises(NoPlanFits, match=r"^none fits: mesh \[8\]: too big 0; mesh \[4, 2\]: too big 1$"):
        for_each_mesh(shapes[:2], lambda i: attempt(i, bad=(0, 1)), refuse=NoPlanFits, none_fit=none_fit,
                      log=lines.append)
    with pytest.raises(NoPlanFits, match=r"^too big 0$"):   # one mesh: its own reason, as it is
        for_each_mesh(shapes[:1], lambda i: attempt(i, bad=(0,)), refuse=NoPlanFits, none_fit=none_fit,
                      log=lines.append)

    def bad_input(i):
        raise UserError("not a refusal")

    with pytest.raises(UserError, match="not a refusal"):   # only what ``refuse`` names leaves a mesh out
        for_each_mesh(shapes, bad_input, refuse=NoPlanFits, none_fit=none_fit, log=lines.append)


def test_a_list_of_meshes_is_searched_as_given_and_each_is_named_once():
    assert mesh_shapes([[8], [4, 2]], 8) == [[8], [4, 2]] and mesh_shapes([[], [2, 4]], 8) == [[8], [2, 4]]
    assert mesh_shapes(OmegaConf.create([[4, 2]]), 8) == [[4, 2]]   # as Hydra composes it
    assert is_several("auto") and is_several([[8], [4, 2]]) and is_several([[4, 2]])
    assert not is_several([4, 2]) and not is_several([])
    with pytest.raises(UserError, match=r"^mode.mesh_shape=\[\[8\], \[\]\] names the mesh \[8\] twice: give each "
                                        r"mesh once$"):
        mesh_shapes([[8], []], 8)
    # Before submission, one line each: every mesh the job's devices, each once, sizes not names.
    job = Job(devices=8, files_here=True)
    mode = lambda shape, cls=SearchMode: OmegaConf.structured(cls(mesh_shape=shape))
    SearchMode.check(mode([[8], [4, 2], [2, 2, 2]]), job)
    with pytest.raises(UserError, match=r"^mode.mesh_shape=\[4, 4\] has 16 devices but the job has 8: "):
        SearchMode.check(mode([[8], [4, 4]]), job)
    with pytest.raises(UserError, match=r"names the mesh \[4, 2\] twice"):
        SearchMode.check(mode([[4, 2], [4, 2]]), job)
    with pytest.raises(UserError, match=r"^mode.mesh_shape=\[\[8\], \['a', 2\]\]: give a list of axis sizes, .* "
                                        r"or several meshes to search, e.g. \[\[8\],\[4,2\]\]$"):
        SearchMode.check(mode([[8], ["a", 2]]), job)
    with pytest.raises(UserError, match=r"^mode.mesh_shape=\[\[8\], \[4, 2\]\]: mode=analysis analyses one mesh"):
        AnalysisMode.check(mode([[8], [4, 2]], AnalysisMode), job)


def test_a_2d_mesh_listed_without_the_1d_one_offers_every_plan():
    """The two-role rule leaves out what the 1-D mesh offers, so it holds only where that is searched too."""
    s = user_programs.make_numpy_mlp()   # plain JAX: the oldest JAX's venv runs it too
    program = step_program(s.fn, s.args, data_argnums=s.data_argnums)
    lines = []
    with_1d = pipeline.analyze_meshes(program, [[8], [4, 2]], log=lines.append)
    alone = pipeline.analyze_meshes(program, [[4, 2]])
    assert [o.shape for o in with_1d] == [[8], [4, 2]] and [o.shape for o in alone] == [[4, 2]]
    assert [o.folder for o in with_1d] == ["mesh_8/", "mesh_4x2/"] and alone[0].folder == "mesh_4x2/"
    assert lines[0] == f"mode.mesh_shape=[[8], [4, 2]]: searching the logical meshes [[8], [4, 2]] of the " \
                       f"{jax.device_count()} devices"
    plans = lambda o: sum(b.enumerated for b in o.analyzed.analysis.blocks)
    assert with_1d[1].analyzed.analysis.two_axis_only and not alone[0].analyzed.analysis.two_axis_only
    assert plans(alone[0]) > plans(with_1d[1])


GATE = r"""
import json, sys
from launcher.sharding import pipeline
from launcher.sharding.measuring.store import ProfileStore
from launcher.sharding.ilp.gate import gate
from launcher.models.gpt import GPT

model = GPT(batch_size=8, seq_len=16, num_layers=1, hidden=32, heads=4, vocab_size=64)
on = pipeline.analyze_meshes(model, [[8], [4, 2], [2, 4]])
store = ProfileStore(sys.argv[1])
meshes, shapes = [(o.analyzed.analysis, o.mesh) for o in on], [o.shape for o in on]
out = {}
for ratio in (0, 1e9, 1.0):
    g = gate(meshes, ratio, store, repeats=3)
    out[str(ratio)] = {"keep": g.keep, "predicted": g.predicted_s, "rows": g.rows(shapes, ratio)}
print(json.dumps(out))
"""


def test_the_mesh_gate_profiles_only_meshes_the_ilp_model_prices_within_the_factor(tmp_path):
    """mode.mesh_gate (ilp/gate.py): each mesh's optimum priced by the ILP's calibrated
    model; over the factor times the best mesh's, a mesh is not profiled and its row says why."""
    out = run_python(GATE, str(tmp_path / "store"), devices=8)
    off, wide, tight = out["0"], out["1000000000.0"], out["1.0"]
    assert off["keep"] == [True] * 3 and off["predicted"] == [None] * 3     # 0: nothing priced, every mesh kept
    predicted = wide["predicted"]
    assert all(p > 0 for p in predicted) and wide["keep"] == [True] * 3
    assert tight["predicted"] == predicted     # the calibration read back from the store: the same prices
    best = predicted.index(min(predicted))
    assert tight["keep"] == [i == best for i in range(3)]
    for i, row in enumerate(tight["rows"]):
        assert row["mesh_shape"] == [[8], [4, 2], [2, 4]][i] and row["gate_predicted_step_time_s"] == predicted[i]
        if i == best:
            assert "skipped" not in row
        else:
            assert row["skipped"] == (f"not profiled: the ILP's cost model predicts its best plan "
                                      f"{predicted[i] / predicted[best]:.2f}x the best mesh's, over mode.mesh_gate=1 "
                                      "(0 profiles every mesh)")
    with pytest.raises(UserError, match=r"mode.mesh_gate=0.5: must be a factor of 1 or more"):
        SearchOptions(mesh_gate=0.5)


def test_a_mesh_arranged_with_another_axis_across_processes_is_priced_with_that_meshs_lines():
    """The gate prices a mesh at each arrangement the shortlist measures (ilp/gate.py):
    [4, 2] with axis 1 across the processes is [2, 4]'s grid, axes swapped."""
    lines = {("all-reduce", (0,)): Line(1e-3, 1e8), ("all-reduce", (1,)): Line(1e-5, 1e10),
             ("all-reduce", (0, 1)): Line(2e-3, 1e8)}
    m = arranged_model(CommModel((2, 4), lines, 1e10), 1)
    assert m.mesh_shape == (4, 2) and m.matmul_flops_per_s == 1e10
    assert m.lines == {("all-reduce", (1,)): Line(1e-3, 1e8), ("all-reduce", (0,)): Line(1e-5, 1e10),
                       ("all-reduce", (0, 1)): Line(2e-3, 1e8)}
    # [2, 2, 2] with axis 2 across: the first axis's lines move to axis 2, the others down by one.
    lines3 = {("all-gather", g): Line(float(i), 1e9) for i, g in enumerate([(0,), (1,), (2,), (0, 2), (1, 2)])}
    m3 = arranged_model(CommModel((2, 2, 2), lines3, 1.0), 2)
    assert m3.lines[("all-gather", (2,))] == Line(0.0, 1e9) and m3.lines[("all-gather", (0,))] == Line(1.0, 1e9)
    assert m3.lines[("all-gather", (1,))] == Line(2.0, 1e9) and m3.lines[("all-gather", (1, 2))] == Line(3.0, 1e9)
    assert m3.lines[("all-gather", (0, 1))] == Line(4.0, 1e9) and len(m3.lines) == 5
