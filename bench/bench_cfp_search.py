"""CFP profile + search against the built-in plans, per tiny model, on 8 virtual CPU devices.

    python bench/bench_cfp_search.py [--models gpt bert llama2 moe cfp-gpt cfp-llama cfp-moe] [--iterations 10]
                                     [--repeats 14] [--uniform 3]

For each model (conf/model/<name>-tiny.yaml) in its own process with 8 virtual devices:
analysis on a 4x2 mesh (``--mesh``; on it every baseline's layout is one of CFP's plans: data
parallel splits the batch over both axes, dp_tp splits it over one and the heads or columns over
the other, tp splits heads and columns over both; a 1-D mesh of 8 cannot express dp_tp), profile
(store: --store, reused across runs), search (the DP optimum, the plans nearest each built-in
plan and the rest of its shortlist of ``--top-k`` plans measured briefly on the whole step, as
mode=search does), then the searched plan, the DP's own optimum (when the shortlist chose
another) and every built-in plan that fits (dp, tp, fsdp, dp_tp, ep) trained side by side
(``--repeats`` interleaved rounds of ``--iterations`` steps). Reported per model:

- searched step time over the best baseline's (goal: never above 1.02, below 1.0 where mixed
  plans pay), with where the searched plan came from (``source``), and the same ratio for the
  DP's optimum alone: *paired* (the median over rounds of the ratio within each round, which
  cancels the machine's drift between rounds) and as the ratio of the median rounds;
- profiled configurations over the exhaustive space;
- profile and search wall time;
- predicted over measured step time of the searched plan, and of the DP's optimum (goal:
  within 10%);
- mixed against uniform plans. Uniform plans keep one strategy throughout: the built-in plans
  (the baselines; in CFP's space, the plans nearest them) and "every block on plan j", of which
  the ``--uniform`` the profiles rank fastest race in the same rounds. A plan that is none of
  these is mixed. Reported: the searched plan and the DP's optimum over the best uniform plan
  raced (paired), whether each is mixed, whether a mixed plan beats every uniform one beyond
  the A/A floor below, and what the profiles expected (the DP optimum's predicted step time over
  the best uniform plan's: where they expect no gain beyond the floor, none can be measured);
- the noise floor: the searched plan compiled and raced a second time in the same rounds, its
  step time over the first's (an A/A test: any ratio above is only as exact as this one); the
  predicted step time over that second measurement too.

Results go to bench/results/bench_cfp_search.json. Timings on a shared 2-core machine are
noisy; the file records every repeat so the spread can be judged.

    python bench/bench_cfp_search.py --shortcuts [--models ...] [--mesh 8] [--max-segment-space 27]
                                     [--profile-repeats 10] [--early-stop-ratio 1.5]

profiles instead each model with and without CFP's profiling shortcuts
(``launcher/sharding/profile/candidates.py``), each profile in a process of its own on a fresh store
(nothing reused, no compilation cached in the process): *none* (every combination timed in
full); *none again* (the same a second time: how far two full profiles differ on this machine,
the floor every other comparison sits on); *early stop* (``--early-stop-ratio``, mode=profile's
default 1.5, no budget: what mode=search does by default); *early stop + budget* (and a memory
budget halfway between the least memory a plan needs and the most a plan holding some
candidate needs at least, so that some candidates cannot be held). Reported per profile: the
profile pass's time, its candidate loop's (what the shortcuts act on) and, of that, the time
not spent compiling (timing the candidates: all the shortcuts can save), candidates timed in full / not timed (over the budget) / stopped early, and whether the DP
optimum (under the same budget) is the full profile's; where not, the shortcut optimum's
predicted time under the full profile over the full profile's optimum's (how much worse, by the
full profile's own measure). Also, against the full profile: stopped candidates whose full time
there is under the ratio times their segment's best (stops the full profile disagrees with),
and the median deviation between the two profiles' times of candidates both timed in full.
Results go to bench/results/bench_cfp_search_shortcuts.json.

    python bench/bench_cfp_search.py --users [--models ...] [--runs 1] [--nearest dp_tp ep]
                                     [--store DIR] [--set mode.iterations=2 cluster.tasks_per_node=2 ...]

runs instead the search as users get it: ``mode=cfp``'s defaults (``conf/mode/cfp.yaml``: the
auto mesh, its shortlist, the 20-round final race) on the embedded default job (2 processes of 4
CPU devices joined by gloo), ``alpa_ilp`` added to ``mode.baselines`` so that the Alpa-style
ILP's plan races in the same rounds. Each model runs as a ``mode=run`` job whose function
(``users_worker``) makes the calls ``mode=cfp`` makes (``launcher/modes/runs/search.py``), with three
more plans raced in the same final rounds, never dropped and never the answer: CFP's plan
compiled a second time (the A/A floor) and the plans nearest ``--nearest`` (where each is not the
plan kept: is the nearest plan as fast as the baseline it is nearest?). The profile store is one
fresh directory for the whole bench (``--store`` to reuse one): each model's first run profiles
from empty, later runs (``--runs``) reuse it, and the ILP's calibration is measured once.
``--set`` overrides the composed config (``mode.``/``model.`` keys) or the job (any other key).
Reported per run, every ratio paired over the final race's rounds (the slowest process's times,
as the job decides): CFP's own plan over the best baseline (the fastest of the built-in plans and
the ILP's, round by round) and over the best built-in plan, the answer (``plan.json``) over the
best baseline, the ILP's plan over the best built-in plan, the A/A floor, whether CFP's plan is
behind the best baseline beyond the floor and, where it is, what the same rounds measured of why
(``diagnosis``: the plan kept, the plan nearest that baseline against it, the shortlist's duel);
the job's wall time and its profile, calibration and race times. Results go to
bench/results/bench_cfp_search_users.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = str(REPO / "bench" / "results" / "bench_cfp_search.json")
DEFAULT_STORE = str(REPO / "outputs" / "cfp_profiles")


def worker(name: str, mesh_shape: list[int], iterations: int, repeats: int, store: str, profile_repeats: int,
           top_k: int, uniform_k: int = 3) -> dict:
    import jax

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    from bench_cfp_analysis import tiny_model

    from launcher.sharding import pipeline

    from launcher.sharding.algorithms.cfp import profile as cfp_profile
    from launcher.sharding.algorithms.cfp import CfpOptions, choose
    from launcher.sharding.algorithms.base import OnMesh
    from launcher.sharding.comparison import compare
    from launcher.sharding.options import ProfileOptions, SearchOptions
    from launcher.sharding.measuring.quiet import counts
    from launcher.sharding.search.dp import predict, search
    from launcher.sharding.search.measure import baseline_runners, plan_runner
    from launcher.sharding.search.race import race

    model = tiny_model(name)
    log = lambda line: print(f"[{name}] {line}", file=sys.stderr, flush=True)
    analyzed = pipeline.analyze(model, mesh_shape=mesh_shape)
    a, program, analysis_s = analyzed.analysis, analyzed.program, analyzed.seconds
    mesh = pipeline.make_mesh(a.mesh_shape)
    # Every candidate timed in full (no early stop): the shortlist is judged on full profiles.
    prof = cfp_profile.profile(analyzed, mesh, ProfileOptions(store_dir=store, repeats=profile_repeats, warmup=1,
                                                           overlap_compile=False, early_stop_ratio=0.0),
                            log=log).profiles
    found = search(prof, len(a.blocks))
    # The shortlist measured as mode=search measures it (its verify_* defaults).
    chosen, candidates, nearest = choose([OnMesh(analyzed, mesh, prof)], [found], SearchOptions(),
                                         CfpOptions(verify_top_k=top_k), name="cfp")
    picked = chosen.candidate
    log(f"search optimum {found.assignment}; searched ParallelBlock Strategies solution: {picked.assignment} "
        f"({picked.source})")
    runners, skipped = baseline_runners(program, jax.devices(), seed=0, log=log, names=pipeline.BASELINES)
    runners.insert(0, chosen)
    # The searched plan once more, compiled afresh: how far one measurement of the same plan moves
    # from another in the same rounds (the noise floor every ratio here sits on).
    runners.insert(1, plan_runner(a, program, dict(enumerate(picked.assignment)), mesh, name="searched again"))
    # The DP's own optimum runs in the same rounds, so the search is judged without the shortlist.
    if picked.source != "search optimum":
        runners.insert(2, plan_runner(a, program, dict(enumerate(found.assignment)), mesh, name="search optimum"))
    # Uniform plans, one strategy throughout: the built-in plans (raced below as the baselines;
    # their nearest plans in CFP's space are ``nearest``) and "every block on plan j", of which the
    # ``uniform_k`` the profiles rank fastest race in the same rounds. A plan that is none of
    # these is mixed: does one beat every uniform plan beyond the A/A floor?
    plan_counts = [b.num_plans for b in a.blocks]
    uniform = {j: [min(j, n - 1) for n in plan_counts] for j in range(max(plan_counts))}
    fastest = sorted(uniform, key=lambda j: predict(prof, uniform[j])[0])[:uniform_k]
    for j in fastest:
        if uniform[j] != picked.assignment:
            runners.append(plan_runner(a, program, dict(enumerate(uniform[j])), mesh, name=f"uniform {j}"))
    uniform_plans = {**{f"uniform {j}": uniform[j] for j in uniform},
                     **{f"nearest {k}": list(plan) for k, (_, plan) in nearest.items()}}
    is_mixed = lambda assignment: list(assignment) not in uniform_plans.values()
    searched, *others = race(runners, iterations=iterations, repeats=repeats)
    runs = {r.name: r for r in others}
    again = runs.pop("searched again")
    optimum = runs.pop("search optimum", searched)
    uniform_runs = {k: runs.pop(k) for k in [k for k in runs if k.startswith("uniform ")]}
    if picked.assignment in uniform.values():
        uniform_runs[f"uniform {next(j for j, u in uniform.items() if u == picked.assignment)}"] = searched
    contenders = {**runs, **uniform_runs}   # every uniform plan raced: the baselines and "uniform j"
    best_uniform = min(contenders, key=lambda k: paired(contenders[k], searched))
    floor = abs(paired(again, searched) - 1)
    # What the profiles expected from mixing: the DP optimum's predicted step over the best
    # uniform plan's (each built-in plan by its nearest plan), the search's own measure.
    predicted_uniform = {k: predict(prof, plan)[0] for k, plan in uniform_plans.items()}
    best_predicted_uniform = min(predicted_uniform, key=predicted_uniform.get)
    # The fastest baseline as the search's own answer names it (round by round), read once.
    compared = compare({searched.name: searched.repeat_times_s, **{k: r.repeat_times_s for k, r in runs.items()}},
                       searched.name)
    best_name = compared.best_baseline
    best = runs[best_name].step_time_s
    return {
        "model": f"{name}-tiny",
        "mesh_shape": mesh_shape,
        "blocks": len(a.blocks),
        "templates": [t.plan_counts for t in a.templates],
        "exhaustive_space": a.exhaustive_space,
        "segment_space": a.segment_space,
        "profiled_configs": prof.profiled_configs,
        "profiled_over_exhaustive": prof.profiled_configs / a.exhaustive_space,
        "analysis_time_s": analysis_s,
        "profile_time_s": prof.seconds,
        "measured_configs": prof.measured,
        "search_time_s": found.search_time_s,
        "assignment": picked.assignment,
        "source": picked.source,
        "search_optimum": found.assignment,
        "nearest": nearest,
        "candidates": candidates,
        "predicted_step_time_s": picked.predicted_time_s,
        "step_time_s": searched.step_time_s,
        "repeat_times_s": searched.repeat_times_s,
        "predicted_over_measured": picked.predicted_time_s / searched.step_time_s,
        "searched_again_step_time_s": again.step_time_s,
        "searched_again_repeat_times_s": again.repeat_times_s,
        "searched_again_over_searched": again.step_time_s / searched.step_time_s,
        "searched_again_over_searched_paired": paired(again, searched),
        "predicted_over_measured_again": picked.predicted_time_s / again.step_time_s,
        "memory_gb": searched.memory_bytes / 2**30,
        "baselines": {k: r.summary() for k, r in runs.items()},
        "baselines_skipped": skipped,
        "best_baseline": best_name,
        "searched_over_best_baseline": compared.vs_best_baseline(searched.name),
        "searched_over_best_baseline_paired": compared.searched_vs_best_baseline_paired,
        "search_optimum_step_time_s": optimum.step_time_s,
        "search_optimum_over_best_baseline": optimum.step_time_s / best,
        "search_optimum_over_best_baseline_paired": paired(optimum, runs[best_name]),
        "search_optimum_predicted_over_measured": found.predicted_time_s / optimum.step_time_s,
        "timings_retaken": counts,   # measurements the hypervisor interrupted, taken again (quiet.py)
        "mixed_plan": is_mixed(picked.assignment),
        "search_optimum_mixed": is_mixed(found.assignment),
        "uniform_plans_raced": sorted(contenders),
        "best_uniform": best_uniform,
        "searched_over_best_uniform_paired": paired(searched, contenders[best_uniform]),
        "search_optimum_over_best_uniform_paired": paired(optimum, contenders[best_uniform]),
        "aa_floor": floor,
        "mixed_beats_every_uniform_beyond_floor": (is_mixed(picked.assignment) and
                                                   paired(searched, contenders[best_uniform]) < 1 - floor),
        "predicted_uniform_step_time_s": predicted_uniform,
        "best_predicted_uniform": best_predicted_uniform,
        "predicted_optimum_over_best_uniform": found.predicted_time_s / predicted_uniform[best_predicted_uniform],
    }


def shortcut_worker(name: str, mesh_shape: list[int], store: str, profile_repeats: int, early_stop_ratio: float,
                    budget_gb: float, reference: str, max_space: int) -> dict:
    """One profile of ``name`` on a fresh ``store`` with the given shortcuts, its DP optimum, and
    (with ``reference``, a store the full profile filled) the comparison with the full profile."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    from bench_cfp_analysis import tiny_model

    from launcher.sharding import pipeline

    from launcher.sharding.algorithms.cfp import profile as cfp_profile
    from launcher.sharding.options import ProfileOptions
    from launcher.sharding.search.dp import predict, search

    log = lambda line: print(f"[{name}] {line}", file=sys.stderr, flush=True)
    analyzed = pipeline.analyze(tiny_model(name), mesh_shape=mesh_shape)
    a = analyzed.analysis
    mesh = pipeline.make_mesh(a.mesh_shape)
    prof = cfp_profile.profile(analyzed, mesh, ProfileOptions(store_dir=store, repeats=profile_repeats, warmup=1,
                                                           overlap_compile=False, max_segment_space=max_space,
                                                           memory_budget_gb=budget_gb,
                                                           early_stop_ratio=early_stop_ratio), log=log).profiles
    budget = budget_gb * 2**30 if budget_gb > 0 else None
    found = search(prof, len(a.blocks), budget)
    entries = {(k, c): e for k, combos in prof.table.items() for c, e in combos.items()}
    mems = {k: [e["mem_bytes"] for e in combos.values()] for k, combos in prof.table.items()}
    least_plan = sum(min(mems[u.kind]) for u in prof.units)
    row = {"model": f"{name}-tiny", "mesh_shape": mesh_shape, "early_stop_ratio": early_stop_ratio,
           "memory_budget_gb": budget_gb, "profile_repeats": profile_repeats, "max_segment_space": max_space,
           "candidates": len(entries), "measured": prof.measured, "timed_in_full": prof.measured - prof.skipped - prof.stopped,
           "over_budget": prof.skipped, "stopped_early": prof.stopped,
           "profile_time_s": prof.seconds, "candidate_loop_s": prof.candidates_s,
           "compile_s": sum(e["compile_s"] for e in entries.values()),
           # the candidate loop less its compilations: timing (and memory analysis, store writes)
           "timing_s": prof.candidates_s - sum(e["compile_s"] for e in entries.values()),
           "search_optimum": found.assignment, "predicted_step_time_s": found.predicted_time_s,
           "predicted_memory_gb": found.predicted_memory_bytes / 2**30,
           # The least memory a plan needs, and the most a plan holding some candidate needs at
           # least (that candidate's memory, with the least of every other unit): the bench's
           # budget lies halfway, where a plan holding that candidate no longer fits.
           "least_plan_memory_bytes": least_plan,
           "largest_plan_floor_bytes": least_plan + max(max(m) - min(m) for m in mems.values())}
    if reference:
        ref = cfp_profile.profile(analyzed, mesh, ProfileOptions(store_dir=reference, repeats=profile_repeats, warmup=1,
                                                              overlap_compile=False, max_segment_space=max_space,
                                                              early_stop_ratio=0.0)).profiles
        assert ref.measured == 0, "the reference store lacks entries"
        ref_found = search(ref, len(a.blocks), budget)
        best = {k: min(e["time_s"] for e in combos.values()) for k, combos in ref.table.items()}
        stopped = [(k, c) for (k, c), e in entries.items() if e.get("stopped_early")]
        both = [e["time_s"] / ref.table[k][c]["time_s"] for (k, c), e in entries.items()
                if not e.get("stopped_early") and not e.get("over_budget")]
        row.update({
            "full_profile_optimum": ref_found.assignment,
            "same_optimum": found.assignment == ref_found.assignment,
            # the shortcut optimum judged by the full profile, over the full profile's own optimum
            "optimum_under_full_profile_ratio": predict(ref, found.assignment)[0] / ref_found.predicted_time_s,
            # stops the full profile disagrees with: full time under ratio x the segment's full best
            "stops_under_ratio_in_full_profile": sum(ref.table[k][c]["time_s"] < early_stop_ratio * best[k]
                                                      for k, c in stopped),
            "stopped_full_time_over_best": sorted(round(ref.table[k][c]["time_s"] / best[k], 3) for k, c in stopped),
            "stopped_bound_over_full_time": sorted(round(entries[(k, c)]["time_s"] / ref.table[k][c]["time_s"], 3)
                                                   for k, c in stopped),
            "timed_in_both_abs_deviation_median": statistics.median(abs(r - 1) for r in both) if both else None,
        })
    return row


def shortcut_bench(args: argparse.Namespace) -> None:
    """Per model: the full profile, then the shortcut profiles compared with it (module doc)."""
    import shutil
    import tempfile

    rows = []
    root = Path(tempfile.mkdtemp(prefix="bench-cfp-shortcuts-"))
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}"}

    def run(name: str, variant: str, store: Path, ratio: float, budget_gb: float, reference: Path | None) -> dict:
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--shortcut-worker", name, "--mesh", *map(str, args.mesh),
                               "--profile-repeats", str(args.profile_repeats), "--store", str(store),
                               "--max-segment-space", str(args.max_segment_space),
                               "--early-stop-ratio", str(ratio), "--budget-gb", repr(budget_gb),
                               "--reference", str(reference or "")], env=env, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name} ({variant}): worker failed ({proc.returncode})")
        row = {"variant": variant, **json.loads(proc.stdout.strip().splitlines()[-1]),
               "wall_s": time.perf_counter() - t}
        same = "" if reference is None else (
            f"; DP optimum {'the same as' if row['same_optimum'] else 'differs from'} the full profile's "
            f"(x{row['optimum_under_full_profile_ratio']:.3f} by its measure), stops the full profile disagrees "
            f"with {row['stops_under_ratio_in_full_profile']}/{row['stopped_early']}")
        print(f"{row['model']:>12} {variant:>20}: profile {row['profile_time_s']:.0f} s (candidate loop "
              f"{row['candidate_loop_s']:.0f} s, {row['timing_s']:.1f} s of it not compiling), {row['candidates']} "
              f"candidates: {row['timed_in_full']} timed in full, "
              f"{row['over_budget']} over budget, {row['stopped_early']} stopped early{same}", flush=True)
        rows.append(row)
        return row

    try:
        for name in args.models:
            full = root / name / "none"
            base = run(name, "none", full, 0.0, 0.0, None)
            # A second full profile: how far two profiles without shortcuts differ on this machine
            # (their optima included), the floor every comparison below sits on.
            run(name, "none again", root / name / "none-again", 0.0, 0.0, full)
            run(name, "early stop", root / name / "early-stop", args.early_stop_ratio, 0.0, full)
            least, largest = base["least_plan_memory_bytes"], base["largest_plan_floor_bytes"]
            if largest > least:
                run(name, "early stop + budget", root / name / "budget", args.early_stop_ratio,
                    (least + largest) / 2 / 2**30, full)
            else:
                print(f"{name}: every plan needs the same memory: no budget to try", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = Path(args.out if args.out != DEFAULT_OUT else REPO / "bench" / "results" / "bench_cfp_search_shortcuts.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = shortcut_summary(rows)
    out.write_text(json.dumps({"machine": platform.platform(), "devices": args.devices, "mesh_shape": args.mesh,
                               "profile_repeats": args.profile_repeats, "early_stop_ratio": args.early_stop_ratio,
                               "max_segment_space": args.max_segment_space,
                               "summary": summary, "profiles": rows}, indent=2) + "\n")
    print(f"wrote {out}")


def shortcut_summary(rows: list[dict]) -> dict:
    """Per shortcut variant and model, against the full profile: profile time, candidate loop
    time and its time not compiling (each as a ratio), and whether the DP optimum is the same."""
    summary = {}
    for variant in ("none again", "early stop", "early stop + budget"):
        pairs = [(r, next(b for b in rows if b["model"] == r["model"] and b["variant"] == "none"))
                 for r in rows if r["variant"] == variant]
        if pairs:
            summary[variant] = {
                key + "_over_none": {r["model"]: round(r[key] / b[key], 3) for r, b in pairs}
                for key in ("profile_time_s", "candidate_loop_s", "timing_s")}
            summary[variant]["same_optimum"] = {r["model"]: r["same_optimum"] for r, _ in pairs}
            summary[variant]["optimum_under_full_profile_ratio"] = {
                r["model"]: round(r["optimum_under_full_profile_ratio"], 3) for r, _ in pairs}
    return summary


def paired(run: Any, other: Any) -> float:
    """``run``'s round time over ``other``'s, paired (``launcher/sharding/comparison.py``'s one
    ratio): the machine's speed moves between rounds (README, Benchmarks), and a ratio within a
    round cancels it."""
    from launcher.sharding.comparison import paired_over

    return paired_over(run.repeat_times_s, other.repeat_times_s)


def users_worker(spec: str) -> dict:
    """``mode=run``'s function on every process of the job (``--users``): the search as
    ``mode=cfp`` runs it (``launcher/modes/runs/search.py: _cfp``) with the mode and model config in
    the file ``spec`` (the driver composed it), and the A/A and nearest plans raced beside it."""
    import launcher
    from hydra.utils import instantiate

    from launcher.sharding import pipeline
    from launcher.sharding.algorithms.base import Algorithm, Hooks
    from launcher.sharding.comparison import compare, paired_over
    from launcher.sharding.search.measure import plan_runner
    from launcher.modes.search import algorithm_of

    ctx = launcher.context()
    s = json.loads(Path(spec).read_text())
    cfg = s["mode"]
    algorithm = algorithm_of(cfg, seed=s["seed"])
    options = algorithm.options
    log = lambda line: print(line, flush=True)   # the rank's log
    marks = {"start": time.perf_counter()}

    def write(files: dict) -> None:   # the orchestration's files as it makes them: the profile's end
        if any(name.endswith("profiles.json") for name in files):
            marks["profiled"] = time.perf_counter()

    def also(planned: Any, on: Any) -> list:   # called as the race begins
        marks["planned"] = time.perf_counter()
        by_shape = {tuple(o.shape): o for o in on}
        where, cfp = planned.on, planned.details
        kept = (tuple(where.shape), list(cfp.picked.assignment))
        runners = [plan_runner(where.analyzed.analysis, where.analyzed.program, dict(enumerate(kept[1])), where.mesh,
                               seed=options.seed, name="cfp again")]
        for name in s["nearest"]:
            if name in cfp.nearest and (tuple(cfp.nearest[name][0]), list(cfp.nearest[name][1])) != kept:
                o = by_shape[tuple(cfp.nearest[name][0])]
                runners.append(plan_runner(o.analyzed.analysis, o.analyzed.program,
                                           dict(enumerate(cfp.nearest[name][1])), o.mesh, seed=options.seed,
                                           name=f"nearest {name}"))
        return runners

    out = pipeline.run_search(instantiate(s["model"], _convert_="all"), algorithm, mesh_shape=cfg["mesh_shape"],
                              learning_rate=cfg["learning_rate"], hooks=Hooks(log=log, write=write, is_main=ctx.is_main),
                              also=also)
    ilp_row = Algorithm.named("ilp").row
    cfp_searched, ilp_planned = out.planned.details, out.others.get(ilp_row)
    ilp = ilp_planned.details if ilp_planned is not None else None
    t0, t_profiled = marks["start"], marks.get("profiled", marks["start"])
    t_ilp = marks.get("planned", t_profiled)   # the DP, the shortlist measured and the ILP's plan
    t_end = time.perf_counter()
    answer, cfp, runs, extra = out.answer, out.searched, out.baselines, out.also
    n = len(cfp.repeat_times_s)
    full = {k: r for k, r in runs.items() if len(r.repeat_times_s) == n}   # the race dropped none of these
    builtin = {k: r for k, r in full.items() if k != ilp_row}
    best_builtin = None
    if builtin:   # as the answer names the fastest baseline, among the built-in plans alone
        best_builtin = compare({cfp.name: cfp.repeat_times_s, **{k: r.repeat_times_s for k, r in builtin.items()}},
                               cfp.name).best_baseline
    pair = lambda a, b: paired_over(a.repeat_times_s, b.repeat_times_s)
    floor = abs(pair(extra["cfp again"], cfp) - 1)
    best = answer.best_baseline
    behind = best is not None and answer.searched_vs_best_baseline_paired > 1 + floor
    picked, where = cfp_searched.picked, out.planned.mesh_shape
    kept = {"mesh_shape": where, "assignment": picked.assignment, "source": picked.source,
            "nearest_of": [k for k, (shape, plan) in cfp_searched.nearest.items()
                           if list(shape) == where and list(plan) == list(picked.assignment)]}
    nearest = {}
    for name in s["nearest"]:
        run = extra.get(f"nearest {name}", cfp if name in kept["nearest_of"] else None)
        if run is not None and name in full:
            nearest[name] = {"is_kept_plan": run is cfp, "over_baseline_paired": pair(run, full[name]),
                             "over_cfp_paired": pair(run, cfp)}
    row = {
        "mode_wall_s": t_end - t0, "profile_s": t_profiled - t0, "ilp_s": t_ilp - t_profiled,
        "search_and_race_s": t_end - t_ilp, "rounds": n,
        "profiled_configs": out.planned.fields["profiled_configs"],
        "measured_configs": out.planned.fields["measured_configs"],
        "kept": kept, "candidates": cfp_searched.candidates,
        "answer": {"name": answer.name, "source": answer.source, "why": answer.why()},
        "best_baseline": best, "best_builtin": best_builtin,
        "cfp_over_best_paired": answer.searched_vs_best_baseline_paired,
        "answer_over_best_paired": answer.vs_best_baseline_paired,
        "cfp_over_best_builtin_paired": pair(cfp, builtin[best_builtin]) if best_builtin else None,
        "ilp_over_best_builtin_paired": (pair(runs[ilp_row], builtin[best_builtin])
                                         if ilp_row in full and best_builtin else None),
        "ilp_over_cfp_paired": pair(runs[ilp_row], cfp) if ilp_row in full else None,
        "ilp": ({"mesh_shape": ilp.mesh_shape, "cfp_blocks": ilp.block_assignment is not None,
                 "calibration_time_s": ilp.calibration_time_s} if ilp is not None else None),
        "aa_floor": floor, "cfp_behind_best_beyond_floor": behind,
        "nearest": nearest,
        "step_time_s": {"cfp": cfp.step_time_s, **{k: r.step_time_s for k, r in {**runs, **extra}.items()}},
        "repeat_times_s": {"cfp": cfp.repeat_times_s, **{k: r.repeat_times_s for k, r in {**runs, **extra}.items()}},
        "baselines_skipped": out.skipped,
    }
    row["diagnosis"] = diagnosis(row) if behind else ""
    return row


def diagnosis(row: dict) -> str:
    """Why CFP's plan is behind the best baseline, from what the same rounds measured."""
    best, kept, floor = row["best_baseline"], row["kept"], row["aa_floor"]
    lead = (f"CFP's plan ({kept['source']} on mesh {kept['mesh_shape']}) ran {row['cfp_over_best_paired']:.3f}x "
            f"{best}, beyond the A/A floor {floor:.3f}: ")
    if best == "alpa_ilp":
        return lead + (f"the ILP's plan (mesh {row['ilp']['mesh_shape']}, "
                       + ("a CFP block assignment: CFP's space holds it, its search did not keep it)"
                          if row["ilp"]["cfp_blocks"] else "per contraction: a plan outside CFP's space)"))
    near = row["nearest"].get(best)
    if near is None:
        return lead + f"no plan nearest {best} was raced (--nearest) or CFP's space has none"
    if near["is_kept_plan"]:
        return lead + (f"the plan kept is the one nearest {best}: nearest to it is not its program "
                       f"(compare their after_ir; search/nearest.py)")
    if near["over_baseline_paired"] > 1 + floor:
        return lead + (f"the plan nearest {best} ran {near['over_baseline_paired']:.3f}x it too: nearest to it is "
                       f"not its program (search/nearest.py)")
    duel = [c for c in row["candidates"] if c.get("duel_over_incumbent_paired") is not None and not c["incumbent"]]
    return lead + (f"the plan nearest {best} ran {near['over_baseline_paired']:.3f}x it (within the floor) but another "
                   f"was kept: " + (f"{duel[0]['source']} won the shortlist's duel at "
                                    f"{duel[0]['duel_over_incumbent_paired']:.3f}x it" if duel else
                                    "the shortlist's short race ranked it first") + ", which the final race did not "
                   "bear out")


def compose_job(overrides: list[str]) -> Any:
    """The job's config as ``python -m launcher <overrides>`` composes it (typed by its schemas)."""
    from hydra import compose, initialize_config_dir

    from launcher.cli import schema

    schema.register()
    with initialize_config_dir(config_dir=str(schema.CONF_DIR), version_base="1.3"):
        return schema.typed(compose("config", overrides=overrides))


def users_bench(args: argparse.Namespace) -> None:
    """Per model and run: a ``mode=run`` job of ``users_worker`` (module doc)."""
    import shutil
    import tempfile

    from omegaconf import OmegaConf

    sys.path.insert(0, str(REPO))
    job = [o for o in args.set if not o.startswith(("mode.", "model."))]
    composed = [o for o in args.set if o.startswith(("mode.", "model."))]
    work = Path(tempfile.mkdtemp(prefix="bench-cfp-users-"))
    fresh = args.store == DEFAULT_STORE
    store = work / "store" if fresh else Path(args.store)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = Path(args.out if args.out != DEFAULT_OUT else REPO / "bench" / "results" / "bench_cfp_search_users.json")
    rows: list[dict] = []
    try:
        for name in args.models:
            cfg = compose_job(["mode=cfp", f"model={name}-tiny", f"mode.store_dir={store}", *composed])
            mode = OmegaConf.to_container(cfg.mode, resolve=True)
            if "alpa_ilp" not in mode["baselines"] and not args.no_ilp:
                mode["baselines"].append("alpa_ilp")
            spec = work / f"{name}.json"
            spec.write_text(json.dumps({"mode": mode, "model": OmegaConf.to_container(cfg.model, resolve=True),
                                        "seed": cfg.seed, "nearest": args.nearest}))
            for i in range(args.runs):
                run_dir = work / f"{name}-{i}"
                load = os.getloadavg()[0]
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "launcher", "mode=run",
                                       "mode.target=bench_cfp_search:users_worker", f"mode.code_dir={REPO / 'bench'}",
                                       f"mode.kwargs.spec={spec}", f"hydra.run.dir={run_dir}", *job],
                                      cwd=REPO, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"{name} run {i}: the job failed ({proc.returncode}); its run dir: {run_dir}\n"
                                     + proc.stderr[-3000:])
                result = json.loads((run_dir / "result.json").read_text())
                row = {"model": f"{name}-tiny", "run": i, "wall_s": time.perf_counter() - t, "load_before": load,
                       "num_processes": result["num_processes"], "global_devices": result["global_devices"],
                       **result["returned"]}
                rows.append(row)
                ilp = row["ilp_over_best_builtin_paired"]
                print(f"{row['model']:>14} run {i}: CFP's plan ({row['kept']['source']}, mesh "
                      f"{row['kept']['mesh_shape']}) {row['cfp_over_best_paired']:.3f}x {row['best_baseline']}, answer "
                      f"{row['answer']['name']} {row['answer_over_best_paired']:.3f}x; best built-in "
                      f"{row['best_builtin']}: CFP {row['cfp_over_best_builtin_paired']:.3f}x, ILP "
                      + (f"{ilp:.3f}x" if ilp is not None else "not raced")
                      + f"; A/A floor {row['aa_floor']:.3f}; nearest "
                      + ", ".join(f"{k} {v['over_baseline_paired']:.3f}x it" for k, v in row["nearest"].items())
                      + f"; {row['wall_s']:.0f} s", flush=True)
                if row["diagnosis"]:
                    print(f"{'':>14} behind beyond the floor: {row['diagnosis']}", flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)   # after every run: a stopped bench keeps it
                out.write_text(json.dumps({"machine": platform.platform(), "configuration": "mode=cfp defaults",
                                           "set": args.set, "nearest": args.nearest,
                                           "summary": users_summary(rows), "runs": rows}, indent=2) + "\n")
    finally:
        if fresh:
            shutil.rmtree(work / "store", ignore_errors=True)
    print(f"wrote {out}; run dirs in {work}")


def users_summary(rows: list[dict]) -> dict:
    """Per model: the worst CFP's plan and answer over the best baseline, and the runs behind beyond the floor."""
    summary = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        summary[model] = {
            "cfp_over_best_paired": [round(r["cfp_over_best_paired"], 3) for r in mine],
            "answer_over_best_paired": [round(r["answer_over_best_paired"], 3) for r in mine],
            "best_baseline": [r["best_baseline"] for r in mine],
            "aa_floor": [round(r["aa_floor"], 3) for r in mine],
            "cfp_behind_best_beyond_floor": [r["cfp_behind_best_beyond_floor"] for r in mine],
            "wall_s": [round(r["wall_s"]) for r in mine]}
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["gpt", "bert", "llama2", "moe", "cfp-gpt", "cfp-llama", "cfp-moe"])
    ap.add_argument("--uniform", type=int, default=3, help="uniform plans raced beside the searched one (the "
                    "profiles' fastest)")
    ap.add_argument("--iterations", type=int, default=10, help="steps per round")
    ap.add_argument("--repeats", type=int, default=14, help="interleaved rounds")
    ap.add_argument("--profile-repeats", type=int, default=20)
    ap.add_argument("--top-k", type=int, default=4, help="plans the search measures on the whole step, "
                    "besides the plans nearest the built-in ones (mode.verify_top_k)")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--mesh", type=int, nargs="+", default=[4, 2])
    ap.add_argument("--store", default=DEFAULT_STORE, help="the profile store (with --users: default a fresh one)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--shortcuts", action="store_true", help="profile with and without CFP's profiling shortcuts "
                    "instead (see the module doc; results: bench/results/bench_cfp_search_shortcuts.json)")
    ap.add_argument("--early-stop-ratio", type=float, default=1.5, help="with --shortcuts (mode.early_stop_ratio)")
    ap.add_argument("--max-segment-space", type=int, default=128, help="with --shortcuts (mode.max_segment_space; "
                    "mode=cfp's 27 with --mesh 8 profiles what the embedded default job does)")
    ap.add_argument("--shortcut-worker", help=argparse.SUPPRESS)
    ap.add_argument("--users", action="store_true", help="the search as users get it instead: mode=cfp's defaults "
                    "on the embedded default job, the ILP raced beside it (see the module doc; results: "
                    "bench/results/bench_cfp_search_users.json)")
    ap.add_argument("--runs", type=int, default=1, help="with --users: runs per model")
    ap.add_argument("--nearest", nargs="*", default=["dp_tp", "ep"], help="with --users: the baselines whose "
                    "nearest plans race too")
    ap.add_argument("--set", nargs="*", default=[], help="with --users: overrides (mode./model. keys: the "
                    "composed config; others: the job)")
    ap.add_argument("--budget-gb", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--reference", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no-ilp", action="store_true", help="with --users: the ILP's plan not raced (a quicker run)")
    args = ap.parse_args()

    if args.shortcut_worker:
        print(json.dumps(shortcut_worker(args.shortcut_worker, args.mesh, args.store, args.profile_repeats,
                                         args.early_stop_ratio, args.budget_gb, args.reference,
                                         args.max_segment_space)))
        return
    if args.shortcuts:
        shortcut_bench(args)
        return
    if args.users:
        users_bench(args)
        return

    if args.worker:
        print(json.dumps(worker(args.worker, args.mesh, args.iterations, args.repeats, args.store,
                                args.profile_repeats, args.top_k, args.uniform)))
        return

    rows = []
    for name in args.models:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}"}
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--worker", name, "--mesh", *map(str, args.mesh),
                               "--iterations", str(args.iterations),
                               "--repeats", str(args.repeats), "--profile-repeats", str(args.profile_repeats),
                               "--top-k", str(args.top_k), "--uniform", str(args.uniform),
                               "--store", args.store], env=env, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: worker failed ({proc.returncode})")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["wall_s"] = time.perf_counter() - t
        rows.append(row)
        print(f"{row['model']:>12}: searched ({'mixed' if row['mixed_plan'] else 'uniform'})/best uniform "
              f"({row['best_uniform']}) {row['searched_over_best_uniform_paired']:.3f} paired, DP optimum "
              f"({'mixed' if row['search_optimum_mixed'] else 'uniform'}) "
              f"{row['search_optimum_over_best_uniform_paired']:.3f}, predicted by the profiles "
              f"{row['predicted_optimum_over_best_uniform']:.3f}; A/A floor {row['aa_floor']:.3f}; a mixed plan "
              f"beats every uniform one beyond it: {row['mixed_beats_every_uniform_beyond_floor']}", flush=True)
        print(f"{row['model']:>12}: searched ({row['source']})/best baseline ({row['best_baseline']}) "
              f"{row['searched_over_best_baseline_paired']:.3f} paired, {row['searched_over_best_baseline']:.3f} "
              f"medians; DP optimum/best baseline {row['search_optimum_over_best_baseline_paired']:.3f} paired; "
              f"profiled {row['profiled_configs']} of "
              f"{row['exhaustive_space']:.3g} ({row['profiled_over_exhaustive']:.2e}), profile "
              f"{row['profile_time_s']:.0f} s, search {row['search_time_s'] * 1e3:.1f} ms, predicted/measured "
              f"{row['predicted_over_measured']:.3f} (DP optimum "
              f"{row['search_optimum_predicted_over_measured']:.3f}); the searched plan again/itself "
              f"{row['searched_again_over_searched_paired']:.3f} paired, {row['searched_again_over_searched']:.3f} "
              "medians", flush=True)
        # after every model: a run stopped or failed later keeps what it measured
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": platform.platform(), "devices": args.devices, "mesh_shape": args.mesh,
                                   "iterations": args.iterations, "repeats": args.repeats, "models": rows},
                                  indent=2) + "\n")
        print(f"wrote {out} ({len(rows)} of {len(args.models)} models)", flush=True)


if __name__ == "__main__":
    main()
