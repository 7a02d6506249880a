"""mode=search: the CFP search pass, and the searched plan run beside the baselines.

Reuses the profile store: combinations already measured for this model, mesh and devices are
read, missing ones are measured first (the log says how many of each). The analysis is redone
(it takes seconds and the plan is applied to the traced program anyway). Then dynamic
programming picks a combination per segment under ``mode.memory_budget_gb``, the plan runs on the
whole training step (``mode.iterations`` steps, ``mode.run_repeats`` repeats) next to the
built-in plans, and the run dir gets ``plan.json`` (for ``mode=train mode.plan=...``),
``after_ir.txt`` (the compiled program with its shardings), ``comparison.txt`` and
``comparison.png``. ``mode=cfp`` is this mode with lighter defaults (``conf/mode/cfp.yaml``).

``plan.json`` is the answer (``pipeline.Answer``): the searched plan where it beat the fastest
baseline by ``mode.verify_margin`` in the final race, else that baseline's plan; the searched
plan is always ``cfp_plan.json`` (``alpa_ilp_plan.json`` for the ILP's), and ``after_ir.txt``
is the answer's program (the searched plan's too, ``<plan>_after_ir.txt``, where it is not the
answer). The table, the chart and the console name the answer and say why (docs/cfp.md).

``alpa_ilp`` in ``mode.baselines`` races the Alpa-style ILP's plan (``launcher/cfp/ilp/``)
beside CFP's (and writes ``alpa_ilp_plan.json``, ``ilp_plan.txt``). ``mode.algorithm=ilp`` runs
that ILP instead of CFP's search, nothing profiled: every mesh of ``mode.mesh_shape`` analysed
in full (the ILP drops the strategies that leave an axis repeating work itself), the collectives
calibrated into ``mode.store_dir`` once per mesh, the ILP solved on each under
``mode.memory_budget_gb`` and the plan its model predicts fastest raced beside the baselines;
``plan.json``, ``ilp_plan.txt`` (every contraction's strategy), ``after_ir.txt`` and the
comparison as above.

``mode.step=pkg.module:make_step`` searches a user's own training step instead of the model
(``launcher/cfp/autoshard.py``, docs/autoshard.md): the factory, importable from the directory
the launcher starts in, returns the step function and its example arguments (or an
``autoshard.Step``); the baselines are dp, fsdp and the user's own shardings where the factory
gives them (the built-in plans that name the model's logical axes are skipped, saying why), and
plan.json is the ``AutoPlan`` that ``AutoPlan.load`` reads.

The options are ``launcher.cfp.options``' (``SearchOptions``, ``IlpOptions``, and the profile's
through ``cfp_config.ProfileConfig``), the passes ``launcher.cfp.pipeline``'s, the result's
fields ``launcher.cfp.results``'.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional

from launcher.cfp import pipeline, results
from launcher.cfp.options import ILP_BASELINE, USER_BASELINE, IlpOptions, SearchOptions
from launcher.cfp.program import TrainingProgram
from launcher.cfp.search.meshes import AUTO
from launcher.cfp.search.report import bar_chart, table_text
from launcher.errors import UserError
from launcher.modes.cfp_config import AnalysisConfig, ProfileConfig
from launcher.runtime import trace
from launcher.runtime.program import check_target, parse_target


@dataclass
class Config(ProfileConfig):
    """mode=search's options: the profile's, ``SearchOptions``' and the ILP's (launcher/cfp/options.py
    says what each does, and why its default)."""

    name: str = "search"
    code: str = "search"
    # Every logical mesh worth searching ([8], [4,2], [2,4] for 8 devices), the fastest plan kept:
    # the search space then holds every baseline's layout (launcher/cfp/search/meshes.py).
    mesh_shape: Any = AUTO
    iterations: int = SearchOptions.iterations
    run_repeats: int = SearchOptions.run_repeats
    drop_after: int = SearchOptions.drop_after
    drop_slower_than: float = SearchOptions.drop_slower_than
    baselines: List[str] = field(default_factory=lambda: list(SearchOptions.baselines))
    verify_top_k: int = SearchOptions.verify_top_k
    verify_nearest: bool = SearchOptions.verify_nearest
    verify_iterations: int = SearchOptions.verify_iterations
    verify_repeats: int = SearchOptions.verify_repeats
    verify_margin: float = SearchOptions.verify_margin
    # cfp: CFP's profiling search. ilp: the Alpa-style ILP alone (launcher/cfp/ilp/, nothing
    # profiled); with cfp, mode.baselines may name alpa_ilp to race the ILP's plan beside CFP's.
    algorithm: str = "cfp"
    ilp_time_limit_s: float = IlpOptions.time_limit_s
    # pkg.module:make_step: search this factory's training step instead of the model (docs/autoshard.md).
    step: Optional[str] = None

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission: the profile's checks, the search's options (``SearchOptions``
        refuses bad values: baselines that are neither built-in plans nor alpa_ilp...), a
        known algorithm, and a ``mode.step`` that can be imported without options it overrides."""
        super().check(mode, job)
        search_options(mode)
        if mode.algorithm not in ("cfp", "ilp"):
            raise UserError(f"mode.algorithm={mode.algorithm!r}: choose cfp (CFP's profiling search) or ilp (the "
                            "Alpa-style ILP)")
        if mode.step:
            parse_target(mode.step, "mode.step")
            if mode.learning_rate != AnalysisConfig.learning_rate:
                raise UserError(f"mode.learning_rate={mode.learning_rate} sets the optimizer of the model's step; "
                                f"mode.step={mode.step} brings its own step and optimizer: leave "
                                "mode.learning_rate out")
            if job.same_python:
                check_target(mode.step, {}, Path.cwd(), "mode.step")


def search_options(cfg: Mapping[str, Any], seed: int = 0) -> SearchOptions:
    """The search's options (and in them the profile's) from the mode's config."""
    return SearchOptions.of(cfg, seed=seed)


def ilp_options(cfg: Mapping[str, Any]) -> IlpOptions:
    return IlpOptions.of(cfg, time_limit_s=cfg["ilp_time_limit_s"])


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
    from launcher.cfp.autoshard import load_step  # noqa: PLC0415  JAX: not at import, the mode schemas import this module

    ctx.log.info("searching the step of mode.step=%s (the model group is not used)", ctx.mode_cfg.step)
    return load_step(ctx.mode_cfg.step)


def _cfp(ctx: Any, options: SearchOptions, subject: Any) -> dict:
    """CFP's search: analyse and profile every mesh, the ILP's plan too where alpa_ilp races."""
    cfg = ctx.mode_cfg
    log = lambda line: ctx.log.info("%s", line)
    on = pipeline.analyze_meshes(subject, cfg.mesh_shape, learning_rate=cfg.learning_rate, log=log)
    for o in on:
        ctx.write_files(o.files())
    on = pipeline.profile_meshes(on, options.profile, is_main=ctx.is_main, log=log, progress=ctx.progress)
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
        # Imported here: it imports JAX, and the CLI imports this module for the mode's schema.
        from launcher.cfp.autoshard import AutoPlan  # noqa: PLC0415  JAX: the CLI imports this module

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
