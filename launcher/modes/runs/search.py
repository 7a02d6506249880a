"""mode=search's run (and mode=cfp's, its preset): the CFP search, or the ILP, over every mesh
(``launcher.cfp.pipeline``), the plan raced beside the baselines, and the files the run dir gets.
The options and what each file is: ``launcher/modes/search.py``."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any, Callable, Mapping

from launcher.cfp import pipeline, results
from launcher.cfp.autoshard import AutoPlan, load_step
from launcher.cfp.options import ILP_BASELINE, USER_BASELINE, SearchOptions
from launcher.cfp.program import TrainingProgram
from launcher.cfp.search.report import bar_chart, table_text
from launcher.modes.search import ilp_options, search_options
from launcher.runtime import trace


def run(ctx: Any) -> dict:
    t0 = time.perf_counter()
    cfg = ctx.mode_cfg
    options = search_options(cfg, seed=ctx.cfg.seed)
    subject = _user_step(ctx) if cfg.step else ctx.model()
    if isinstance(subject, TrainingProgram) and subject.in_shardings is not None \
            and USER_BASELINE not in options.baselines:
        options = replace(options, baselines=(*options.baselines, USER_BASELINE))  # the user's own, raced too
    result = _ilp(ctx, options, subject) if cfg.algorithm == "ilp" else _cfp(ctx, options, subject)
    return {**result, "mode_wall_s": time.perf_counter() - t0}


def _user_step(ctx: Any) -> TrainingProgram:
    """mode.step's program (``autoshard.load_step``)."""
    ctx.log.info("searching the step of mode.step=%s (the model group is not used)", ctx.mode_cfg.step)
    return load_step(ctx.mode_cfg.step, log=ctx.log.info)


def _cfp(ctx: Any, options: SearchOptions, subject: Any) -> dict:
    """CFP's search: analyse and profile every mesh, the ILP's plan too where alpa_ilp races."""
    cfg = ctx.mode_cfg
    log = lambda line: ctx.log.info("%s", line)
    on = pipeline.analyze_meshes(subject, cfg.mesh_shape, learning_rate=cfg.learning_rate, log=log)
    for o in on:
        ctx.write_files(o.files())
    on = pipeline.profile_meshes(on, options.profile, is_main=ctx.is_main, log=log, progress=ctx.progress,
                                 baselines=options.baselines)
    for o in on:
        ctx.write_json(o.folder + "profiles.json", o.profiles_json())
    # The ILP's plan (alpa_ilp in mode.baselines) on the same meshes, raced with the baselines.
    ilp = pipeline.ilp_plan(on, ilp_options(cfg), is_main=ctx.is_main, log=log) \
        if ILP_BASELINE in options.baselines else None
    out = pipeline.search(on, options, log=log, progress=ctx.progress, ilp=ilp,
                          final_run=lambda: trace.recording(ctx, "search"))
    if ilp is not None:
        ctx.write_text("alpa_ilp_plan.json", ilp.plan.to_json())
        ctx.write_text("ilp_plan.txt", ilp.describe())
    notes, step = _answer(ctx, subject, out.answer, out.searched, out.plan,
                          lambda plans: plans.searched_by_cfp(subject, out))
    files = _comparison(ctx, {"cfp": out.searched, **out.baselines}, out.skipped, rounds=options.run_repeats,
                        why_fewer=f"over {options.drop_slower_than:g}x the fastest baseline in each, "
                                  "mode.drop_slower_than", answer=out.answer.name, notes=notes)
    return {**results.search_fields(out, on, options, str(ctx.path("cfp_plan.json")), str(ctx.path("plan.json")),
                                    ilp=ilp), **files, **step}


def _ilp(ctx: Any, options: SearchOptions, subject: Any) -> dict:
    """mode.algorithm=ilp: the ILP alone on every mesh, analysed in full, nothing profiled."""
    cfg = ctx.mode_cfg
    log = lambda line: ctx.log.info("%s", line)
    on = pipeline.analyze_meshes(subject, cfg.mesh_shape, learning_rate=cfg.learning_rate,
                                 two_axis_only=False, log=log)
    for o in on:
        ctx.write_files(o.files())
    planned = pipeline.ilp_plan(on, ilp_options(cfg), is_main=ctx.is_main, log=log)
    program = next(o.analyzed.program for o in on if o.mesh is planned.mesh)
    out = pipeline.ilp_search(planned, program, options, log=log, progress=ctx.progress,
                              final_run=lambda: trace.recording(ctx, "search"))
    ctx.write_text("ilp_plan.txt", planned.describe())
    notes, step = _answer(ctx, subject, out.answer, out.run, planned.plan,
                          lambda plans: plans.searched_by_ilp(subject, planned, out))
    files = _comparison(ctx, {ILP_BASELINE: out.run, **out.baselines}, out.skipped,
                        title="The ILP's plan against the baselines (same devices)", answer=out.answer.name,
                        notes=notes)
    return {**results.ilp_fields(planned, out, options, str(ctx.path(f"{ILP_BASELINE}_plan.json")),
                                 str(ctx.path("plan.json"))), **files, **step}


def _answer(ctx: Any, subject: Any, answer: pipeline.Answer, searched: Any, own: Any,
            own_step: Callable[[Any], Any]) -> tuple[list[str], dict]:
    """``plan.json``, the answer (docs/cfp.md, "The answer"); ``<searched>_plan.json``, the
    searched plan's own (CFP's or the ILP's, ``own``); ``after_ir.txt``, the answer's program
    (and ``<searched>_after_ir.txt`` the searched plan's, where it is not the answer). For a
    user's step (mode.step) the plans are ``AutoPlan``s (``own_step(AutoPlan)`` the searched
    one), which ``AutoPlan.load`` reads. Returns the lines that say so under the table, and the
    result fields of a user's step: its step, and how the answer did against the user's own
    shardings where they ran."""
    own_file = f"{answer.searched}_plan.json"
    step: dict = {}
    if isinstance(subject, TrainingProgram):
        searched_plan = own_step(AutoPlan)
        plan = searched_plan.answered(subject, answer)
        ctx.write_text(own_file, _auto_json(searched_plan))
        ctx.write_text("plan.json", _auto_json(plan))
        step = {"step": ctx.mode_cfg.step, **{k: v for k, v in plan.comparison().items() if k == "vs_user_paired"}}
    else:
        ctx.write_text(own_file, own.to_json())
        ctx.write_text("plan.json", answer.plan.to_json())
    ctx.write_text("after_ir.txt", answer.run.compiled.as_text())
    if answer.name == answer.searched:
        return [answer.why() + " (plan.json)"], step
    ctx.write_text(f"{answer.searched}_after_ir.txt", searched.compiled.as_text())
    return [answer.why() + f" (plan.json; {pipeline.plan_title(answer.searched)} is {own_file})"], step


def _auto_json(plan: Any) -> str:
    return json.dumps(plan.to_json(), indent=1, default=float) + "\n"


def _comparison(ctx: Any, runs: Mapping[str, Any], skipped: Mapping[str, str], answer: str = "",
                **table: Any) -> dict:
    """``comparison.txt`` (also logged) and ``comparison.png``: the plan kept beside the
    baselines, the answer marked (``launcher/cfp/search/report.py``); their paths, as result
    fields."""
    text = table_text(runs, skipped, answer=answer, **table)
    ctx.log.info("\n%s", text)
    ctx.write_text("comparison.txt", text)
    if ctx.is_main:
        bar_chart(runs, ctx.path("comparison.png"), answer=answer)
    return {"comparison": str(ctx.path("comparison.txt")), "chart": str(ctx.path("comparison.png"))}
