"""CFP's one entry: the three passes as functions of plain options, each returning a dataclass.

    analyzed = pipeline.analyze(model, mesh_shape=[4, 2])            # -> Analyzed
    mesh = pipeline.make_mesh(analyzed.analysis.mesh_shape)
    profiled = pipeline.profile(analyzed, mesh, store_dir="store")   # -> Profiled
    result = pipeline.search([pipeline.OnMesh(analyzed, mesh, profiled.profiles)])  # -> Searched

``search`` takes one ``OnMesh`` per logical mesh searched (``mode.mesh_shape=auto``: several,
``search/meshes.py``) and keeps the fastest plan over all of them.

``log`` takes one line of text; ``progress(total, what)`` returns a context manager whose value
has ``advance()`` (``None``: no progress bar). The modes (``launcher/modes/``) turn their config
into these options and write files; the benches call the same functions.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional, Sequence

from launcher.cfp.analysis.core import Analysis
from launcher.cfp.ilp import NAME as ILP_BASELINE  # the ILP's plan as a baseline (mode.baselines, reports)
from launcher.cfp.program import TrainingProgram

Log = Callable[[str], None]
Progress = Callable[[int, str], ContextManager]
BASELINES = ("dp", "tp", "fsdp", "dp_tp", "ep")


def _silent(line: str) -> None:
    pass


def _no_progress(total: int, what: str) -> ContextManager:
    return contextlib.nullcontext()


# --- analysis ---------------------------------------------------------------------------------

@dataclass
class Analyzed:
    analysis: Analysis
    program: Optional[TrainingProgram]   # None for an HLO module
    seconds: float


def default_mesh_shape(mesh_shape: Sequence[int] = ()) -> list[int]:
    """``mesh_shape``, or 1-D over every global device when it is empty."""
    import jax

    return list(mesh_shape) or [jax.device_count()]


def make_mesh(mesh_shape: Sequence[int], devices: Optional[Sequence[Any]] = None) -> Any:
    """The logical mesh (axes cfp0, cfp1) over ``devices`` (default: all global devices)."""
    from launcher.cfp.apply import make_mesh as build

    return build(list(mesh_shape), devices)


def analyze(model: Any = None, *, mesh_shape: Sequence[int] = (), hlo_file: str = "", learning_rate: float = 1e-3,
            two_axis_only: bool = False, log: Log = _silent) -> Analyzed:
    """The analysis pass over ``model``'s whole training step (or the HLO text module
    ``hlo_file``) for a logical mesh (``mesh_shape``; empty: 1-D over every global device).
    ``two_axis_only``: on a 2-D mesh, only plans splitting two roles (``search/meshes.py``)."""
    from launcher.cfp.analysis.core import analyze as analyze_step
    from launcher.cfp.analysis.core import analyze_graph
    from launcher.cfp.analysis.hlo_text import read_hlo
    from launcher.cfp.program import training_program

    mesh_shape = default_mesh_shape(mesh_shape)
    t0 = time.perf_counter()
    if hlo_file:
        program = None
        result = analyze_graph(read_hlo(hlo_file), mesh_shape, two_axis_only)
    else:
        from launcher.cfp.search.nearest import builtin_references

        program = training_program(model, learning_rate)
        # The built-in plans' layouts, so that the blocks offer them (analysis/references.py).
        references = builtin_references(program, natural_only=two_axis_only)
        result = analyze_step(program.step, program.args, mesh_shape, two_axis_only, references)
    seconds = time.perf_counter() - t0
    log("analysis on mesh %s: %d contractions, %d ParallelBlocks, %d segments over %d templates; exhaustive space "
        "%d, segment space %d (%.2f s)" % (list(mesh_shape), len(result.contractions), len(result.blocks), len(result.segments),
                                           len(result.templates), result.exhaustive_space, result.segment_space,
                                           seconds))
    for line in result.segments_txt().splitlines():
        if line.startswith(("ParallelBlocks sequence", "template")):
            log(line)
    return Analyzed(result, program, seconds)


# --- profile ----------------------------------------------------------------------------------

@dataclass
class Profiled:
    profiles: Any          # launcher.cfp.profile.Profiles
    store_dir: str

    def to_json(self, analysis: Analysis) -> dict:
        """``profiles.json``: every unit, entry and resharding cost the search works from."""
        p = self.profiles
        return {
            "units": [{"index": u.index, "segment": u.segment, "template": u.kind[0], "part": u.kind[1],
                       "blocks": [u.start, u.end], "plan_counts": u.plan_counts} for u in p.units],
            "profiles": [{"template": k[0], "part": k[1], "combination": list(c), "time_s": e["time_s"],
                          "overhead_s": e.get("overhead_s", 0.0), "mem_bytes": e["mem_bytes"]}
                         for k, combos in p.table.items() for c, e in combos.items()],
            "reshard": [{"shape": list(k[0][0]), "dtype": k[0][1], "src": [list(a) for a in k[1]],
                         "dst": [list(a) for a in k[2]], "time_s": v} for k, v in p.reshard.items()],
            "whole_overhead_s": p.whole_overhead_s,
            "allreduce_latency_s": [{"axes": list(axes), "time_s": t} for axes, t in p.allreduce_latency_s.items()],
            "gradient_allreduces": [[sorted(map(list, c)) for c in u] for u in p.gradient_allreduces or []],
            "exhaustive_space": analysis.exhaustive_space, "segment_space": analysis.segment_space,
        }


def profile(analyzed: Analyzed, mesh: Any, *, store_dir: str, repeats: int = 10, warmup: int = 1,
            cold_caches: bool = False, max_segment_space: int = 128, overlap_compile: Optional[bool] = None,
            memory_budget_gb: float = 0.0, skip_over_budget: bool = True, early_stop_ratio: float = 0.0,
            is_main: bool = True, log: Log = _silent, progress: Optional[Progress] = None) -> Profiled:
    """The profile pass: measures every segment combination the store at ``store_dir`` lacks.
    ``overlap_compile`` None: compile the next candidate while timing this one on accelerators,
    not on CPU devices (where the compiler would share the timed program's cores).
    CFP's shortcuts (``profile/candidates.py``): with ``skip_over_budget``, a combination no plan
    within ``memory_budget_gb`` per device (0: unlimited) can hold is not timed (search under a
    budget no larger); with ``early_stop_ratio`` > 0, one whose first runs are over that many
    times its unit's best is timed no further. Off here by default (every combination timed in
    full, as the benches compare); mode=profile/search turn the early stop on (1.5)."""
    from pathlib import Path

    from launcher.cfp.profile.candidates import Shortcuts
    from launcher.cfp.profile.profiler import Profiler
    from launcher.cfp.profile.store import ProfileStore
    from launcher.cfp.profile.units import split_parts

    a = analyzed.analysis
    store = ProfileStore(Path(store_dir).expanduser().resolve())
    log("profile store: %s (%d entries)" % (store.root, len(store)))
    overlap = overlap_compile if overlap_compile is not None else mesh.devices.flat[0].platform != "cpu"
    log("profile: compiling the next candidate %s" % ("while timing the current one" if overlap else
                                                       "after timing the current one (mode.overlap_compile=true to "
                                                       "overlap)"))
    shortcuts = Shortcuts(memory_budget_gb * 2**30 if skip_over_budget and memory_budget_gb > 0 else None,
                          early_stop_ratio)
    if shortcuts.memory_budget_bytes:
        skip = "combinations no plan within the memory budget (%.6g GB per device) can hold are not timed" \
            % memory_budget_gb
    else:
        skip = "every combination timed (%s)" % ("no budget: mode.memory_budget_gb=0" if skip_over_budget
                                                 else "mode.skip_over_budget=false")
    stop = ("early stop after %d runs over %gx their segment's best" % (shortcuts.early_stop_after, early_stop_ratio)
            if early_stop_ratio > 0 else "no early stop (mode.early_stop_ratio=0)")
    log("profile: %s; %s" % (skip, stop))
    profiler = Profiler(a, mesh, store, repeats=repeats, warmup=warmup, cold=cold_caches,
                        max_space=max_segment_space, overlap=overlap, log=log, is_main=is_main, shortcuts=shortcuts)
    for t in a.templates:
        if t.space > max_segment_space:
            parts = [t.plan_counts[lo:hi] for lo, hi in split_parts(t.plan_counts, max_segment_space)]
            log("template %d: %d combinations exceed mode.max_segment_space=%d; profiled in parts %s"
                % (t.id, t.space, max_segment_space, parts))
    return Profiled(profiler.run(progress or _no_progress), str(store.root))


def communication_study(analyzed: Analyzed, mesh: Any, *, iterations: int, repeats: int, seed: int = 0,
                        log: Log = _silent) -> list[dict]:
    """Every uniform plan of the whole step: collective volume, communication and step time."""
    from launcher.cfp.search.measure import communication_study as study

    return study(analyzed.analysis, analyzed.program, mesh, iterations=iterations, repeats=repeats, seed=seed, log=log)


# --- search ---------------------------------------------------------------------------------

@dataclass
class OnMesh:
    """What the search pass works from on one logical mesh: its analysis, the mesh, its profiles."""
    analyzed: Analyzed
    mesh: Any
    profiles: Any

    @property
    def shape(self) -> list[int]:
        return list(self.analyzed.analysis.mesh_shape)


@dataclass
class Searched:
    found: Any                     # search.dp.SearchResult: the DP's optimum on the picked plan's mesh
    picked: Any                    # search.dp.Candidate: the plan kept after measuring the shortlist
    candidates: list[dict]         # a row per shortlisted plan
    searched: Any                  # search.measure.PlanRun of the picked plan
    baselines: dict[str, Any]      # name -> PlanRun
    skipped: dict[str, str]        # baselines that do not fit, with the reason
    plan: Any                      # models.plans.Plan of the picked plan (its layouts in constraints)
    on: OnMesh                     # the picked plan's mesh
    meshes: list[dict]             # per mesh searched: its shape and its DP optimum (or why none)
    budget_bytes: Optional[float] = None
    nearest: dict[str, Any] = field(default_factory=dict)   # name -> (mesh shape, plan per block)


def plan_json(analysis: Analysis, assignment: Sequence[int]) -> Any:
    """The searched plan in the models' plan format; layouts go in ``constraints``."""
    from launcher.cfp.apply import AXIS_NAMES, plan_constraints
    from launcher.models.plans import Plan

    axes = tuple((AXIS_NAMES[i], n) for i, n in enumerate(analysis.mesh_shape))
    return Plan("cfp", axes, {"params": {}, "activations": {}, "inputs": {}},
                plan_constraints(analysis, dict(enumerate(assignment))))


def search(on: Sequence[OnMesh], *, memory_budget_gb: float = 0.0, verify_top_k: int = 4,
           verify_nearest: bool = True, verify_iterations: int = 10, verify_repeats: int = 6,
           verify_margin: float = 0.02,
           baselines: Sequence[str] = BASELINES, iterations: int = 100, run_repeats: int = 3, seed: int = 0,
           drop_after: int = 4, drop_slower_than: float = 1.25, log: Log = _silent,
           progress: Optional[Progress] = None, ilp: Any = None,
           final_run: Callable[[], ContextManager] = contextlib.nullcontext) -> Searched:
    """The search pass over one or more logical meshes of the same devices (``on``): the DP's
    optimum on each under ``memory_budget_gb`` per device (0: unlimited), the fastest of their
    shortlists measured on the whole step (``choose``), then that plan run beside ``baselines``
    (``iterations`` steps, ``run_repeats`` interleaved rounds; after ``drop_after`` rounds a
    built-in baseline slower than ``drop_slower_than`` times the fastest one in each of them
    stops, ``measure.Cut``, 0 keeps every one). ``ilp`` (``ilp_plan``'s, when
    ``baselines`` names ``alpa_ilp``): the ILP's plan, raced as that baseline. ``final_run``: a
    context around that race (the run's profiler trace, ``launcher/runtime/trace.py``)."""
    from launcher.cfp.search.dp import search as dp_search
    from launcher.cfp.search.measure import Cut, baseline_runners, race
    from launcher.errors import UserError

    progress = progress or _no_progress
    ilp_named, baselines = ILP_BASELINE in baselines, [b for b in baselines if b != ILP_BASELINE]  # built-ins only
    budget = memory_budget_gb * 2**30 if memory_budget_gb > 0 else None
    founds: list[Any] = []
    meshes: list[dict] = []
    refusals = []
    for o in on:
        try:
            found = dp_search(o.profiles, len(o.analyzed.analysis.blocks), budget)
        except UserError as e:  # nothing fits the budget on this mesh; another may do
            if len(on) == 1:
                raise
            founds.append(None)
            refusals.append(f"mesh {o.shape}: {e}")
            meshes.append({"mesh_shape": o.shape, "skipped": str(e)})
            log("mesh %s: %s" % (o.shape, e))
            continue
        founds.append(found)
        meshes.append({"mesh_shape": o.shape, "search_optimum": found.assignment, "search_time_s": found.search_time_s,
                       "predicted_step_time_s": found.predicted_time_s,
                       "predicted_memory_gb": found.predicted_memory_bytes / 2**30,
                       "profiled_configs": o.profiles.profiled_configs, "profile_time_s": o.profiles.seconds})
        log("search optimum on mesh %s (segment profiles): %s, segment combinations %s, predicted %.6f s, %.6f GB "
            "per device (search %.3f s)" % (o.shape, found.assignment, [list(c) for c in found.combos],
                                             found.predicted_time_s, found.predicted_memory_bytes / 2**30,
                                             found.search_time_s))
    if not any(founds):
        raise UserError("no plan fits on any mesh searched: " + "; ".join(refusals))
    chosen, candidates, nearest = choose(on, founds, budget, verify_top_k=verify_top_k,
                                         verify_nearest=verify_nearest, baselines=baselines,
                                         iterations=verify_iterations, repeats=verify_repeats,
                                         margin=verify_margin, seed=seed, log=log,
                                         progress=progress)
    picked, where = chosen.candidate, on[chosen.mesh_index]
    log("searched ParallelBlock Strategies solution: %s on mesh %s (%s)" % (picked.assignment, where.shape,
                                                                          picked.source))
    log("predicted step time %.6f s, memory %.6f GB per device" % (picked.predicted_time_s,
                                                                    picked.predicted_memory_bytes / 2**30))
    runners = [chosen]
    more, skipped = baseline_runners(where.analyzed.program, list(where.mesh.devices.flat), seed=seed, log=log,
                                     names=baselines)
    runners += more
    if ilp_named and ilp is not None:
        runners.append(ilp.runner(where.analyzed.program, seed=seed))
    cut = Cut(frozenset(range(1, 1 + len(more))), drop_after, drop_slower_than) if drop_slower_than else None
    with final_run(), progress(iterations * run_repeats * len(runners), "searched plan and baselines") as bar:
        searched, *others = race(runners, iterations=iterations, repeats=run_repeats, progress=bar, cut=cut)
    log("searched training cost: %s" % [round(t, 6) for t in searched.repeat_times_s])
    log("tflops: %s" % [round(t, 6) for t in searched.tflops_per_repeat()])
    runs = {r.name: r for r in others}
    for name, r in runs.items():
        log(f"baseline {name}: step {r.step_time_s * 1e3:.3f} ms, {r.memory_bytes / 2**20:.2f} MiB per device"
            + (f" ({len(r.repeat_times_s)} of {run_repeats} rounds: over {drop_slower_than:g}x the fastest baseline "
               f"in each, mode.drop_slower_than)" if len(r.repeat_times_s) < run_repeats else ""))
    return Searched(founds[chosen.mesh_index], picked, candidates, searched, runs, skipped,
                    plan_json(where.analyzed.analysis, picked.assignment), where, meshes, budget, nearest)


# --- the Alpa-style ILP (launcher/cfp/ilp/), CFP's comparison ---------------------------------



def ilp_plan(on: Sequence[Any], *, store_dir: str, memory_budget_gb: float = 0.0, repeats: int = 10,
             time_limit_s: float = 300.0, is_main: bool = True, log: Log = _silent) -> Any:
    """Alpa's intra-operator ILP over ``on``'s meshes (``OnMesh``es, or ``(Analyzed, mesh)``
    pairs): the collectives calibrated into the store at ``store_dir`` (once per mesh), the ILP
    solved under ``memory_budget_gb`` per device (0: unlimited) on each mesh, the plan its cost
    model predicts fastest kept (``ilp.plan.IlpPlanned``: its ``plan`` for plan.json, its
    ``runner`` for the race)."""
    from pathlib import Path

    from launcher.cfp.ilp.plan import ilp_over_meshes
    from launcher.cfp.profile.store import ProfileStore

    pairs = [(o.analyzed, o.mesh) if isinstance(o, OnMesh) else o for o in on]
    store = ProfileStore(Path(store_dir).expanduser().resolve())
    return ilp_over_meshes([(analyzed.analysis, mesh) for analyzed, mesh in pairs], store,
                           memory_budget_bytes=memory_budget_gb * 2**30 if memory_budget_gb > 0 else None,
                           repeats=repeats, time_limit_s=time_limit_s, is_main=is_main, log=log)


def ilp_search(planned: Any, program: Any, *, baselines: Sequence[str] = BASELINES, iterations: int = 100,
               run_repeats: int = 3, seed: int = 0, log: Log = _silent, progress: Optional[Progress] = None,
               final_run: Callable[[], ContextManager] = contextlib.nullcontext
               ) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """``mode.algorithm=ilp``: the ILP's plan (``ilp_plan``'s) run beside the built-in
    ``baselines`` in interleaved rounds, as ``search`` runs CFP's. Returns its ``PlanRun``, the
    baselines' and the baselines that do not fit (with why)."""
    from launcher.cfp.search.measure import baseline_runners, race

    progress = progress or _no_progress
    runners = [planned.runner(program, seed=seed)]
    more, skipped = baseline_runners(program, list(planned.mesh.devices.flat), seed=seed, log=log,
                                     names=[b for b in baselines if b != ILP_BASELINE])
    with final_run(), progress(iterations * run_repeats * (1 + len(more)), "ILP plan and baselines") as bar:
        run, *others = race(runners + more, iterations=iterations, repeats=run_repeats, progress=bar)
    log("ILP plan: step %.3f ms, %.2f MiB per device (predicted %.3f ms)"
        % (run.step_time_s * 1e3, run.memory_bytes / 2**20, planned.predicted_step_time_s * 1e3))
    runs = {r.name: r for r in others}
    for name, r in runs.items():
        log(f"baseline {name}: step {r.step_time_s * 1e3:.3f} ms, {r.memory_bytes / 2**20:.2f} MiB per device")
    return run, runs, skipped


def choose(on: Sequence[OnMesh], founds: Sequence[Any], budget: Optional[float], *, verify_top_k: int = 4,
           verify_nearest: bool = True, baselines: Sequence[str] = BASELINES, iterations: int = 10,
           repeats: int = 6, margin: float = 0.02, seed: int = 0, log: Log = _silent,
           progress: Optional[Progress] = None) -> tuple[Any, list[dict], dict[str, Any]]:
    """The plan to run: the fastest of the shortlist measured on the whole step
    (``search.measure.pick``). The shortlist: each mesh's DP optimum (``founds``, None where
    nothing fit), the plans nearest the baselines (``verify_nearest``; each on the mesh shaped
    like it, ``search/meshes.py``) and the rest of the meshes' shortlists up to ``verify_top_k``.
    The fastest plan nearest a baseline is kept unless another is faster by ``margin`` (a
    fraction) in the shortlist's rounds and then alone against it (``search.measure.pick``).
    Returns the chosen runner (its ``mesh_index`` set), a row per candidate, and the nearest
    plans ({name: (mesh shape, plan per block)})."""
    from launcher.cfp.search.dp import shortlist
    from launcher.cfp.search.measure import pick
    from launcher.cfp.search.meshes import merge_shortlists, nearest_on_meshes

    progress = progress or _no_progress
    live = [i for i, f in enumerate(founds) if f is not None]
    program = on[0].analyzed.program
    devices = list(on[0].mesh.devices.flat)
    nearest = nearest_on_meshes([on[i].analyzed.analysis for i in live], program, baselines, devices, log) \
        if verify_nearest else {}
    nearest = {name: (live[j], plan) for name, (j, plan) in nearest.items()}
    for name in baselines if verify_nearest else ():
        if name in nearest:
            log("plan nearest %s: %s on mesh %s" % (name, nearest[name][1], on[nearest[name][0]].shape))
        else:
            log("plan nearest %s: none (it does not fit the model or the meshes searched)" % name)
    shorts = []
    for i in live:
        mine = {name: plan for name, (j, plan) in nearest.items() if j == i}
        shorts.append(shortlist(on[i].profiles, founds[i], len(on[i].analyzed.analysis.blocks),
                                max(verify_top_k, 1), budget, mine))
    short = [(live[j], c) for j, c in merge_shortlists(shorts, max(verify_top_k, 1))]
    bar = progress(repeats * iterations * len(short), f"measuring {len(short)} plans") \
        if len(short) > 1 else contextlib.nullcontext()
    near_plans = {(i, tuple(plan)) for i, plan in nearest.values()}
    incumbents = [k for k, (i, c) in enumerate(short) if (i, tuple(c.assignment)) in near_plans]
    with bar as bar_value:
        chosen, rows = pick([(on[i].analyzed.analysis, on[i].analyzed.program, on[i].mesh, c) for i, c in short],
                            iterations=iterations, repeats=repeats, seed=seed, incumbents=incumbents, margin=margin,
                            progress=bar_value)
    chosen.mesh_index = short[rows.index(next(r for r in rows if r["chosen"]))][0]
    for i, row in enumerate(rows):
        if row["measured_step_time_s"] is not None:
            log("candidate %d (%s, mesh %s): %s predicted %.6f s, measured %.6f s (%.3f of each round's median)%s"
                % (i, row["source"], row["mesh_shape"], row["assignment"], row["predicted_step_time_s"],
                   row["measured_step_time_s"], row["paired_ratio"], "  <- chosen" if row["chosen"] else ""))
    kept = next(r for r in rows if r["chosen"])
    for row in rows:
        if row["duel_over_incumbent_paired"] is not None and not row["incumbent"]:
            log("%s (%s) raced the fastest plan nearest a baseline alone, %d rounds of %d steps: %.3f of its time "
                "round by round; %s (mode.verify_margin=%g)"
                % (row["source"], row["assignment"], 2 * repeats, iterations, row["duel_over_incumbent_paired"],
                   "it replaces it" if row["chosen"] else "kept %s" % kept["source"], margin))
    fastest = min((r for r in rows if r["measured_step_time_s"] is not None), key=lambda r: r["paired_ratio"],
                  default=None)
    if fastest is not None and not fastest["chosen"] and fastest["duel_over_incumbent_paired"] is None:
        log("kept %s (%s): %s measured %.3f of its time round by round, not the %.3f (mode.verify_margin=%g) "
            "needed to replace a plan nearest a baseline"
            % (kept["source"], kept["assignment"], fastest["source"], fastest["over_incumbent_paired"], 1 - margin,
               margin))
    return chosen, rows, {name: (on[i].shape, plan) for name, (i, plan) in nearest.items()}
