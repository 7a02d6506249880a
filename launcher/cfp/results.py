"""What the CFP passes report: the fields of ``result.json`` for mode=profile and mode=search
(CFP's search, and the Alpa-style ILP of ``mode.algorithm=ilp``), from what ``pipeline.py``
returns. The modes add only what belongs to the run dir (the paths of their files) and their
wall time.

A search's top-level fields (``plan``, ``step_time_s``, ``vs_best_baseline``, ...) are the
searched plan's own, CFP's (or the ILP's under ``mode.algorithm=ilp``), whichever plan is the
answer; ``answer`` says which plan ``plan.json`` holds, why, and how it compares
(``answer_fields``; docs/cfp.md, "The answer").
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from launcher.cfp.options import ILP_BASELINE, ProfileOptions, SearchOptions
from launcher.cfp.pipeline import Answer, IlpSearched, OnMesh, Searched
from launcher.cfp.search.report import best_baseline

# Summed over the meshes of mode.mesh_shape=auto in mode=profile's result.
_SUMMED = ("profiled_configs", "measured_configs", "reused_configs", "profile_time_s", "over_budget_configs",
           "stopped_early_configs")


def mesh_fields(on: OnMesh) -> dict:
    """The fields of one mesh's analysis and profile."""
    analysis, profiles = on.analyzed.analysis, on.profiles
    return {**analysis.summary(), "mesh_shape": list(analysis.mesh_shape),
            "profiled_configs": profiles.profiled_configs, "measured_configs": profiles.measured,
            "reused_configs": profiles.reused, "profile_time_s": profiles.seconds,
            # Of the table (reused entries included): not timed, over the memory budget; and
            # timed only until the early stop (launcher/cfp/profile/candidates.py).
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
            "step_time_s": run.step_time_s, "memory_gb": run.memory_bytes / 2**30, "tflops": run.tflops,
            "losses": run.losses}


def race_fields(run: Any, baselines: Mapping[str, Any], skipped: Mapping[str, str], options: ProfileOptions,
                answer: Answer, ilp: Any = None) -> dict:
    """The fields of a plan's run (``search.measure.PlanRun``) beside the baselines' runs, as
    CFP's search and the ILP both report them, compared with the fastest baseline the answer
    names; ``ilp`` (raced as the ``alpa_ilp`` baseline) adds its own fields to that baseline's."""
    return {
        "step_time_s": run.step_time_s,
        "repeat_times_s": run.repeat_times_s,
        "memory_gb": run.memory_bytes / 2**30,
        "tflops": run.tflops,
        "flop_count": run.flops,
        "losses": run.losses,
        **best_baseline(run, baselines, answer.best_baseline),
        "memory_budget_gb": options.memory_budget_gb,
        "baselines": {name: {**r.summary(), **(ilp.summary() if ilp is not None and name == ILP_BASELINE else {})}
                      for name, r in baselines.items()},
        "baselines_skipped": dict(skipped),
    }


def search_fields(out: Searched, on: Sequence[OnMesh], options: SearchOptions, plan_file: str,
                  answer_file: str, ilp: Any = None) -> dict:
    """mode=search's fields (CFP's search): the analysis of the plan's mesh, each mesh's DP
    optimum, the plan kept (``plan_file``: CFP's own) and the shortlist it was kept from, its run
    beside the baselines, the answer (``answer_file``: plan.json) and the profiles' counts over
    every mesh."""
    analysis, picked, found = out.on.analyzed.analysis, out.picked, out.found
    profiles = [o.profiles for o in on]
    return {
        **analysis.summary(),
        "mesh_shape": list(analysis.mesh_shape),
        "meshes": out.meshes,
        "plan": {"assignment": picked.assignment, "mesh_shape": list(analysis.mesh_shape), "source": picked.source,
                 "file": plan_file},
        "search_optimum": {"assignment": found.assignment, "segment_combinations": [list(c) for c in found.combos]},
        "candidates": out.candidates,
        "predicted_step_time_s": picked.predicted_time_s,
        "predicted_memory_gb": picked.predicted_memory_bytes / 2**30,
        "profiled_configs": sum(p.profiled_configs for p in profiles),
        "measured_configs": sum(p.measured for p in profiles),
        "reused_configs": sum(p.reused for p in profiles),
        "search_time_s": sum(m.get("search_time_s", 0.0) for m in out.meshes),
        "profile_time_s": sum(p.seconds for p in profiles),
        **race_fields(out.searched, out.baselines, out.skipped, options.profile, out.answer, ilp),
        "answer": answer_fields(out.answer, answer_file, plan_file),
    }


def ilp_fields(planned: Any, out: IlpSearched, options: SearchOptions, plan_file: str, answer_file: str) -> dict:
    """mode=search mode.algorithm=ilp's fields: the analysis of the plan's mesh, the ILP's own
    (``ilp.plan.IlpPlanned.summary``), its plan's run (``plan_file``) beside the baselines, and
    the answer (``answer_file``: plan.json)."""
    return {
        **planned.analysis.summary(),
        "algorithm": "ilp",
        "plan": {"file": plan_file, "mesh_shape": planned.mesh_shape, "block_assignment": planned.block_assignment},
        **planned.summary(),
        **race_fields(out.run, out.baselines, out.skipped, options.profile, out.answer),
        "answer": answer_fields(out.answer, answer_file, plan_file),
    }
