"""``mode=search mode.algorithm=ilp`` (and ``mode=cfp``): the Alpa-style ILP instead of CFP's
profiling search, on its own.

The analysis of every mesh of ``mode.mesh_shape`` (``auto``: each logical mesh of the devices,
as CFP searches them; a mesh the model cannot divide is left out), then
``launcher.cfp.pipeline.ilp_plan`` (the collectives calibrated into ``mode.store_dir`` once per
mesh, the ILP solved on each mesh under ``mode.memory_budget_gb``, the plan its model predicts
fastest kept) and ``pipeline.ilp_search`` (that plan raced beside ``mode.baselines``). Writes
``plan.json`` (for ``mode=train mode.plan=...``), ``ilp_plan.txt`` (every contraction's
strategy), ``after_ir.txt``, ``comparison.txt`` and ``comparison.png``. Nothing is profiled.

A module of its own (the leading underscore keeps it out of the mode list): ``search.py``
dispatches here on ``mode.algorithm``.
"""

from __future__ import annotations

import time
from typing import Any


def analyses(ctx: Any) -> list[tuple[Any, Any]]:
    """(Analyzed, mesh) for each mesh of ``mode.mesh_shape``, the analysis files written
    (``launcher.modes.profile.analyses``). The ILP takes every strategy the analysis enumerates
    and drops those that leave an axis repeating work itself, so 2-D meshes are analysed in full."""
    from launcher.modes.profile import analyses as mesh_analyses

    return [(analyzed, mesh) for analyzed, mesh, _ in mesh_analyses(ctx, two_axis_only=False)]


def run(ctx: Any) -> dict:
    from launcher.cfp import pipeline
    from launcher.cfp.search.report import bar_chart, best_baseline, table_text
    from launcher.runtime import trace

    t0 = time.perf_counter()
    cfg = ctx.mode_cfg
    log = lambda line: ctx.log.info("%s", line)
    pairs = analyses(ctx)
    planned = pipeline.ilp_plan(pairs, store_dir=cfg.store_dir, memory_budget_gb=cfg.memory_budget_gb,
                                repeats=cfg.repeats, time_limit_s=cfg.ilp_time_limit_s, is_main=ctx.is_main, log=log)
    program = next(analyzed.program for analyzed, mesh in pairs if mesh is planned.mesh)
    run_, runs, skipped = pipeline.ilp_search(planned, program, baselines=list(cfg.baselines),
                                              iterations=cfg.iterations, run_repeats=cfg.run_repeats,
                                              seed=ctx.cfg.seed, log=log, progress=ctx.progress,
                                              final_run=lambda: trace.recording(ctx, "search"))
    ctx.write_text("plan.json", planned.plan.to_json())
    ctx.write_text("ilp_plan.txt", planned.describe())
    ctx.write_text("after_ir.txt", run_.compiled.as_text())
    everything = {pipeline.ILP_BASELINE: run_, **runs}
    table = table_text(everything, skipped, title="The ILP's plan against the baselines (same devices)")
    ctx.log.info("\n%s", table)
    ctx.write_text("comparison.txt", table)
    if ctx.is_main:
        bar_chart(everything, ctx.path("comparison.png"))
    return {
        **planned.analysis.summary(),
        "algorithm": "ilp",
        "plan": {"file": str(ctx.path("plan.json")), "mesh_shape": planned.mesh_shape,
                 "block_assignment": planned.block_assignment},
        **planned.summary(),
        "step_time_s": run_.step_time_s,
        "repeat_times_s": run_.repeat_times_s,
        "memory_gb": run_.memory_bytes / 2**30,
        "tflops": run_.tflops,
        "flop_count": run_.flops,
        "losses": run_.losses,
        **best_baseline(run_, runs),
        "memory_budget_gb": cfg.memory_budget_gb,
        "baselines": {name: r.summary() for name, r in runs.items()},
        "baselines_skipped": skipped,
        "comparison": str(ctx.path("comparison.txt")),
        "chart": str(ctx.path("comparison.png")),
        "mode_wall_s": time.perf_counter() - t0,
    }
