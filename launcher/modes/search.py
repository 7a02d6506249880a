"""mode=search: the CFP search pass, and the searched plan run beside the baselines.

Reuses the profile store: combinations already measured for this model, mesh and devices are
read, missing ones are measured first (the log says how many of each). The analysis is redone
(it takes seconds and the plan is applied to the traced program anyway). Then dynamic
programming picks a combination per segment under ``mode.memory_budget_gb``, the plan runs on the
whole training step (``mode.iterations`` steps, ``mode.run_repeats`` repeats) next to the
built-in plans, and the run dir gets ``plan.json`` (for ``mode=train mode.plan=...``),
``after_ir.txt`` (the compiled program with its shardings), ``comparison.txt`` and
``comparison.png``. The passes are ``launcher.cfp.pipeline``'s; ``mode=cfp`` is this mode with
lighter defaults (``conf/mode/cfp.yaml``).
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

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission: the profile's checks, and baselines that are built-in plans."""
        from launcher.errors import UserError
        from models.plans import BUILTINS

        super().check(mode, job)
        for name in mode.baselines:
            if name not in BUILTINS:
                raise UserError(f"mode.baselines: {name!r} is not a built-in plan; choose from {', '.join(BUILTINS)}")


def run(ctx: Any) -> dict:
    from launcher.cfp import pipeline
    from launcher.cfp.search.report import bar_chart, table_text

    t0 = time.perf_counter()
    cfg = ctx.mode_cfg
    analyzed, mesh, profiled = analyze_and_profile(ctx)
    analysis, profiles = analyzed.analysis, profiled.profiles
    ctx.log.info("analysis recomputed (it is needed to apply the plan); %d of %d segment combinations reused from "
                 "the profile store, %d were missing and measured now", profiles.reused, profiles.profiled_configs,
                 profiles.measured)
    out = pipeline.search(analyzed, mesh, profiles, memory_budget_gb=cfg.memory_budget_gb,
                          verify_top_k=cfg.verify_top_k, verify_nearest=cfg.verify_nearest,
                          verify_iterations=cfg.verify_iterations, verify_repeats=cfg.verify_repeats,
                          baselines=list(cfg.baselines), iterations=cfg.iterations, run_repeats=cfg.run_repeats,
                          seed=ctx.cfg.seed, log=lambda line: ctx.log.info("%s", line), progress=ctx.progress)
    searched, picked, found, runs = out.searched, out.picked, out.found, out.baselines
    ctx.write_text("after_ir.txt", searched.compiled.as_text())
    ctx.write_text("plan.json", out.plan.to_json())
    everything = {"cfp": searched, **runs}
    table = table_text(everything, out.skipped)
    ctx.log.info("\n%s", table)
    ctx.write_text("comparison.txt", table)
    if ctx.is_main:
        bar_chart(everything, ctx.path("comparison.png"))

    return {
        **analysis.summary(),
        "mesh_shape": list(analysis.mesh_shape),
        "plan": {"assignment": picked.assignment, "source": picked.source, "file": str(ctx.path("plan.json"))},
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
        "profiled_configs": profiles.profiled_configs,
        "measured_configs": profiles.measured,
        "reused_configs": profiles.reused,
        "search_time_s": found.search_time_s,
        "profile_time_s": profiles.seconds,
        "memory_budget_gb": cfg.memory_budget_gb,
        "baselines": {name: r.summary() for name, r in runs.items()},
        "baselines_skipped": out.skipped,
        "mode_wall_s": time.perf_counter() - t0,
    }
