"""CFP's one entry: the three passes as functions of plain options, each returning a dataclass.

    analyzed = pipeline.analyze(model, mesh_shape=[4, 2])            # -> Analyzed
    mesh = pipeline.make_mesh(analyzed.analysis.mesh_shape)
    profiled = pipeline.profile(analyzed, mesh, store_dir="store")   # -> Profiled
    result = pipeline.search(analyzed, mesh, profiled.profiles)      # -> Searched

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
            log: Log = _silent) -> Analyzed:
    """The analysis pass over ``model``'s whole training step (or the HLO text module
    ``hlo_file``) for a logical mesh (``mesh_shape``; empty: 1-D over every global device)."""
    from launcher.cfp.analysis.core import analyze as analyze_step
    from launcher.cfp.analysis.core import analyze_graph
    from launcher.cfp.analysis.hlo_text import read_hlo
    from launcher.cfp.program import training_program

    mesh_shape = default_mesh_shape(mesh_shape)
    t0 = time.perf_counter()
    if hlo_file:
        program = None
        result = analyze_graph(read_hlo(hlo_file), mesh_shape)
    else:
        program = training_program(model, learning_rate)
        result = analyze_step(program.step, program.args, mesh_shape)
    seconds = time.perf_counter() - t0
    log("analysis: %d contractions, %d ParallelBlocks, %d segments over %d templates; exhaustive space "
        "%d, segment space %d (%.2f s)" % (len(result.contractions), len(result.blocks), len(result.segments),
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
            is_main: bool = True, log: Log = _silent, progress: Optional[Progress] = None) -> Profiled:
    """The profile pass: measures every segment combination the store at ``store_dir`` lacks.
    ``overlap_compile`` None: compile the next candidate while timing this one on accelerators,
    not on CPU devices (where the compiler would share the timed program's cores)."""
    from pathlib import Path

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
    profiler = Profiler(a, mesh, store, repeats=repeats, warmup=warmup, cold=cold_caches,
                        max_space=max_segment_space, overlap=overlap, log=log, is_main=is_main)
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


# --- search -----------------------------------------------------------------------------------

@dataclass
class Searched:
    found: Any                     # search.dp.SearchResult: the DP's optimum over segment profiles
    picked: Any                    # search.dp.Candidate: the plan kept after measuring the shortlist
    candidates: list[dict]         # a row per shortlisted plan
    searched: Any                  # search.measure.PlanRun of the picked plan
    baselines: dict[str, Any]      # name -> PlanRun
    skipped: dict[str, str]        # baselines that do not fit, with the reason
    plan: Any                      # models.plans.Plan of the picked plan (its layouts in constraints)
    budget_bytes: Optional[float] = None
    nearest: dict[str, list[int]] = field(default_factory=dict)


def plan_json(analysis: Analysis, assignment: Sequence[int]) -> Any:
    """The searched plan in the models' plan format; layouts go in ``constraints``."""
    from launcher.cfp.apply import AXIS_NAMES, plan_constraints
    from models.plans import Plan

    axes = tuple((AXIS_NAMES[i], n) for i, n in enumerate(analysis.mesh_shape))
    return Plan("cfp", axes, {"params": {}, "activations": {}, "inputs": {}},
                plan_constraints(analysis, dict(enumerate(assignment))))


def search(analyzed: Analyzed, mesh: Any, profiles: Any, *, memory_budget_gb: float = 0.0, verify_top_k: int = 4,
           verify_nearest: bool = True, verify_iterations: int = 10, verify_repeats: int = 6,
           baselines: Sequence[str] = BASELINES, iterations: int = 100, run_repeats: int = 3, seed: int = 0,
           log: Log = _silent, progress: Optional[Progress] = None) -> Searched:
    """The search pass: the DP's optimum under ``memory_budget_gb`` per device (0: unlimited),
    the fastest of its shortlist measured on the whole step (``choose``), then that plan run
    beside ``baselines`` (``iterations`` steps, ``run_repeats`` interleaved rounds)."""
    from launcher.cfp.search.dp import search as dp_search
    from launcher.cfp.search.measure import baseline_runners, race

    progress = progress or _no_progress
    a, program = analyzed.analysis, analyzed.program
    devices = list(mesh.devices.flat)
    budget = memory_budget_gb * 2**30 if memory_budget_gb > 0 else None
    found = dp_search(profiles, len(a.blocks), budget)
    log("search optimum (segment profiles): %s, segment combinations %s, predicted %.6f s, %.6f GB per "
        "device (search %.3f s)" % (found.assignment, [list(c) for c in found.combos], found.predicted_time_s,
                                     found.predicted_memory_bytes / 2**30, found.search_time_s))
    chosen, candidates, nearest = choose(analyzed, mesh, profiles, found, budget, verify_top_k=verify_top_k,
                                         verify_nearest=verify_nearest, baselines=baselines,
                                         iterations=verify_iterations, repeats=verify_repeats, seed=seed, log=log,
                                         progress=progress)
    picked = chosen.candidate
    log("searched ParallelBlock Strategies solution: %s (%s)" % (picked.assignment, picked.source))
    log("predicted step time %.6f s, memory %.6f GB per device" % (picked.predicted_time_s,
                                                                    picked.predicted_memory_bytes / 2**30))
    runners = [chosen]
    more, skipped = baseline_runners(program, devices, seed=seed, log=log, names=baselines)
    runners += more
    with progress(iterations * run_repeats * len(runners), "searched plan and baselines") as bar:
        searched, *others = race(runners, iterations=iterations, repeats=run_repeats, progress=bar)
    log("searched training cost: %s" % [round(t, 6) for t in searched.repeat_times_s])
    log("tflops: %s" % [round(t, 6) for t in searched.tflops_per_repeat()])
    runs = {r.name: r for r in others}
    for name, r in runs.items():
        log(f"baseline {name}: step {r.step_time_s * 1e3:.3f} ms, {r.memory_bytes / 2**20:.2f} MiB per device")
    return Searched(found, picked, candidates, searched, runs, skipped, plan_json(a, picked.assignment), budget,
                    nearest)


def choose(analyzed: Analyzed, mesh: Any, profiles: Any, found: Any, budget: Optional[float], *,
           verify_top_k: int = 4, verify_nearest: bool = True, baselines: Sequence[str] = BASELINES,
           iterations: int = 10, repeats: int = 6, seed: int = 0, log: Log = _silent,
           progress: Optional[Progress] = None) -> tuple[Any, list[dict], dict[str, list[int]]]:
    """The plan to run: the fastest of the search's shortlist (``verify_top_k``, and with
    ``verify_nearest`` the plans nearest the baselines) measured on the whole step
    (``search.measure.pick``); a row per candidate; the nearest plans."""
    from launcher.cfp.search.dp import shortlist
    from launcher.cfp.search.measure import pick
    from launcher.cfp.search.nearest import nearest_plans

    progress = progress or _no_progress
    a, program = analyzed.analysis, analyzed.program
    devices = list(mesh.devices.flat)
    nearest = nearest_plans(a, program, baselines, devices) if verify_nearest else {}
    for name in baselines if verify_nearest else ():
        log("plan nearest %s: %s" % (name, nearest.get(name, "none (it does not fit the model or the mesh)")))
    short = shortlist(profiles, found, len(a.blocks), max(verify_top_k, 1), budget, nearest)
    bar = progress(repeats * iterations * len(short), f"measuring {len(short)} plans") \
        if len(short) > 1 else contextlib.nullcontext()
    with bar as bar_value:
        chosen, rows = pick(a, program, mesh, short, iterations=iterations, repeats=repeats, seed=seed,
                            progress=bar_value)
    for i, row in enumerate(rows):
        if row["measured_step_time_s"] is not None:
            log("candidate %d (%s): %s predicted %.6f s, measured %.6f s (%.3f of each round's median)%s"
                % (i, row["source"], row["assignment"], row["predicted_step_time_s"], row["measured_step_time_s"],
                   row["paired_ratio"], "  <- chosen" if row["chosen"] else ""))
    return chosen, rows, nearest
