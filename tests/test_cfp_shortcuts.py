"""CFP's profiling shortcuts (issue 16): candidates over the memory budget are not timed, and
candidates whose first runs are far slower than their segment's best are stopped early.

The decisions are checked on given figures, never on how fast this machine happens to run: a
memory budget placed between compiled memories, a best time recorded in the store that every
real run is slower than, recorded runs at the threshold. Real programs run on 4 of the 8
virtual CPU devices conftest.py sets up; the two-process check goes through the CLI.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from types import SimpleNamespace

import jax
import pytest

from launcher.sharding.options import ProfileOptions
from launcher.sharding.profile.candidates import CandidateLoop, Shortcuts, batched, memory_of
from launcher.sharding.profile.keys import PROFILE_VERSION
from launcher.sharding.measuring.store import ProfileStore
from launcher.sharding.measuring.timing import EarlyStop, Timer
from launcher.sharding.search.dp import predict, search, shortlist
from launcher.errors import UserError
from tests.launch import read_result, run_cli
from tests.test_cfp_search import SMALL_GPT, brute_force, synthetic_profiles
from launcher.sharding.analysis.core import analyze
from launcher.sharding.apply import make_mesh
from tests.test_cfp_analysis import mlp_program
from launcher.sharding.profile.profiler import Profiler
from launcher.sharding.profile.keys import StoreKeys
from launcher.sharding.model_program import training_program
from launcher.models.gpt import GPT
from launcher.sharding.profile.units import profiling_units
from launcher.sharding.profile.budget import UNITS_OVER_STEP, gb_at_least, state_floor_bytes
import time
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

pytestmark = pytest.mark.core


# ---------------------------------------------------------------------------------------------
# Decisions on given figures


def test_early_stop_decides_on_the_fastest_of_the_first_runs():
    stop = EarlyStop(ratio=1.5, best_s=0.010)
    assert stop.slower([0.016, 0.020])            # both over 1.5 x 10 ms
    assert not stop.slower([0.014, 0.030])        # one run a neighbour slowed does not stop it
    assert not stop.slower([0.015, 0.015])        # at the ratio is not over it
    assert not EarlyStop(0.0, 0.010).slower([1.0, 1.0])          # ratio 0: off
    assert not EarlyStop(1.5, math.inf).slower([1.0, 1.0])       # nothing timed in full yet
    # The overhead program beside each run says how fast the machine ran then: runs beside an
    # overhead run twice the best's count half (a burst of someone else's work slows both);
    # an overhead run faster than the best's changes nothing (the guard only stops less).
    paced = EarlyStop(ratio=1.5, best_s=0.010, best_overhead_s=0.001)
    assert paced.slower([0.016, 0.020], [0.001, 0.001])
    assert not paced.slower([0.016, 0.020], [0.002, 0.001])     # the first ran during a burst
    assert paced.slower([0.040, 0.040], [0.002, 0.002])         # slow even for a slowed machine
    assert paced.slower([0.016, 0.020], [0.0005, 0.0005])


def test_stored_entries_are_reused_only_where_they_stand_for_this_run():
    full = {"time_s": 0.01, "mem_bytes": 100}
    over = {"time_s": None, "over_budget": True, "budget_bytes": 60, "mem_bytes": 100}
    bound = {"time_s": 0.05, "stopped_early": True, "stop_ratio": 1.5, "mem_bytes": 100}
    # An entry without marks (every store written before the shortcuts) is a full measurement.
    for sc in (Shortcuts(), Shortcuts(50, 1.5), Shortcuts(None, 3.0)):
        assert sc.reuses(full)
    # Over budget: still over a smaller budget; a budget it fits, or none, must time it. What
    # counts is the least memory a plan holding it needs (its floor), when the entry has it.
    assert Shortcuts(99).reuses(over) and Shortcuts(60).reuses(over)
    assert not Shortcuts(100).reuses(over) and not Shortcuts(1000).reuses(over) and not Shortcuts().reuses(over)
    floored = {**over, "plan_floor_bytes": 150}
    assert Shortcuts(149).reuses(floored) and not Shortcuts(150).reuses(floored)
    # Stopped early: a bound for runs that stop as eagerly or more; not for a larger ratio or none.
    assert Shortcuts(None, 1.5).reuses(bound) and Shortcuts(None, 1.2).reuses(bound)
    assert not Shortcuts(None, 2.0).reuses(bound) and not Shortcuts(None, 0.0).reuses(bound)
    # The shortcuts did not change what an entry means (stores from before them kept their keys,
    # version 4); scanned bodies profiled an iteration at a time did (5).
    assert PROFILE_VERSION == 5


def test_search_never_picks_an_untimed_combination_and_uses_a_bound_as_its_cost():
    prof = synthetic_profiles()
    best_t, best_m, best_plan = min(brute_force(prof))
    # The unconstrained optimum's combination of unit 1, untimed as the profile leaves it when
    # its memory (raised here to 60) is over the profile's budget.
    c = best_plan[1]
    prof.table[(1, 0)][(c,)] = {"time_s": None, "over_budget": True, "budget_bytes": 40, "mem_bytes": 60}
    assert math.isinf(predict(prof, best_plan)[0])
    # Under the profile's budget the search is the brute force over the timed plans.
    fits = min((t, m, p) for t, m, p in brute_force(prof, 40) if p[1] != c)
    found = search(prof, 3, 40)
    assert found.assignment == fits[2] and found.assignment[1] != c
    assert all(r.assignment[1] != c for r in found.runners_up)
    assert all(s.assignment[1] != c for s in shortlist(prof, found, 3, 8, 40))
    # A search under a budget some plan holding it fits (or none) would choose without it:
    # refused, with the fix named. A plan holding it needs 60 + 4 + 8 (the least of the other
    # units): under 65 none does, though 60 alone fits.
    for budget in (None, 1000, 72):
        with pytest.raises(UserError, match=r"1 segment combinations were not timed.*mode.memory_budget_gb"):
            search(prof, 3, budget)
    assert search(prof, 3, 71).assignment[1] != c
    # A stopped-early entry's time (a bound, at least the ratio times its unit's best) is its cost.
    plain, prof = synthetic_profiles(), synthetic_profiles()
    prof.table[(2, 0)][(1,)].update({"time_s": 5.0, "stopped_early": True, "stop_ratio": 1.5})
    assert prof.bounded((2, 0), (1,)) and prof.stopped_early_configs == 1 and not plain.bounded((2, 0), (1,))
    for plan in ([0, 0, 1], [1, 2, 1]):
        assert predict(prof, plan)[0] == pytest.approx(predict(plain, plan)[0] - 0.5 + 5.0)
    assert search(prof, 3).assignment == min(brute_force(prof))[2]
    assert search(prof, 3).assignment[2] == 0 != search(plain, 3).assignment[2]


# ---------------------------------------------------------------------------------------------
# Real programs (a 2-layer MLP, 6 combinations, on 4 devices)


def mlp_on_4():

    return analyze(*mlp_program(), [4]), make_mesh([4], jax.devices()[:4])


def profile(a, mesh, store, shortcuts, repeats=6):

    lines: list[str] = []
    options = ProfileOptions.exhaustive(repeats=repeats, warmup=1, overlap_compile=False,
                                        memory_budget_gb=(shortcuts.memory_budget_bytes or 0) / 2**30,
                                        early_stop_ratio=shortcuts.early_stop_ratio)
    profiler = Profiler(a, mesh, store, options, log=lines.append)
    # The shortcuts themselves, at the segments' sum (a search's options allow the sum
    # UNITS_OVER_STEP times the budget: budget.py).
    profiler.loop.shortcuts = profiler.shortcuts = shortcuts
    return profiler.run(), lines


def test_over_budget_candidates_are_not_timed_and_a_larger_budget_times_them(tmp_path):

    a, mesh = mlp_on_4()
    store = ProfileStore(tmp_path / "store")
    keys = StoreKeys(a, mesh)
    # Every candidate's compiled memory, then a budget between two of them: the figures the
    # profile pass decides on (one unit: a plan's memory is its own), so which candidates are
    # over it is known beforehand.
    mems = {c: m for (_, c), m in compiled_memories(a, mesh, tmp_path / "compiled")[0].items()}
    levels = sorted(set(mems.values()))
    assert len(levels) >= 3, mems
    budget = (levels[len(levels) // 2] + levels[len(levels) // 2 - 1]) / 2
    over = {c for c, m in mems.items() if m > budget}
    assert 0 < len(over) < len(mems)

    prof, lines = profile(a, mesh, store, Shortcuts(budget, 0.0))
    assert (prof.measured, prof.skipped, prof.stopped) == (len(mems), len(over), 0)
    assert prof.over_budget_configs == len(over)
    (u,) = prof.units
    for c, m in mems.items():
        e = store.get(keys.segment(u, c))
        assert e["mem_bytes"] == m
        if c in over:   # its memory, no time
            assert e["over_budget"] and e["time_s"] is None and "times_s" not in e and e["budget_bytes"] == budget
            assert not prof.timed(u.kind, c)
        else:
            assert not e.get("over_budget") and len(e["times_s"]) == 6 and e["time_s"] > 0
    assert sum("not timed: mem_cost(GB)" in line for line in lines) == len(over)
    assert any(f"{len(over)} not timed (no plan within the memory budget" in line for line in lines)

    # The search under that budget picks a timed plan, and none of its shortlist is untimed.
    found = search(prof, len(a.blocks), budget)
    assert tuple(found.assignment) not in over and math.isfinite(found.predicted_time_s)
    assert all(tuple(s.assignment) not in over for s in shortlist(prof, found, len(a.blocks), 6, budget))
    with pytest.raises(UserError, match="not timed"):
        search(prof, len(a.blocks))

    # The same store under the same budget: nothing to measure. Under a budget they all fit,
    # the skipped ones are timed now and the others reused.
    assert profile(a, mesh, store, Shortcuts(budget, 0.0))[0].measured == 0
    prof, _ = profile(a, mesh, store, Shortcuts(max(levels), 0.0))
    assert (prof.measured, prof.reused, prof.skipped) == (len(over), len(mems) - len(over), 0)
    assert prof.over_budget_configs == 0
    assert all(len(store.get(keys.segment(u, c))["times_s"]) == 6 for c in mems)
    search(prof, len(a.blocks))   # every combination timed: any budget is fine now


def small_gpt(devices: int):

    p = training_program(GPT(**SMALL_GPT))
    return analyze(p.step, p.args, [devices]), make_mesh([devices], jax.devices()[:devices])


def compiled_memories(a, mesh, store_dir) -> tuple[dict, list]:
    """{(kind, combination): compiled memory} of every candidate, and the profiled units."""

    units = profiling_units(a, 128)
    loop = CandidateLoop(a, mesh, ProfileStore(store_dir), StoreKeys(a, mesh), Timer(), units,
                         ProfileOptions.exhaustive(overlap_compile=False))
    out = {}
    for u, c in loop.candidates():
        compiled, _, _, boundary, _ = loop.prepare(u, c)
        out[(u.kind, c)] = memory_of(compiled, boundary)[1]
    return out, units


def test_what_no_plan_within_the_budget_can_hold_is_not_timed(tmp_path):
    """Several units (SMALL_GPT: embedding, 2 layers, head): a candidate is skipped when a plan
    holding it needs more than the budget, counting the other units' least memory where known;
    nothing skipped could have been in a plan within the budget."""
    a, mesh = small_gpt(4)
    mems, units = compiled_memories(a, mesh, tmp_path / "compiled")
    least = {kind: min(m for (k, _), m in mems.items() if k == kind) for kind, _ in mems}
    total = sum(least[u.kind] for u in units)
    # The least memory any plan holding each candidate needs, all units known.
    floor = {(k, c): m - least[k] + total for (k, c), m in mems.items()}
    # A budget some plan holding a candidate of the last kind profiled (the head; by then every
    # other kind's memory is known, so its floor is the whole one) is over, and no candidate's
    # own memory is.
    last = units[-1].kind
    budget = (total + max(f for (k, _), f in floor.items() if k == last)) / 2
    assert max(mems.values()) <= budget < max(floor.values()), (mems, total)

    prof, lines = profile(a, mesh, ProfileStore(tmp_path / "store"), Shortcuts(budget, 0.0), repeats=3)
    skipped = {(k, c) for k, combos in prof.table.items() for c in combos if not prof.timed(k, c)}
    assert skipped and prof.skipped == len(skipped) == prof.over_budget_configs
    assert all(floor[x] > budget for x in skipped)   # nothing a plan within the budget holds
    for (k, c) in skipped:
        e = prof.table[k][c]
        assert e["time_s"] is None and budget < e["plan_floor_bytes"] <= floor[(k, c)]
    found = search(prof, len(a.blocks), budget)   # not refused: every plan within it was timed
    assert found.predicted_memory_bytes <= budget and math.isfinite(found.predicted_time_s)
    with pytest.raises(UserError, match="not timed"):
        search(prof, len(a.blocks), max(floor.values()))


def test_a_budget_no_plan_meets_is_refused_as_soon_as_that_is_known(tmp_path):
    """Under every device's share of the parameters, optimizer state and batch, before anything
    is compiled; under the least memory of the unit kinds known so far (those with the fewest
    combinations first), as soon as they are known: what was measured stays in the store, and
    the search says why (issue 28)."""

    a, mesh = small_gpt(4)
    mems, units = compiled_memories(a, mesh, tmp_path / "compiled")
    floor = state_floor_bytes(a)
    store = ProfileStore(tmp_path / "store")
    with pytest.raises(UserError, match=r"no plan fits mode.memory_budget_gb=.*: every plan needs at least .* GB per "
                                        r"device \(its parameters, optimizer state and batch alone, split over all 4 "
                                        r"devices\); give mode.memory_budget_gb=\S+ or more"):
        profile(a, mesh, store, Shortcuts(floor - 1, 0.0))
    assert len(store) == 0

    first = {}
    for u in units:
        first.setdefault(u.kind, u)
    kind = min(first, key=lambda k: len(first[k].combos()))       # profiled first: one combination
    needs = sum(u.kind == kind for u in units) * min(m for (k, _), m in mems.items() if k == kind)
    budget = (floor + needs) / 2
    assert floor < budget < needs
    prof, lines = profile(a, mesh, store, Shortcuts(budget, 0.0), repeats=3)
    assert prof.infeasible and prof.least_plan_bytes == needs and prof.measured == len(first[kind].combos())
    assert f"give mode.memory_budget_gb={gb_at_least(needs)} or more" in prof.infeasible
    assert float(gb_at_least(needs)) * 2**30 >= needs
    assert len(store) == prof.measured and any(line.startswith("profile: stopped after") for line in lines)
    with pytest.raises(UserError) as refused:
        search(prof, len(a.blocks), budget)
    assert str(refused.value) == prof.infeasible
    # The same store says so again before compiling anything.
    again, lines = profile(a, mesh, store, Shortcuts(budget, 0.0), repeats=3)
    assert again.measured == 0 and again.infeasible == prof.infeasible
    assert any(line.startswith("profile: nothing measured: no plan on mesh [4] fits") for line in lines)


def test_a_budget_under_the_parameters_share_is_refused_within_seconds(tmp_path):

    t0 = time.monotonic()
    proc = run_cli("mode=search", "model=gpt-tiny", "mode.memory_budget_gb=0.0000001",
                   f"mode.store_dir={tmp_path / 'store'}", run_dir=tmp_path / "run", check=False, timeout=300)
    seconds = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    m = re.fullmatch(r"error: rank \d on \S+: no plan fits mode.memory_budget_gb=1e-07: every plan needs at least "
                     r"([\d.e-]+) GB per device \(its parameters, optimizer state and batch alone, split over all 8 "
                     r"devices\); give mode.memory_budget_gb=([\d.e-]+) or more \(0: no limit\)", last)
    assert m, last
    assert float(m.group(2)) >= float(m.group(1)) > 1e-7
    # Refused after the analysis, before any profiling: start-up, tracing and no more (it took
    # over 5 minutes of compiling before, issue 28).
    assert seconds < 60, seconds


def test_a_much_slower_candidate_stops_early_and_a_run_without_early_stop_times_it(tmp_path):

    a, mesh = mlp_on_4()
    store = ProfileStore(tmp_path)
    keys = StoreKeys(a, mesh)
    (u,) = profiling_units(a, 128)
    combos = u.combos()
    # A best recorded in the store for the first combination: 0.1 microseconds, which every real
    # run of every other combination is far over (one dispatch alone takes longer), so each is
    # the much slower candidate, whatever this machine's load.
    first = combos[0]
    store.put(keys.segment(u, first), {"time_s": 1e-7, "times_s": [1e-7] * 6, "overhead_s": 0.0,
                                       "overhead_times_s": [0.0] * 6, "mem_bytes": 1, "blocks": [u.start, u.end]})
    prof, lines = profile(a, mesh, store, Shortcuts(None, 1.5))
    rest = combos[1:]
    assert (prof.measured, prof.reused, prof.stopped, prof.skipped) == (len(rest), 1, len(rest), 0)
    for c in rest:
        e = store.get(keys.segment(u, c))
        # timed for the two runs the decision takes, beside its overhead program, then no more
        assert e["stopped_early"] and e["stop_ratio"] == 1.5 and e["best_s"] == 1e-7
        assert len(e["times_s"]) == len(e["overhead_times_s"]) == 2 and e["time_s"] > 1.5 * 1e-7
        assert prof.bounded(u.kind, c) and e["mem_bytes"] > 0
    assert sum("(stopped early: first 2 runs over 1.5x the best 0.000000)" in line for line in lines) == len(rest)

    # Shortcuts as eager reuse the bounds; a larger ratio measures them again (and stops them
    # again here, with its own ratio); a run without early stop times every one in full.
    assert profile(a, mesh, store, Shortcuts(None, 1.5))[0].measured == 0
    assert profile(a, mesh, store, Shortcuts(None, 1.2))[0].measured == 0
    prof, _ = profile(a, mesh, store, Shortcuts(None, 3.0))
    assert (prof.measured, prof.stopped) == (len(rest), len(rest))
    assert {store.get(keys.segment(u, c))["stop_ratio"] for c in rest} == {3.0}
    prof, _ = profile(a, mesh, store, Shortcuts())
    assert (prof.measured, prof.reused, prof.stopped) == (len(rest), 1, 0)
    assert prof.stopped_early_configs == 0
    for c in rest:
        e = store.get(keys.segment(u, c))
        assert not e.get("stopped_early") and len(e["times_s"]) == 6


def test_timer_stops_after_the_first_runs_only_when_told():

    a, mesh = mlp_on_4()
    x = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, PartitionSpec("cfp0")))
    f = jax.jit(lambda y: y @ y.T).lower(x).compile()
    g = jax.jit(lambda y: y + 1.0).lower(x).compile()
    timer = Timer(warmup=1, repeats=5)

    def timed(rule, timer=timer):   # f beside g, stopped by ``rule`` after its first runs
        (out,) = timer.rounds([(f, g, [x])], stop=lambda t, o: [rule.slower(t[0], o[0])], after=rule.after)
        return [len(t) for t in out]

    # a recorded best far under any real run: stop after 2 (or 3, where told); far over: all 5
    assert timed(EarlyStop(1.5, 1e-9)) == [2, 2]
    assert timed(EarlyStop(1.5, 1e-9, after=3)) == [3, 3]
    assert timed(EarlyStop(1.5, 1e9)) == [5, 5]
    assert [len(t) for t in timer.beside_overhead(f, g, [x])] == [5, 5]
    # no decision when the first runs are all the runs
    assert timed(EarlyStop(1.5, 1e-9), Timer(1, 2)) == [2, 2]


def test_timer_rounds_run_each_program_once_a_round_and_stop_only_those_told():

    calls: list[str] = []

    def program(name):
        def run(x):
            calls.append(name)
            return x + 1
        return run

    x = jnp.ones(4)
    entries = [(program("a"), program("a0"), [x]), (program("b"), program("b0"), [x]), (program("c"), program("c0"), [x])]
    seen = []

    def stop(times, overheads):
        seen.append(([len(t) for t in times], [len(o) for o in overheads]))
        return [False, True, False]

    out = Timer(warmup=1, repeats=4).rounds(entries, stop=stop, after=2)
    # One warm-up round, then rounds of each program beside its overhead program; b ends after 2.
    assert calls == ["a", "a0", "b", "b0", "c", "c0"] * 3 + ["a", "a0", "c", "c0"] * 2
    assert seen == [([2, 2, 2], [2, 2, 2])]
    assert [(len(t), len(o)) for t, o in out] == [(4, 4), (2, 2), (4, 4)]
    # No decision when the first runs are all the runs.
    calls.clear()
    assert [len(t) for t, _ in Timer(warmup=0, repeats=2).rounds(entries, stop=stop, after=2)] == [2, 2, 2]
    assert len(seen) == 1 and calls == ["a", "a0", "b", "b0", "c", "c0"] * 2


def test_batches_hold_whole_kinds_and_a_large_kind_in_parts():

    def kind(k, n):
        u = SimpleNamespace(kind=(k, 0))
        return [(u, (i,)) for i in range(n)]

    todo = kind(0, 2) + kind(1, 3) + kind(2, 6) + kind(3, 9) + kind(4, 20)
    batches = batched(todo, 8, most=10)
    assert [sorted(Counter(u.kind[0] for u, _ in b).items()) for b in batches] == \
        [[(0, 2), (1, 3)], [(2, 6)], [(3, 9)], [(4, 10)], [(4, 10)]]
    assert [c for b in batches for c in b] == todo


def test_a_kept_plan_is_profiled_in_every_instance_of_a_layer_not_only_the_first(tmp_path):
    """``profile_top_k`` keeps the combinations of the plans nearest the baselines: those of every
    unit of a kind, since one plan may give a layer's instances different ones (miniGPT's nearest
    fsdp plan took another in its first block than in the other three, and, its other blocks left
    unprofiled, was predicted infinitely slow and never raced)."""
    p = training_program(GPT(**SMALL_GPT))
    a = analyze(p.step, p.args, [4, 2])
    mesh = make_mesh([4, 2], jax.devices()[:8])
    units = profiling_units(a, 128)
    first, again = [u for u in units if u.kind == (1, 0)][:2]
    plan = [0] * len(a.blocks)
    plan[again.start:again.end] = [6, 5]   # the second instance only; the first keeps [0, 0]
    options = ProfileOptions(profile_top_k=1, overlap_compile=False)
    loop = CandidateLoop(a, mesh, ProfileStore(tmp_path), StoreKeys(a, mesh), Timer(), units, options, keep=[plan])
    profiled = {(u.kind, c) for u, c in loop.candidates()}
    assert ((1, 0), (6, 5)) in profiled and ((1, 0), (0, 0)) in profiled
    assert all(u is loop.first[u.kind] for u, _ in loop.candidates())


def test_a_segments_combinations_are_timed_in_rounds_against_the_fastest_of_them(tmp_path):
    """In rounds, the early stop's yardstick is the candidate whose slowest first run is the
    fastest: with a ratio every real run is over (1e-6), it alone is timed in full and every
    other stops against it. One after another (``interleave=False``, CFP's artifact), the first
    is timed in full and the rest stop against it."""
    a, mesh = mlp_on_4()
    (u,) = profiling_units(a, 128)
    combos = u.combos()
    for interleave in (True, False):
        store = ProfileStore(tmp_path / f"store{interleave}")
        keys = StoreKeys(a, mesh)
        options = ProfileOptions.exhaustive(repeats=4, warmup=1, overlap_compile=False, early_stop_ratio=1e-6,
                                            interleave=interleave)
        prof = Profiler(a, mesh, store, options, log=lambda line: None).run()
        entries = {c: store.get(keys.segment(u, c)) for c in combos}
        full = [c for c, e in entries.items() if not e.get("stopped_early")]
        assert len(full) == 1 and prof.stopped == len(combos) - 1, entries
        (best,) = full
        if interleave:   # the fastest of the first 2 rounds, by its slower run
            yardstick = max(entries[best]["times_s"][:2])
            assert yardstick == min(max(e["times_s"][:2]) for e in entries.values())
        else:            # the first in order, timed in full
            assert best == CandidateLoop(a, mesh, store, keys, Timer(), [u], options).candidates()[0][1]
            yardstick = entries[best]["time_s"]
        assert len(entries[best]["times_s"]) == 4
        for c, e in entries.items():
            if c != best:
                assert len(e["times_s"]) == 2 and e["best_s"] == yardstick and e["stop_ratio"] == 1e-6


# ---------------------------------------------------------------------------------------------
# Two processes through the CLI: the same decisions on both


def small_gpt_floors(store_dir) -> dict:
    """For every candidate of SMALL_GPT on a 1-D mesh of 8 (what mode=profile profiles on 2
    processes x 4 devices), in the order the profile meets them: the least memory a plan holding
    it needs as far as known then (its compiled memory, plus the least of every unit kind whose
    memories are all known: ``CandidateLoop.plan_floor``), which the budget is checked against."""
    a, mesh = small_gpt(8)
    loop = CandidateLoop(a, mesh, ProfileStore(store_dir), StoreKeys(a, mesh), Timer(), profiling_units(a, 128),
                         ProfileOptions.exhaustive(overlap_compile=False))
    out = {}
    for u, c in loop.candidates():
        compiled, _, _, boundary, _ = loop.prepare(u, c)
        loop.memory[u.kind][c] = memory_of(compiled, boundary)[1]
        out[(u.kind, c)] = loop.plan_floor(u.kind, loop.memory[u.kind][c])
    return out


DECISION = re.compile(r"(SegmentIdx: .*?ParallelBlock Strategy: \[[\d, ]*\]) (not timed|avgcost: [\d.]+( \(stopped early)?)")


@pytest.mark.slow
def test_two_processes_take_the_same_decisions(tmp_path):
    floors = small_gpt_floors(tmp_path / "compiled")
    levels = sorted(set(floors.values()))
    assert len(levels) >= 2, floors
    # Only the candidates whose plans need the most over the budget; a tiny ratio stops every
    # candidate of a segment after its first one timed in full (each real run is over 1e-6 x any
    # other): decisions known beforehand, whatever the timings.
    budget_gb = (levels[-1] + levels[-2]) / 2 / 2**30
    model = ["model=gpt-tiny", *[f"model.{k}={v}" for k, v in SMALL_GPT.items()]]
    run_cli("mode=profile", *model, "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=4", "mode.repeats=4",
            # (a search's options allow the segments' sum UNITS_OVER_STEP times the budget: budget.py)
            f"mode.memory_budget_gb={budget_gb / UNITS_OVER_STEP!r}", "mode.early_stop_ratio=1e-6",
            f"mode.store_dir={tmp_path / 'store'}", run_dir=tmp_path / "run", timeout=900)
    result = read_result(tmp_path / "run")
    over = sum(f > budget_gb * 2**30 for f in floors.values())
    assert result["global_devices"] == 8 and result["profiled_configs"] == len(floors) == result["measured_configs"]
    assert result["over_budget_configs"] == over >= 1
    assert result["stopped_early_configs"] >= 1
    logs = [(tmp_path / "run" / "logs" / f"rank{r}.log").read_text() for r in (0, 1)]
    decisions = [[m.group(0) for m in DECISION.finditer(log)] for log in logs]
    assert len(decisions[0]) == len(floors)
    # Times are the slowest process's and memory the same program's: the lines agree verbatim.
    assert decisions[0] == decisions[1]
    assert sum("not timed" in d for d in decisions[0]) == result["over_budget_configs"]
    assert sum("stopped early" in d for d in decisions[0]) == result["stopped_early_configs"]
    profiles = json.loads((tmp_path / "run" / "profiles.json").read_text())["profiles"]
    assert sum(p["time_s"] is None for p in profiles) == result["over_budget_configs"]
