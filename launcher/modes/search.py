"""mode=search: the CFP search pass, and the searched plan run beside the baselines.

Reuses the profile store: combinations already measured for this model, mesh and devices are
read, missing ones are measured first (the log says how many of each). The analysis is redone
(it takes seconds and the plan is applied to the traced program anyway). Then dynamic
programming picks a combination per segment under ``mode.memory_budget_gb``, the plan runs on the
whole training step (``mode.iterations`` steps, ``mode.run_repeats`` repeats) next to the
built-in plans, and the run dir gets ``plan.json`` (for ``mode=train mode.plan=...``),
``after_ir.txt`` (the compiled program with its shardings), ``comparison.txt`` and
``comparison.png``. The passes are ``launcher.cfp.pipeline``'s; ``mode=cfp`` is this mode with
lighter defaults (``conf/mode/cfp.yaml``). ``alpa_ilp`` in ``mode.baselines`` races the
Alpa-style ILP's plan (``launcher/cfp/ilp/``) beside CFP's; ``mode.algorithm=ilp`` runs that ILP
instead of CFP's search (``_ilp.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, List

from launcher.modes.profile import Config as ProfileConfig
from launcher.modes.profile import analyze_and_profile


@dataclass
class Config(ProfileConfig):
    name: str = "search"
    # Every logical mesh worth searching ([8], [4,2], [2,4] for 8 devices), the fastest plan kept:
    # the search space then holds every baseline's layout (launcher/cfp/search/meshes.py).
    mesh_shape: Any = "auto"
    iterations: int = 100          # training steps per repeat of each whole-model run
    run_repeats: int = 3
    # After drop_after rounds, a built-in baseline over drop_slower_than times the fastest one in
    # every round so far runs no more (0: every baseline runs every round). What decides the
    # result is the searched plan over the fastest baseline; rounds spent on a plan twice as slow
    # do not narrow it (launcher/cfp/search/measure.py, Cut).
    drop_after: int = 4
    drop_slower_than: float = 1.25
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
    # A plan replaces the fastest plan nearest a baseline only when faster by this fraction,
    # round by round: short rounds cannot tell plans apart within their noise (the bench's A/A
    # floor, 0.01-0.07 on the tiny models), and there the baseline-like plan is the safe one.
    verify_margin: float = 0.02
    # cfp: CFP's profiling search. ilp: the Alpa-style ILP alone (launcher/cfp/ilp/, nothing
    # profiled); with cfp, mode.baselines may name alpa_ilp to race the ILP's plan beside CFP's.
    algorithm: str = "cfp"
    ilp_time_limit_s: float = 300.0  # HiGHS's limit per mesh; the best plan found by then is kept

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission: the profile's checks, a known algorithm, and baselines that are
        built-in plans or the ILP's (``alpa_ilp``)."""
        from launcher.cfp.ilp import NAME as ILP_BASELINE
        from launcher.errors import UserError
        from launcher.models.plans import BUILTINS

        super().check(mode, job)
        if not 0 <= mode.verify_margin < 1:
            raise UserError(f"mode.verify_margin={mode.verify_margin}: must be a fraction from 0 (the fastest "
                            "measured plan wins) to below 1, e.g. 0.02")
        if mode.drop_slower_than != 0 and not mode.drop_slower_than > 1:
            raise UserError(f"mode.drop_slower_than={mode.drop_slower_than}: must be a factor above 1 (a baseline "
                            "that much slower than the fastest in every round stops racing), e.g. 1.25, or 0 to "
                            "race every baseline every round")
        if mode.drop_after < 1:
            raise UserError(f"mode.drop_after={mode.drop_after}: must be a number of rounds, at least 1, e.g. 4")
        if mode.algorithm not in ("cfp", "ilp"):
            raise UserError(f"mode.algorithm={mode.algorithm!r}: choose cfp (CFP's profiling search) or ilp (the "
                            "Alpa-style ILP)")
        for name in mode.baselines:
            if name not in BUILTINS and name != ILP_BASELINE:
                raise UserError(f"mode.baselines: {name!r} is not a built-in plan; choose from "
                                f"{', '.join([*BUILTINS, ILP_BASELINE])}")


def run(ctx: Any) -> dict:
    from launcher.cfp import pipeline
    from launcher.cfp.search.report import bar_chart, best_baseline, table_text
    from launcher.runtime import trace

    t0 = time.perf_counter()
    cfg = ctx.mode_cfg
    if cfg.algorithm == "ilp":
        from launcher.modes import _ilp

        return _ilp.run(ctx)
    on = analyze_and_profile(ctx)
    # The ILP's plan (alpa_ilp in mode.baselines) on the same meshes, raced with the baselines.
    ilp = pipeline.ilp_plan(on, store_dir=cfg.store_dir, memory_budget_gb=cfg.memory_budget_gb, repeats=cfg.repeats,
                            time_limit_s=cfg.ilp_time_limit_s, is_main=ctx.is_main,
                            log=lambda line: ctx.log.info("%s", line)) \
        if pipeline.ILP_BASELINE in cfg.baselines else None
    for o in on:
        p = o.profiles
        ctx.log.info("mesh %s: %d of %d segment combinations reused from the profile store, %d were missing and "
                     "measured now", o.shape, p.reused, p.profiled_configs, p.measured)
    out = pipeline.search(on, memory_budget_gb=cfg.memory_budget_gb,
                          verify_top_k=cfg.verify_top_k, verify_nearest=cfg.verify_nearest,
                          verify_iterations=cfg.verify_iterations, verify_repeats=cfg.verify_repeats,
                          verify_margin=cfg.verify_margin,
                          baselines=list(cfg.baselines), iterations=cfg.iterations, run_repeats=cfg.run_repeats,
                          drop_after=cfg.drop_after, drop_slower_than=cfg.drop_slower_than,
                          seed=ctx.cfg.seed, log=lambda line: ctx.log.info("%s", line), progress=ctx.progress,
                          ilp=ilp, final_run=lambda: trace.recording(ctx, "search"))
    searched, picked, found, runs = out.searched, out.picked, out.found, out.baselines
    if ilp is not None:
        ctx.write_text("alpa_ilp_plan.json", ilp.plan.to_json())
        ctx.write_text("ilp_plan.txt", ilp.describe())
    analysis = out.on.analyzed.analysis
    ctx.write_text("after_ir.txt", searched.compiled.as_text())
    ctx.write_text("plan.json", out.plan.to_json())
    everything = {"cfp": searched, **runs}
    table = table_text(everything, out.skipped, rounds=cfg.run_repeats,
                       why_fewer=f"over {cfg.drop_slower_than:g}x the fastest baseline in each, mode.drop_slower_than")
    ctx.log.info("\n%s", table)
    ctx.write_text("comparison.txt", table)
    if ctx.is_main:
        bar_chart(everything, ctx.path("comparison.png"))
    best = best_baseline(searched, runs)

    profiles = [o.profiles for o in on]
    return {
        **analysis.summary(),
        "mesh_shape": list(analysis.mesh_shape),
        "meshes": out.meshes,
        "plan": {"assignment": picked.assignment, "mesh_shape": list(analysis.mesh_shape), "source": picked.source,
                 "file": str(ctx.path("plan.json"))},
        "search_optimum": {"assignment": found.assignment, "segment_combinations": [list(c) for c in found.combos]},
        "candidates": out.candidates,
        "predicted_step_time_s": picked.predicted_time_s,
        "predicted_memory_gb": picked.predicted_memory_bytes / 2**30,
        "step_time_s": searched.step_time_s,
        "repeat_times_s": searched.repeat_times_s,
        "memory_gb": searched.memory_bytes / 2**30,
        "tflops": searched.tflops,
        "flop_count": searched.flops,
        "losses": searched.losses,
        **best,
        "profiled_configs": sum(p.profiled_configs for p in profiles),
        "measured_configs": sum(p.measured for p in profiles),
        "reused_configs": sum(p.reused for p in profiles),
        "search_time_s": sum(m.get("search_time_s", 0.0) for m in out.meshes),
        "profile_time_s": sum(p.seconds for p in profiles),
        "memory_budget_gb": cfg.memory_budget_gb,
        "baselines": {name: {**r.summary(), **(ilp.summary() if name == pipeline.ILP_BASELINE else {})}
                      for name, r in runs.items()},
        "baselines_skipped": out.skipped,
        "comparison": str(ctx.path("comparison.txt")),
        "chart": str(ctx.path("comparison.png")),
        "mode_wall_s": time.perf_counter() - t0,
    }
