"""CFP ("Profiling-based Intra-operator Parallelism Generation by Preserving Communication-Free
Structures") as an algorithm, its three passes as the paper has them:

1. **analysis**: the step's ParallelBlocks and their plans, and its unique segments, on each
   logical mesh (the orchestration's, ``pipeline.analyze_meshes``, the same for every algorithm);
2. **profile**: every plan combination of each unique segment timed once, into the profile store
   (``Cfp.plan``: ``profile.py``, ``profile_meshes``; the profiler in ``launcher/sharding/profile/``);
3. **search**: the DP's optimum per mesh under the memory budget (``search/dp.py``), then a
   shortlist (the optimum, its runners-up, the plans nearest the baselines) measured on the whole
   step, the fastest kept (``Cfp.search``, ``choose``).

The race of the plan kept beside the baselines, and the answer, are the orchestration's
(``pipeline.race_plans``). CFP's options are the profile's (``ProfileOptions``) and its
shortlist's (``CfpOptions``, here: ``mode.verify_*``, autoshard's ``verify_*=``).

This module imports no JAX at its top (the command line reads the registry); each pass imports
what it runs.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from launcher.errors import NoPlanFits, UserError
from launcher.sharding.algorithms.base import (Algorithm, Duel, Hooks, Log, OnMesh, Planned, Progress,
                                               builtin_baselines)
from launcher.sharding.options import Options, SearchOptions
from launcher.sharding.search.meshes import crossings, for_each_mesh, merge_shortlists

if TYPE_CHECKING:  # they import JAX
    from launcher.sharding.search.dp import Candidate, SearchResult
    from launcher.sharding.search.measure import Runner, StepRunner


@dataclass(frozen=True)
class CfpOptions(Options):
    """CFP's shortlist: the plans measured on the whole step before one is kept (``choose``).
    The profile it searches is ``SearchOptions.profile``; the margin a plan must win by, the
    race's ``SearchOptions.verify_margin``."""

    # Measure the search's best few plans (its optimum, runners-up, uniform plans) on the whole
    # step and keep the fastest: 1 takes the search's optimum unmeasured (unless verify_nearest).
    verify_top_k: int = 4
    # Measure, besides, the plan nearest each of the baselines (search/nearest.py). A plan
    # replaces the fastest of them only when faster by mode.verify_margin, round by round: short
    # rounds cannot tell plans apart within their noise, and there the baseline-like plan is the
    # safe one.
    verify_nearest: bool = True
    # A shortlisted plan the profile predicts over this many times the fastest prediction is not
    # measured (its row says so), except the fastest-predicted plan nearest a baseline, which the
    # others must beat. Each one measured costs a whole-step compile and its rounds, most of a
    # cold search's shortlist; the profile's predictions rank such plans as the race does (the
    # scanned LM's nearest-fsdp plan: predicted 3.3x the optimum, measured 3.2x). 0: measure all.
    verify_slower_than: float = 2.0
    verify_iterations: int = 10  # steps per round when measuring them
    # Interleaved rounds; the best few plans are often within a round's noise of each other
    # (bench/bench_cfp_search.py's A/A figure), and a round of them costs far less than compiling them.
    verify_repeats: int = 6

    def __post_init__(self) -> None:
        if self.verify_slower_than != 0 and not self.verify_slower_than > 1:
            raise UserError(f"mode.verify_slower_than={self.verify_slower_than}: must be a factor above 1 (a "
                            "shortlisted plan predicted that much slower than the fastest is not measured), e.g. "
                            "2, or 0 to measure every one")

    @classmethod
    def defaults(cls) -> dict[str, object]:
        """Each option by name with its default: ``Cfp.option_defaults``."""
        return {f.name: f.default for f in fields(cls)}


@dataclass
class CfpSearched:
    """CFP's own figures of its plan (``Cfp.search``; ``Planned.details``)."""
    found: SearchResult            # the DP's optimum on the picked plan's mesh
    picked: Candidate              # the plan kept after measuring the shortlist
    candidates: list[dict]         # a row per shortlisted plan
    nearest: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)  # name -> (mesh shape, plan per block)


class Cfp(Algorithm):
    name = "cfp"
    title = "CFP's plan"
    heading = "CFP plan"
    description = "CFP's profiling search"
    color = "tab:red"
    is_default = True
    option_defaults = CfpOptions.defaults()   # mode.verify_top_k, ...: the shortlist's (CfpOptions)

    def __init__(self, options: SearchOptions, settings: Mapping[str, object] = {}) -> None:  # noqa: B006 - read only
        super().__init__(options, settings)
        self.cfp = CfpOptions(**{name: self.setting(name) for name in self.option_defaults})

    def plan(self, on: Sequence[OnMesh], hooks: Hooks) -> Planned:
        """Passes 2 and 3 over the meshes analysed (``on``): profiled, then searched."""
        from launcher.sharding.algorithms.cfp import profile  # noqa: PLC0415 - JAX: the command line imports the registry

        options = self.options
        on, gated = self.gate(on, hooks)
        on = profile.profile_meshes(on, options.profile, is_main=hooks.is_main, log=hooks.log,
                                    progress=hooks.progress, baselines=options.baselines)
        hooks.write({o.folder + "profiles.json": profile.profiles_json(o.profiles, o.analyzed.analysis) for o in on})
        return self.search(on, hooks, gated)

    def gate(self, on: Sequence[OnMesh], hooks: Hooks) -> tuple[list[OnMesh], list[dict]]:
        """The meshes worth profiling (``ilp/gate.py``, ``mode.mesh_gate``), and a ``meshes``
        row for each: a left-out one's saying why, a kept one's with the gate's prediction
        (completed by ``search``)."""
        from pathlib import Path  # noqa: PLC0415

        import jax  # noqa: PLC0415 - JAX, likewise

        from launcher.sharding.ilp.gate import gate  # noqa: PLC0415 - JAX, likewise
        from launcher.sharding.measuring.store import ProfileStore  # noqa: PLC0415 - JAX, likewise

        o, p = self.options, self.options.profile
        if not o.mesh_gate or len(on) < 2:
            return list(on), []
        verdict = gate([(m.analyzed.analysis, m.mesh) for m in on], o.mesh_gate,
                       ProfileStore(Path(p.store_dir).expanduser().resolve()), processes=jax.process_count(),
                       repeats=p.repeats, memory_budget_bytes=p.memory_budget_bytes, is_main=hooks.is_main,
                       log=hooks.log, progress=hooks.progress)
        return ([m for m, k in zip(on, verdict.keep, strict=True) if k],
                verdict.rows([m.shape for m in on], o.mesh_gate))

    def search(self, on: Sequence[OnMesh], hooks: Hooks, gated: Sequence[dict] = ()) -> Planned:
        """CFP's search pass over profiled meshes of the same devices (``on``): the DP's optimum on
        each under the profile's memory budget, and the fastest of their shortlists measured on
        the whole step (``choose``): the plan, with what the DP predicted. ``gated``: the gate's
        row of every mesh given (``gate``; empty: no gate), merged into ``meshes`` in its order."""
        import jax  # noqa: PLC0415 - JAX, likewise

        from launcher.sharding.apply import AXIS_NAMES  # noqa: PLC0415 - JAX, likewise
        from launcher.sharding.profile.budget import UNITS_OVER_STEP  # noqa: PLC0415 - JAX, likewise
        from launcher.sharding.search.dp import search as dp_search  # noqa: PLC0415 - JAX, likewise

        options, log = self.options, hooks.log
        budget = options.profile.memory_budget_bytes
        # Under a budget the segments' sum is a first filter (budget.UNITS_OVER_STEP times it); what
        # fits is decided by the whole step's memory (``choose``, ``search/fit.py``).
        founds, reasons = for_each_mesh(
            [o.shape for o in on], lambda i: dp_search(on[i].profiles, len(on[i].analyzed.analysis.blocks), budget,
                                                       UNITS_OVER_STEP),
            refuse=UserError, none_fit=lambda why: NoPlanFits("no plan fits on any mesh searched: " + why), log=log)
        meshes: list[dict] = []
        for o, found, why in zip(on, founds, reasons, strict=True):
            if found is None:
                meshes.append({"mesh_shape": o.shape, "skipped": why})
                continue
            meshes.append({"mesh_shape": o.shape, "search_optimum": found.assignment,
                           "search_time_s": found.search_time_s, "predicted_step_time_s": found.predicted_time_s,
                           "predicted_memory_gb": found.predicted_memory_bytes / 2**30,
                           "profiled_configs": o.profiles.profiled_configs, "profile_time_s": o.profiles.seconds})
            log("search optimum on mesh %s (segment profiles): %s, segment combinations %s, predicted %.6f s, %.6f "
                "GB per device (search %.3f s)" % (o.shape, found.assignment, [list(c) for c in found.combos],
                                                    found.predicted_time_s, found.predicted_memory_bytes / 2**30,
                                                    found.search_time_s))
        if gated:   # every mesh given, in its order: the gate's prediction beside what was found
            found_rows = {tuple(m["mesh_shape"]): m for m in meshes}
            meshes = [{**g, **found_rows.get(tuple(g["mesh_shape"]), {})} for g in gated]
        chosen, candidates, nearest = choose(on, founds, options, self.cfp, name=self.row, log=log,
                                             progress=hooks.progress)
        picked, where, found = chosen.candidate, on[chosen.mesh_index], founds[chosen.mesh_index]
        log("searched ParallelBlock Strategies solution: %s on mesh %s (%s)" % (picked.assignment, where.shape,
                                                                              picked.source))
        # Its memory: the whole step's as XLA allocates it under the plan (compiled, not yet run),
        # not the segments' sum, which over-counts it.
        step_memory = chosen.peak_memory_bytes
        log("predicted step time %.6f s, memory %.6f GB per device (the whole step compiled; its segments add up "
            "to %.6f GB)" % (picked.predicted_time_s, step_memory / 2**30, picked.predicted_memory_bytes / 2**30))
        analysis, profiles = where.analyzed.analysis, [o.profiles for o in on]
        fields = {
            "meshes": meshes,
            "plan": {"assignment": picked.assignment, "mesh_shape": list(analysis.mesh_shape), "source": picked.source,
                     "state_stored_split": bool(picked.stored)},
            "search_optimum": {"assignment": found.assignment,
                               "segment_combinations": [list(c) for c in found.combos]},
            "candidates": candidates,
            "predicted_step_time_s": picked.predicted_time_s,
            "predicted_memory_gb": step_memory / 2**30,
            "segments_memory_gb": picked.predicted_memory_bytes / 2**30,
            "profiled_configs": sum(p.profiled_configs for p in profiles),
            "measured_configs": sum(p.measured for p in profiles),
            "reused_configs": sum(p.reused for p in profiles),
            "same_program_configs": sum(p.same_program for p in profiles),
            "search_time_s": sum(m.get("search_time_s", 0.0) for m in meshes),
            "profile_time_s": sum(p.seconds for p in profiles),
        }
        # Over several processes, the axis between them, named (``plans.arranged``).
        across = AXIS_NAMES[picked.across or 0] if jax.process_count() > 1 else None
        if across is not None:
            log("the axis across processes: %s of mesh %s" % (across, where.shape))
        fields["plan"]["across_processes"] = across
        return Planned(self.name, self.row, where, where.plan_of(picked.assignment, self.row, picked.stored, across),
                       chosen, picked.source, picked.predicted_time_s, step_memory, meshes, fields,
                       details=CfpSearched(found, picked, candidates, nearest), assignment=list(picked.assignment),
                       state_stored_split=bool(picked.stored), kept_because=KEPT_BECAUSE, duel=duel_of(candidates))


# Why CFP kept its plan over the plan nearest a baseline, where that plan is the baseline's own
# layout and the race measured CFP's behind it (sharding/behind.py).
KEPT_BECAUSE = ("the segment profiles predicted the kept plan faster, and the shortlist's short rounds did not tell "
                "them apart (more verify_repeats race them longer)")


def duel_of(rows: Sequence[dict]) -> Optional[Duel]:
    """Where the shortlist kept its plan after racing it alone against the fastest plan nearest a
    baseline (``shortlist.pick``'s duel; ``choose``'s rows): the kept plan's time over that plan's,
    round by round, the rounds, and that plan's source ("nearest dp_tp"); else None."""
    kept = next((r for r in rows if r.get("chosen")), None)
    against = next((r for r in rows if r.get("incumbent") and r.get("duel_over_incumbent_paired") is not None), None)
    if kept is None or against is None or kept.get("duel_over_incumbent_paired") is None or kept is against:
        return None
    return Duel(kept["duel_over_incumbent_paired"], kept["duel_rounds"], against["source"])


def choose(on: Sequence[OnMesh], founds: Sequence[Optional[SearchResult]], options: SearchOptions = SearchOptions(),
           cfp: CfpOptions = CfpOptions(), *, name: str = Cfp.name, log: Log = lambda line: None,
           progress: Optional[Progress] = None
           ) -> tuple[Runner | StepRunner, list[dict], dict[str, tuple[list[int], list[int]]]]:
    """The plan to run: the fastest of the shortlist measured on the whole step
    (``cfp.shortlist.pick``), compiled to race as ``name``. The shortlist: each mesh's DP optimum
    (``founds``, None where nothing fit), the plans nearest the baselines (``verify_nearest``;
    each on the mesh shaped like it, ``search/meshes.py``) and the rest of the meshes' shortlists
    up to ``verify_top_k``, within the profile's memory budget. The fastest plan nearest a
    baseline is kept unless another is faster by ``verify_margin`` (a fraction) in the
    shortlist's ``verify_repeats`` rounds of ``verify_iterations`` steps and then alone against
    it (``cfp.shortlist.pick``). Returns the chosen runner (its ``mesh_index`` set), a row per
    candidate, and the nearest plans ({name: (mesh shape, plan per block)})."""
    import jax  # noqa: PLC0415 - JAX: the command line imports the registry

    from launcher.sharding.apply import make_mesh  # noqa: PLC0415
    from launcher.sharding.search.dp import Candidate, predict, shortlist  # noqa: PLC0415
    from launcher.sharding.search.fit import compiled_key, state_inputs, within_budget  # noqa: PLC0415
    from launcher.sharding.algorithms.cfp.shortlist import pick  # noqa: PLC0415
    from launcher.sharding.search.nearest import nearest_on_meshes  # noqa: PLC0415

    progress = progress or (lambda total, what: contextlib.nullcontext())
    verify_top_k, verify_nearest = cfp.verify_top_k, cfp.verify_nearest
    baselines = builtin_baselines(options.baselines)
    iterations, repeats, margin = cfp.verify_iterations, cfp.verify_repeats, options.verify_margin
    budget, seed = options.profile.memory_budget_bytes, options.seed
    live = [i for i, f in enumerate(founds) if f is not None]
    program = on[0].analyzed.program
    devices = list(on[0].mesh.devices.flat)
    found = nearest_on_meshes([on[i].analyzed.analysis for i in live], program, baselines, devices, log) \
        if verify_nearest else {}
    nearest = {n: (live[near.mesh], near.assignment) for n, near in found.items()}
    # A plan lays each input out as its first consumer computes with it, so the plan nearest a
    # baseline that stores the state split (fsdp) computes like it but stores it whole, and is
    # not its layout: the same plan with the state stored split is measured beside it, an
    # incumbent too. Where the nearest plan is the baseline's own layout (dp, tp, dp_tp), its
    # twin is measured as a challenger: it must beat that layout by verify_margin to replace it
    # (a twin of dp's layout kept on short rounds' noise then ran 1.07x dp in miniGPT's race).
    split_incumbents = {n for n, near in found.items() if not near.exact}
    for n in baselines if verify_nearest else ():
        if n in nearest:
            log("plan nearest %s: %s on mesh %s" % (n, nearest[n][1], on[nearest[n][0]].shape))
        else:
            log("plan nearest %s: none (it does not fit the model or the meshes searched)" % n)
    compiled: dict = {}
    if budget:   # what fits, as the whole step allocates it (search/fit.py)
        fronts = [[Candidate(founds[i].assignment, founds[i].predicted_time_s, founds[i].predicted_memory_bytes,
                             "search optimum")]
                  + [Candidate(r.assignment, r.predicted_time_s, r.predicted_memory_bytes, "runner-up")
                     for r in founds[i].runners_up] for i in live]
        near = {n: (i, Candidate(list(plan), *predict(on[i].profiles, list(plan)), f"nearest {n}"))
                for n, (i, plan) in nearest.items()}
        fitted = within_budget(on, live, fronts, near, budget, max(verify_top_k, 1), seed=seed, log=log,
                               split_incumbents=split_incumbents)
        short, incumbents, compiled = fitted.short, fitted.incumbents, fitted.runners
    else:
        shorts = []
        for i in live:
            mine = {n: plan for n, (j, plan) in nearest.items() if j == i}
            shorts.append(shortlist(on[i].profiles, founds[i], len(on[i].analyzed.analysis.blocks),
                                    max(verify_top_k, 1), budget, mine))
        short = [(live[j], c) for j, c in merge_shortlists(shorts, max(verify_top_k, 1))]
        near_plans = {(i, tuple(plan)) for i, plan in nearest.values()}
        incumbents = [k for k, (i, c) in enumerate(short) if (i, tuple(c.assignment)) in near_plans]
        stored = state_inputs(program)   # each nearest plan's twin, the state stored split (above)
        for n, (i, plan) in nearest.items() if stored else ():
            c = Candidate(list(plan), *predict(on[i].profiles, list(plan)), f"nearest {n}, state stored split",
                          stored=stored)
            if all(compiled_key(i, c) != compiled_key(j, d) for j, d in short):
                if n in split_incumbents:
                    incumbents.append(len(short))
                short.append((i, c))
    short += across_processes(on, short, jax.process_count(), log)
    keep, unmeasured = within_reach(short, incumbents, cfp.verify_slower_than)
    measured = [short[k] for k in keep]
    among = {k: j for j, k in enumerate(keep)}   # a kept plan's place among those measured
    bar = progress(repeats * iterations * len(measured), f"measuring {len(measured)} plans") \
        if len(measured) > 1 else contextlib.nullcontext()
    meshes = {(i, c.across): on[i].mesh if c.across is None else make_mesh(on[i].shape, across=c.across)
              for i, c in measured}
    with bar as bar_value:
        chosen, kept_rows = pick([(on[i].analyzed.analysis, on[i].analyzed.program, meshes[i, c.across], c)
                                  for i, c in measured],
                                 iterations=iterations, repeats=repeats, seed=seed,
                                 incumbents=[among[k] for k in incumbents if k in among], margin=margin,
                                 progress=bar_value, drop_slower_than=options.drop_slower_than, name=name,
                                 compiled=[compiled.get(compiled_key(i, c)) for i, c in measured],
                                 round_s=options.round_seconds)
    rows = [kept_rows[among[k]] if k in among else _unmeasured_row(on[i], c, unmeasured[k])
            for k, (i, c) in enumerate(short)]
    for k, row in enumerate(rows):   # as the whole shortlist has them, measured or not
        row["search_optimum"], row["incumbent"] = k == 0, k in incumbents
    chosen.mesh_index = short[rows.index(next(r for r in rows if r["chosen"]))][0]
    _log_shortlist(rows, repeats, iterations, margin, log)
    return chosen, rows, {n: (on[i].shape, plan) for n, (i, plan) in nearest.items()}


def within_reach(short: Sequence[tuple[int, Candidate]], incumbents: Sequence[int], slower_than: float
                 ) -> tuple[list[int], dict[int, str]]:
    """Which of the shortlist to measure: every plan but those the profile predicts over
    ``slower_than`` times the fastest prediction (0: none left out), and always the fastest-
    predicted incumbent (a plan nearest a baseline, which any other must beat). Returns the
    indices kept, in order, and why each other one is not measured."""
    if not slower_than or not short:
        return list(range(len(short))), {}
    fastest = min(c.predicted_time_s for _, c in short)
    safe = min(incumbents, key=lambda k: short[k][1].predicted_time_s, default=None)
    keep, out = [], {}
    for k, (_, c) in enumerate(short):
        ratio = c.predicted_time_s / fastest if fastest > 0 else 1.0
        if ratio <= slower_than or k == safe:
            keep.append(k)
        else:
            out[k] = (f"predicted {ratio:.2f}x the fastest plan's time, over mode.verify_slower_than={slower_than:g} "
                      "(0 measures every one)")
    return keep, out


def _unmeasured_row(o: OnMesh, c: Candidate, why: str) -> dict:
    """A shortlisted plan's row (``pick``'s keys) where it was not measured, and why."""
    return {"assignment": list(c.assignment), "mesh_shape": list(o.analyzed.analysis.mesh_shape), "source": c.source,
            "predicted_step_time_s": c.predicted_time_s, "predicted_memory_gb": c.predicted_memory_bytes / 2**30,
            "measured_step_time_s": None, "paired_ratio": None, "chosen": False, "over_incumbent_paired": None,
            "duel_over_incumbent_paired": None, "rounds": 0, "duel_rounds": 0, "won_clearly": False,
            "not_measured": why}


def across_processes(on: Sequence[OnMesh], short: Sequence[tuple[int, Candidate]], processes: int, log: Log
                     ) -> list[tuple[int, Candidate]]:
    """Each mesh's search optimum again with another of its axes crossing processes (``crossings``:
    a job of several processes; the devices ordered by process, the first axis crosses them by
    default): plans that differ only in which axis goes between hosts, measured against each
    other in the shortlist (a data axis across hosts and tensor parallelism within, or the
    reverse)."""
    from dataclasses import replace  # noqa: PLC0415  only here

    from launcher.sharding.apply import AXIS_NAMES  # noqa: PLC0415 - JAX: the command line imports the registry

    out = []
    for i, c in short:
        for k in crossings(on[i].shape, processes) if c.source == "search optimum" else ():
            if k != 0:
                out.append((i, replace(c, source=f"{c.source}, {AXIS_NAMES[k]} across processes", across=k)))
    if out:
        log("across processes: %d plans the same as a mesh's optimum but for the axis between processes" % len(out))
    return out


def _log_shortlist(rows: Sequence[dict], repeats: int, iterations: int, margin: float, log: Log) -> None:
    """Each shortlisted plan's figures, the duel where one was raced, and why the plan kept is."""
    from launcher.sharding.algorithms.cfp.shortlist import CLEARLY_AHEAD  # noqa: PLC0415 - JAX, as in choose
    for i, row in enumerate(rows):
        if row["measured_step_time_s"] is not None:
            cut = f", cut after {row['rounds']} of {repeats} rounds" if row["rounds"] < repeats else ""
            log("candidate %d (%s, mesh %s): %s predicted %.6f s, measured %.6f s (%.3f of each round's median%s)%s"
                % (i, row["source"], row["mesh_shape"], row["assignment"], row["predicted_step_time_s"],
                   row["measured_step_time_s"], row["paired_ratio"], cut, "  <- chosen" if row["chosen"] else ""))
    skipped = [(i, row) for i, row in enumerate(rows) if row.get("not_measured")]
    if skipped:
        log("not measured: %s" % "; ".join("candidate %d (%s, mesh %s): %s" % (i, row["source"], row["mesh_shape"],
                                                                               row["not_measured"])
                                           for i, row in skipped))
    kept = next(r for r in rows if r["chosen"])
    for row in rows:
        if row["duel_over_incumbent_paired"] is not None and not row["incumbent"]:
            log("%s (%s) raced the fastest plan nearest a baseline alone, %d rounds of up to %d steps: %.3f of its time "
                "round by round; %s (mode.verify_margin=%g)"
                % (row["source"], row["assignment"], row["duel_rounds"], iterations, row["duel_over_incumbent_paired"],
                   "it replaces it" if row["chosen"] else "kept %s" % kept["source"], margin))
        if row["won_clearly"]:
            log("%s (%s) took %.3f of the fastest plan nearest a baseline's time round by round, under %.3f of it in "
                "every one of %d rounds ((1 - mode.verify_margin) / %g): it replaces it, not raced alone again"
                % (row["source"], row["assignment"], row["over_incumbent_paired"], (1 - margin) / CLEARLY_AHEAD,
                   row["rounds"], CLEARLY_AHEAD))
    fastest = min((r for r in rows if r["measured_step_time_s"] is not None), key=lambda r: r["paired_ratio"],
                  default=None)
    if fastest is None or fastest["chosen"] or fastest["duel_over_incumbent_paired"] is not None:
        return
    over = fastest["over_incumbent_paired"]
    if over is None or over > 1 - margin:
        log("kept %s (%s): %s measured %.3f of its time round by round, not the %.3f (mode.verify_margin=%g) "
            "needed to replace a plan nearest a baseline" % (kept["source"], kept["assignment"], fastest["source"],
                                                              over if over is not None else math.nan, 1 - margin,
                                                              margin))
        return
    # Ahead by the margin, and still neither chosen nor raced alone: the short rounds' plan is
    # chosen among those that ran every round, each round's median taken over them alone
    # (``shortlist.pick``), and there another came first (the default job of 2026-12-08: the
    # same plan with another axis across the processes, within the rounds' noise of it), or this
    # one was cut. Said as it was, not as a margin it met.
    duelist = next((r for r in rows if r["duel_over_incumbent_paired"] is not None and not r["incumbent"]), None)
    if fastest["rounds"] < repeats:
        why = f"it ran {fastest['rounds']} of {repeats} rounds, and only a plan that ran every one replaces it"
    elif duelist is not None:
        why = (f"{duelist['source']} ({duelist['assignment']}) came first among the plans that ran every round (each "
               f"round's median taken over them) and raced it alone instead")
    else:
        why = f"among the plans that ran every round (each round's median taken over them) {kept['source']} came first"
    log("kept %s (%s): %s (%s) measured %.3f of its time round by round, but %s"
        % (kept["source"], kept["assignment"], fastest["source"], fastest["assignment"], over, why))
