"""mode=search's run (and mode=cfp's, its preset): the algorithm (``mode.algorithm``) through the
one orchestration (``pipeline.run_search``: every mesh analysed, planned, raced beside the
baselines, answered), and the files the run dir gets. The options and what each file is:
``launcher/modes/search.py``."""

from __future__ import annotations

import time
from typing import Any, Mapping

from launcher.sharding import pipeline, results
from launcher.sharding.algorithms.base import Hooks
from launcher.sharding.user.api import load_step
from launcher.sharding.report import bar_chart, comparison_text, rows_of
from launcher.modes.search import algorithm_of
from launcher.runtime import trace
from launcher.runtime.context import TaskContext


def run(ctx: TaskContext) -> dict:
    t0 = time.perf_counter()
    cfg = ctx.mode_cfg
    algorithm = algorithm_of(cfg, seed=ctx.cfg.seed)
    if cfg.step:
        ctx.log.info("searching the step of mode.step=%s (the model group is not used)", cfg.step)
    subject = load_step(cfg.step, log=ctx.log.info) if cfg.step else ctx.model()
    algorithm.options = pipeline.with_user_baseline(algorithm.options, subject)
    hooks = Hooks(log=lambda line: ctx.log.info("%s", line), progress=ctx.progress, write=ctx.write_files,
                  final_run=lambda: trace.recording(ctx, "search"), is_main=ctx.is_main)
    out = pipeline.run_search(subject, algorithm, mesh_shape=cfg.mesh_shape, learning_rate=cfg.learning_rate,
                              hooks=hooks)
    _answer(ctx, out)
    fields = results.search_fields(out, algorithm.options, str(ctx.path(f"{out.planned.row}_plan.json")),
                                   str(ctx.path("plan.json")))
    files = _comparison(ctx, fields)
    step = {"step": cfg.step} if cfg.step else {}
    return {**fields, **files, **step, "mode_wall_s": time.perf_counter() - t0}


def _answer(ctx: TaskContext, out: pipeline.Searched) -> None:
    """``plan.json``, the answer (docs/cfp.md, "The answer"), and ``<searched>_plan.json``, the
    searched plan's own, as their users load them (``results.plan_files``: a built-in model's
    plans for ``mode=train mode.plan=``, a user's step's ``AutoPlan``s as ``autoshard`` hands them
    back); ``after_ir.txt``, the answer's program (and ``<searched>_after_ir.txt`` the searched
    plan's, where it is not the answer)."""
    answer = out.answer
    for name, text in results.plan_files(out).items():
        ctx.write_text(name, text)
    ctx.write_text("after_ir.txt", answer.run.compiled.as_text())
    if answer.name != answer.searched:
        ctx.write_text(f"{answer.searched}_after_ir.txt", out.searched.compiled.as_text())


def _comparison(ctx: TaskContext, fields: Mapping[str, Any]) -> dict:
    """``comparison.txt`` (also logged) and ``comparison.png``, made from the result's fields as
    the console makes them (``launcher/sharding/report.py``); their paths, as result fields."""
    text = comparison_text(fields)
    ctx.log.info("\n%s", text)
    ctx.write_text("comparison.txt", text)
    if ctx.is_main:
        bar_chart(rows_of(fields), ctx.path("comparison.png"), answer=fields["answer"]["name"])
    return {"comparison": str(ctx.path("comparison.txt")), "chart": str(ctx.path("comparison.png"))}
