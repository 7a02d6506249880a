"""mode=search: the CFP search pass, and the searched plan run beside the baselines.

Reuses the profile store: combinations already measured for this model, mesh and devices are
read, missing ones are measured first (the log says how many of each). The analysis is redone
(it takes seconds and the plan is applied to the traced program anyway). Then dynamic
programming picks a combination per segment under ``mode.memory_budget_gb``, the plan runs on the
whole training step (``mode.iterations`` steps, ``mode.run_repeats`` repeats) next to the
built-in plans, and the run dir gets ``plan.json`` (for ``mode=train mode.plan=...``),
``after_ir.txt`` (the compiled program with its shardings), ``comparison.txt`` and
``comparison.png``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, List

from launcher.modes.profile import Config as ProfileConfig
from launcher.modes.profile import run_profile


@dataclass
class Config(ProfileConfig):
    name: str = "search"
    memory_budget_gb: float = 0.0  # per device; 0 = unlimited
    iterations: int = 100          # training steps per repeat of each whole-model run
    run_repeats: int = 3
    baselines: List[str] = field(default_factory=lambda: ["dp", "tp", "fsdp", "dp_tp", "ep"])
    # Measure the search's best few plans (its optimum, runners-up, uniform plans) on the whole
    # step and keep the fastest: 1 takes the search's optimum unmeasured (unless verify_nearest).
    verify_top_k: int = 4
    # Measure, besides, the plan nearest each of mode.baselines (launcher/cfp/nearest.py).
    verify_nearest: bool = True
    verify_iterations: int = 10    # steps per round when measuring them
    # Interleaved rounds; the best few plans are often within a round's noise of each other
    # (bench/bench_cfp_search.py's A/A figure), and a round of them costs far less than compiling them.
    verify_repeats: int = 6


def plan_json(analysis: Any, assignment: list[int]) -> Any:
    """The searched plan in the models' plan format; layouts go in ``constraints``."""
    from launcher.cfp.apply import AXIS_NAMES, plan_constraints
    from models.plans import Plan

    axes = tuple((AXIS_NAMES[i], n) for i, n in enumerate(analysis.mesh_shape))
    return Plan("cfp", axes, {"params": {}, "activations": {}, "inputs": {}},
                plan_constraints(analysis, dict(enumerate(assignment))))


def run_search(ctx: Any) -> dict:
    import jax

    from launcher.cfp.measure import baseline_runners, race
    from launcher.cfp.report import bar_chart, table_text
    from launcher.cfp.search import search

    cfg = ctx.mode_cfg
    analysis, program, mesh, profiles = run_profile(ctx)
    if cfg.name == "search":
        ctx.log.info("mode=search: analysis recomputed (it is needed to apply the plan); %d of %d segment "
                     "combinations reused from the profile store, %d were missing and measured now",
                     profiles.reused, profiles.profiled_configs, profiles.measured)
    budget = cfg.memory_budget_gb * 2**30 if cfg.memory_budget_gb > 0 else None
    found = search(profiles, len(analysis.blocks), budget)
    ctx.log.info("search optimum (segment profiles): %s, segment combinations %s, predicted %.6f s, %.6f GB per "
                 "device (search %.3f s)", found.assignment, [list(c) for c in found.combos], found.predicted_time_s,
                 found.predicted_memory_bytes / 2**30, found.search_time_s)

    log = lambda line: ctx.log.info("%s", line)
    chosen, candidates = choose(ctx, analysis, program, mesh, profiles, found, budget)
    picked = chosen.candidate
    ctx.log.info("searched ParallelBlock Strategies solution: %s (%s)", picked.assignment, picked.source)
    ctx.log.info("predicted step time %.6f s, memory %.6f GB per device", picked.predicted_time_s,
                 picked.predicted_memory_bytes / 2**30)
    runners = [chosen]
    more, skipped = baseline_runners(program, jax.devices(), seed=ctx.cfg.seed, log=log, names=cfg.baselines)
    runners += more
    with ctx.progress(cfg.iterations * cfg.run_repeats * len(runners), "searched plan and baselines") as bar:
        searched, *others = race(runners, iterations=cfg.iterations, repeats=cfg.run_repeats, progress=bar)
    runs = {r.name: r for r in others}
    ctx.log.info("searched training cost: %s", [round(t, 6) for t in searched.repeat_times_s])
    ctx.log.info("tflops: %s", [round(t, 6) for t in searched.tflops_per_repeat()])
    ctx.write_text("after_ir.txt", searched.compiled.as_text())
    plan = plan_json(analysis, picked.assignment)
    ctx.write_text("plan.json", plan.to_json())

    for name, r in runs.items():
        log(f"baseline {name}: step {r.step_time_s * 1e3:.3f} ms, {r.memory_bytes / 2**20:.2f} MiB per device")
    everything = {"cfp": searched, **runs}
    table = table_text(everything, skipped)
    ctx.log.info("\n%s", table)
    ctx.write_text("comparison.txt", table)
    if ctx.is_main:
        bar_chart(everything, ctx.path("comparison.png"))

    return {
        **analysis.summary(),
        "mesh_shape": list(analysis.mesh_shape),
        "plan": {"assignment": picked.assignment, "source": picked.source, "file": str(ctx.path("plan.json"))},
        "search_optimum": {"assignment": found.assignment, "segment_combinations": [list(c) for c in found.combos]},
        "candidates": candidates,
        "predicted_step_time_s": picked.predicted_time_s,
        "predicted_memory_gb": picked.predicted_memory_bytes / 2**30,
        "step_time_s": searched.step_time_s,
        "repeat_times_s": searched.repeat_times_s,
        "memory_gb": searched.memory_bytes / 2**30,
        "tflops": searched.tflops,
        "flop_count": searched.flops,
        "losses": searched.losses,
        "profiled_configs": profiles.profiled_configs,
        "measured_configs": profiles.measured,
        "reused_configs": profiles.reused,
        "search_time_s": found.search_time_s,
        "profile_time_s": profiles.seconds,
        "memory_budget_gb": cfg.memory_budget_gb,
        "baselines": {name: r.summary() for name, r in runs.items()},
        "baselines_skipped": skipped,
    }


def choose(ctx: Any, analysis: Any, program: Any, mesh: Any, profiles: Any, found: Any,
           budget: float | None) -> tuple[Any, list[dict]]:
    """The plan to run: the fastest of the search's shortlist (``mode.verify_top_k``, and with
    ``mode.verify_nearest`` the plans nearest the baselines) measured on the whole step
    (``launcher.cfp.measure.pick``), and a row per candidate for result.json."""
    import jax

    from launcher.cfp.measure import pick
    from launcher.cfp.nearest import nearest_plans
    from launcher.cfp.search import shortlist

    cfg = ctx.mode_cfg
    nearest = nearest_plans(analysis, program, cfg.baselines, jax.devices()) if cfg.verify_nearest else {}
    for name in cfg.baselines if cfg.verify_nearest else ():
        ctx.log.info("plan nearest %s: %s", name, nearest.get(name, "none (it does not fit the model or the mesh)"))
    short = shortlist(profiles, found, len(analysis.blocks), max(cfg.verify_top_k, 1), budget, nearest)
    bar = ctx.progress(cfg.verify_repeats * cfg.verify_iterations * len(short), f"measuring {len(short)} plans") \
        if len(short) > 1 else contextlib.nullcontext()
    with bar as progress:
        chosen, rows = pick(analysis, program, mesh, short, iterations=cfg.verify_iterations,
                            repeats=cfg.verify_repeats, seed=ctx.cfg.seed, progress=progress)
    for i, row in enumerate(rows):
        if row["measured_step_time_s"] is not None:
            ctx.log.info("candidate %d (%s): %s predicted %.6f s, measured %.6f s (%.3f of each round's median)%s",
                         i, row["source"], row["assignment"], row["predicted_step_time_s"],
                         row["measured_step_time_s"], row["paired_ratio"], "  <- chosen" if row["chosen"] else "")
    return chosen, rows


def run(ctx: Any) -> dict:
    t0 = time.perf_counter()
    result = run_search(ctx)
    result["mode_wall_s"] = time.perf_counter() - t0
    return result
