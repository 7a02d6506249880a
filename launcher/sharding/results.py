"""What the passes report: the fields of ``result.json`` for mode=profile and mode=search
(any algorithm: CFP's search, the Alpa-style ILP of ``mode.algorithm=ilp``), from what
``pipeline.py`` returns. The modes add only what belongs to the run dir (the paths of their files) and their
wall time.

A search's top-level fields (``plan``, ``step_time_s``, ``vs_best_baseline``, ...) are the
searched plan's own, the algorithm's (CFP's, or the ILP's under ``mode.algorithm=ilp``), whichever plan is the
answer; ``answer`` says which plan ``plan.json`` holds, why, and how it compares
(``answer_fields``; docs/cfp.md, "The answer").
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

from launcher.sharding.algorithms.base import OnMesh
from launcher.sharding.options import ProfileOptions, SearchOptions
from launcher.sharding.pipeline import Answer, Searched
from launcher.sharding.predict.price import scores
from launcher.sharding.user.api import AutoPlan

# Summed over the meshes of mode.mesh_shape=auto in mode=profile's result.
_SUMMED = ("profiled_configs", "measured_configs", "reused_configs", "same_program_configs", "profile_time_s",
           "over_budget_configs", "stopped_early_configs")


def mesh_fields(on: OnMesh) -> dict:
    """The fields of one mesh's analysis and profile."""
    analysis, profiles = on.analyzed.analysis, on.profiles
    return {**analysis.summary(), "mesh_shape": list(analysis.mesh_shape),
            "profiled_configs": profiles.profiled_configs, "measured_configs": profiles.measured,
            "reused_configs": profiles.reused, "profile_time_s": profiles.seconds,
            # Of those reused: another mesh's entry of the same per-device program (profile/keys.py).
            "same_program_configs": profiles.same_program,
            # Of the table (reused entries included): not timed, over the memory budget; and
            # timed only until the early stop (launcher/sharding/profile/candidates.py).
            "over_budget_configs": profiles.over_budget_configs,
            "stopped_early_configs": profiles.stopped_early_configs,
            "units": len(profiles.units), "reshard_pairs": len(profiles.reshard)}


def profile_fields(on: Sequence[OnMesh]) -> dict:
    """mode=profile's fields: one mesh's, or with several a row per mesh and the counts summed."""
    if len(on) == 1:
        return mesh_fields(on[0])
    rows = [mesh_fields(o) for o in on]
    return {"meshes": rows, **{k: sum(row[k] for row in rows) for k in _SUMMED}}


def answer_fields(answer: Answer, plan_file: str, searched_plan_file: str) -> dict:
    """``answer``: the plan ``plan.json`` holds (``pipeline.Answer``): where it comes from
    (``source``: cfp, ilp or baseline; ``name``: its row in the comparison), why in plain words,
    its time over the fastest baseline's and the searched plan's (both paired, over the final
    race's rounds, the slowest process's times, as decided), and its own run's figures (its
    ``losses`` are what ``mode=train mode.plan=<plan_file>`` gives for as many steps)."""
    run = answer.run
    return {"source": answer.source, "name": answer.name, "plan_file": plan_file, "why": answer.why(),
            "best_baseline": answer.best_baseline, "vs_best_baseline_paired": answer.vs_best_baseline_paired,
            "searched": answer.searched, "searched_plan_file": searched_plan_file,
            "searched_vs_best_baseline_paired": answer.searched_vs_best_baseline_paired,
            "verify_margin": answer.margin, "rounds": answer.rounds,
            # The baseline whose own program the searched plan compiled to, raced once as it ("": none).
            "same_as": answer.same_as,
            # How far the race's noise alone moves that ratio, and whether the searched plan was ahead within it.
            "noise_floor": answer.comparison.verdict.noise, "tie": answer.comparison.verdict.tie,
            "step_time_s": run.step_time_s, "memory_gb": run.memory_bytes / 2**30, "tflops": run.tflops,
            "losses": run.losses}


def race_fields(out: Searched, options: ProfileOptions) -> dict:
    """The fields of the searched plan's run (``search.measure.PlanRun``) beside the baselines'
    runs, compared with the fastest baseline the answer names (``Answer.comparison``: the ratio
    of median step times, and paired); a baseline that is another algorithm's plan (alpa_ilp)
    adds that algorithm's own fields to its entry."""
    run, compared = out.searched, out.answer.comparison
    best = compared.best_baseline
    return {
        "step_time_s": run.step_time_s,
        "repeat_times_s": run.repeat_times_s,
        "memory_gb": run.memory_bytes / 2**30,
        "tflops": run.tflops,
        "flop_count": run.flops,
        "losses": run.losses,
        **({"best_baseline": best, "vs_best_baseline": compared.vs_best_baseline(compared.searched),
            "vs_best_baseline_paired": compared.searched_vs_best_baseline_paired} if best is not None else {}),
        "memory_budget_gb": options.memory_budget_gb,
        "baselines": {name: {**r.summary(), **(out.others[name].baseline_fields if name in out.others else {}),
                             **_error(r.step_time_s, out.others[name].predicted_step_time_s if name in out.others
                                      else None), **_modelled(out, name, r.step_time_s)}
                      for name, r in out.baselines.items()},
        # The searched plan's measured step time over its prediction, less 1 (the model's error).
        **_error(run.step_time_s, getattr(out.planned, "predicted_step_time_s", None)),
        **_modelled(out, run.name, run.step_time_s),
        **({"model": model_fields(out)} if out.priced else {}),
        "baselines_skipped": dict(out.skipped),
    }


def _modelled(out: Searched, name: str, measured_s: float) -> dict:
    """A raced plan's step as the one model of a step predicts it (``price.Priced.against``)."""
    p = out.priced.get(name)
    return p.against(measured_s) if p is not None else {}


def model_fields(out: Searched) -> dict:
    """The model against the race: every plan it priced, the link model it priced them on, and
    its scores over the distinct programs raced (``scored``; ``price.scores``: Kendall's tau of
    the orders, the measured time of the plan it predicted fastest over the fastest, the mean
    absolute error)."""
    measured = {out.searched.name: out.searched.step_time_s, **{n: r.step_time_s for n, r in out.baselines.items()}}
    names = [n for n in measured if n in out.priced]
    # The searched plan compiled to a baseline's program was raced once, as that baseline: one
    # program, scored once (its row keeps its figures).
    scored = [n for n in names if not (n == out.searched.name and out.answer.same_as)]
    return {"links": out.links, "plans": {n: out.priced[n].to_json() for n in names}, "scored": scored,
            **(scores([out.priced[n].step_s for n in scored], [measured[n] for n in scored]) if scored else {})}


def _error(measured_s: float, predicted_s: Optional[float]) -> dict:
    """``prediction_error``: measured over predicted, less 1 (+0.1: it ran 10% slower than predicted)."""
    return {"prediction_error": measured_s / predicted_s - 1} if predicted_s else {}


def search_fields(out: Searched, options: SearchOptions, plan_file: str, answer_file: str) -> dict:
    """mode=search's fields: the analysis of the plan's mesh, the algorithm's own (``Planned.fields``:
    CFP's DP optimum per mesh, its shortlist and profile counts; the ILP's solve), the plan
    (``plan_file``: the algorithm's own), its run beside the baselines, and the answer
    (``answer_file``: plan.json)."""
    planned = out.planned
    analysis = planned.on.analyzed.analysis
    fields = dict(planned.fields)
    fields["plan"] = {**fields.get("plan", {}), "file": plan_file}
    return {
        **analysis.summary(),
        "mesh_shape": list(analysis.mesh_shape),
        **fields,
        **race_fields(out, options.profile),
        "drop_slower_than": options.drop_slower_than,
        "answer": answer_fields(out.answer, answer_file, plan_file),
        # A user's step raced with its own layout: the answer's time over it, paired.
        **({"vs_user_paired": user} if (user := out.answer.comparison.vs_user_paired) is not None else {}),
    }


def plan_files(out: Searched) -> dict[str, str]:
    """The plans a search writes, by file name: ``plan.json`` (the answer) and
    ``<searched>_plan.json`` (the searched plan's own), each as its users load it: a user's step's
    as ``AutoPlan``s (``AutoPlan.load``; what ``autoshard`` hands back), a built-in model's as
    ``models.plans.Plan``s (``mode=train mode.plan=``)."""
    program, answer = out.planned.on.analyzed.program, out.answer
    own = f"{answer.searched}_plan.json"
    if program.is_model:
        return {own: out.plan.to_json(), "plan.json": answer.plan.to_json()}
    searched = AutoPlan.searched_by(program, out)
    return {own: _json(searched.to_json()), "plan.json": _json(searched.answered(program, answer).to_json())}


def _json(data: dict) -> str:
    return json.dumps(data, indent=1, default=float) + "\n"
