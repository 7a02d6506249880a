"""Do CFP's segment profiles add up to the whole step? Per tiny model, on 8 virtual CPU devices.

    python bench/bench_cfp_additivity.py [--models gpt bert llama2 moe] [--rounds 5] [--store DIR]

``bench_cfp_search.py`` reports the predicted step time of the searched plan against the measured
one. That ratio mixes two errors: the machine's speed drifting between the profile pass and the
measurement, and the cost model itself (a whole step is not the sum of its segments). This
bench separates them. For the DP's optimum and the plan nearest each built-in plan, it re-times
every unit program the plan uses (beside its overhead program, as the profile pass does) and the
whole step's overhead program, in the same rounds as the whole steps themselves, and reports:

- ``stored / measured``: the prediction from the store's profiles, as mode=search makes it
  (timed from warm caches, mode=profile's default, unless ``--stored cold``);
- ``warm / measured`` and ``cold / measured``: the same formula on the unit times re-measured in
  the same rounds as the steps, each unit run back to back on the same arguments (warm) and
  after every device rewrote a buffer larger than its cache (cold, ``timing.CacheFlush``); what
  is left is the cost model's own error (non-additivity). The medians over rounds, and round by
  round (that round's units over that round's steps, so the machine's drift cancels);
- the collectives of the whole step against the sum of its unit programs' (count and bytes) and
  the FLOPs XLA counts in each, so that a plan whose whole step partitions differently from its
  segments shows.

Profiles come from ``--store`` (those ``bench_cfp_search.py`` wrote, or measured now when it
lacks them). Results go to bench/results/bench_cfp_additivity.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def worker(name: str, mesh_shape: list[int], rounds: int, iterations: int, repeats: int, store: str,
           cold: bool) -> dict:
    import jax

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    from bench_cfp_analysis import tiny_model

    from launcher import jaxcompat
    from launcher.sharding import pipeline
    from launcher.sharding.algorithms.cfp import profile as cfp_profile
    from launcher.sharding.options import ProfileOptions
    from launcher.sharding.profile.candidates import CandidateLoop
    from launcher.sharding.profile.keys import StoreKeys
    from launcher.sharding.profile.programs import whole_overhead_entry
    from launcher.sharding.measuring.quiet import counts
    from launcher.sharding.measuring.store import ProfileStore
    from launcher.sharding.measuring.timing import CacheFlush, Timer
    from launcher.sharding.search.comm import collectives
    from launcher.sharding.search.dp import predict, search
    from launcher.sharding.search.measure import plan_runner
    from launcher.sharding.search.race import race
    from launcher.sharding.search.nearest import nearest_plans

    model = tiny_model(name)
    log = lambda line: print(f"[{name}] {line}", file=sys.stderr, flush=True)
    analyzed = pipeline.analyze(model, mesh_shape=mesh_shape)
    a, program = analyzed.analysis, analyzed.program
    mesh = pipeline.make_mesh(a.mesh_shape)
    # Every candidate timed in full (no early stop): the bench compares their times.
    prof = cfp_profile.profile(analyzed, mesh, ProfileOptions(store_dir=store, repeats=20, warmup=1, cold_caches=cold,
                                                           overlap_compile=False, early_stop_ratio=0.0),
                            log=log).profiles
    plans = {"search optimum": search(prof, len(a.blocks)).assignment}
    for k, plan in nearest_plans(a, program, pipeline.BASELINES, jax.devices()).items():
        if plan not in plans.values():
            plans[f"nearest {k}"] = plan

    def combos(plan: list[int]) -> list[tuple]:
        return [(u, tuple(plan[u.start:u.end])) for u in prof.units]

    # Every unit program the plans use, compiled once: units of one kind share the program of
    # their first instance (as the profile pass times them).
    loop = CandidateLoop(a, mesh, ProfileStore(store), StoreKeys(a, mesh, cold), Timer(1, 20), prof.units,
                         ProfileOptions.exhaustive(overlap_compile=False), log=log)
    programs, unit_stats, first = {}, {}, loop.first
    for plan in plans.values():
        for u, c in combos(plan):
            if (u.kind, c) not in programs:
                compiled, overhead, args, *_ = loop.prepare(first[u.kind], c)
                programs[(u.kind, c)] = (compiled, overhead, args)
                cost = jaxcompat.cost_analysis(compiled)
                unit_stats[(u.kind, c)] = (collectives(compiled.as_text()), float(cost.get("flops", 0.0)))
    runners = [plan_runner(a, program, dict(enumerate(plan)), mesh, name=k) for k, plan in plans.items()]

    # Rounds: every unit program (beside its overhead program) and the whole step's overhead
    # program, timed both from warm and from cold caches, then every whole step; the medians
    # over rounds count.
    timers = {"warm": Timer(1, repeats), "cold": Timer(1, repeats, CacheFlush(mesh))}
    fresh = {how: {key: [] for key in programs} for how in timers}
    overhead_rounds: dict[str, list[float]] = {how: [] for how in timers}
    for r in range(rounds):
        for how, timer in timers.items():
            for key, (compiled, overhead, args) in programs.items():
                fresh[how][key].append(timer.entry(compiled, overhead, args))
            overhead_rounds[how].append(whole_overhead_entry(a, mesh, timer)["time_s"])
        race(runners, iterations=iterations, repeats=1)
        log(f"round {r + 1}/{rounds}")
    runs = {runner.name: runner.result() for runner in runners}

    def refreshed(how: str, picked: slice = slice(None)) -> Any:
        """The stored profiles with the units' and the whole overhead's times re-measured
        (medians over the rounds ``picked``)."""
        now = copy.copy(prof)
        now.table = {kind: dict(entries) for kind, entries in prof.table.items()}
        for (kind, c), entries in fresh[how].items():
            now.table[kind][c] = {**prof.table[kind][c],
                                  "time_s": statistics.median(e["time_s"] for e in entries[picked]),
                                  "overhead_s": statistics.median(e["overhead_s"] for e in entries[picked])}
        now.whole_overhead_s = statistics.median(overhead_rounds[how][picked])
        return now

    now = {how: refreshed(how) for how in timers}
    # Round by round: the prediction from that round's unit times over that round's steps (the
    # machine's drift between rounds cancels).
    by_round = {how: [refreshed(how, slice(r, r + 1)) for r in range(rounds)] for how in timers}

    rows = {}
    for (label, plan), runner in zip(plans.items(), runners, strict=True):
        run = runs[runner.name]
        whole = collectives(run.compiled.as_text())
        cost = jaxcompat.cost_analysis(run.compiled)
        segs: dict[str, dict[str, int]] = {}
        for u, c in combos(plan):
            for kind, e in unit_stats[(u.kind, c)][0].items():
                s = segs.setdefault(kind, {"count": 0, "bytes": 0})
                s["count"] += e["count"]
                s["bytes"] += e["bytes"]
        stored, _ = predict(prof, plan)
        warm, _ = predict(now["warm"], plan)
        cold_now, _ = predict(now["cold"], plan)
        rows[label] = {
            "assignment": plan,
            "measured_step_time_s": run.step_time_s,
            "round_times_s": run.repeat_times_s,
            "stored_predicted_s": stored,
            "fresh_warm_predicted_s": warm,
            "fresh_cold_predicted_s": cold_now,
            "stored_over_measured": stored / run.step_time_s,
            "fresh_warm_over_measured": warm / run.step_time_s,
            "fresh_cold_over_measured": cold_now / run.step_time_s,
            **{f"per_round_{how}_over_measured": [predict(p, plan)[0] / t for p, t in zip(by_round[how],
                                                                                       run.repeat_times_s, strict=True)]
               for how in timers},
            "whole_collectives": whole,
            "segment_collectives": segs,
            "whole_flops": float(cost.get("flops", 0.0)),
            "segment_flops": sum(unit_stats[(u.kind, c)][1] for u, c in combos(plan)),
        }
    return {"model": f"{name}-tiny", "mesh_shape": mesh_shape, "units": len(prof.units),
            "stored_caches": "cold" if cold else "warm", "whole_overhead_stored_s": prof.whole_overhead_s,
            "whole_overhead_warm_s": now["warm"].whole_overhead_s,
            "whole_overhead_cold_s": now["cold"].whole_overhead_s,
            "plans": rows, "timings_retaken": counts}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["gpt", "bert", "llama2", "moe"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20, help="whole steps per round")
    ap.add_argument("--repeats", type=int, default=10, help="runs of each unit program per round")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--mesh", type=int, nargs="+", default=[4, 2])
    ap.add_argument("--store", default=str(REPO / "outputs" / "cfp_profiles"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "bench_cfp_additivity.json"))
    ap.add_argument("--stored", choices=["cold", "warm"], default="warm",
                    help="how the profile pass times the stored profiles (mode.cold_caches)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        print(json.dumps(worker(args.worker, args.mesh, args.rounds, args.iterations, args.repeats, args.store,
                                args.stored == "cold")))
        return

    rows = []
    for name in args.models:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}"}
        proc = subprocess.run([sys.executable, __file__, "--worker", name, "--mesh", *map(str, args.mesh),
                               "--rounds", str(args.rounds), "--iterations", str(args.iterations),
                               "--repeats", str(args.repeats), "--store", args.store, "--stored", args.stored],
                              env=env, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: worker failed ({proc.returncode})")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{row['model']}: whole-step overhead program {row['whole_overhead_stored_s'] * 1e3:.2f} ms stored "
              f"({row['stored_caches']}), {row['whole_overhead_warm_s'] * 1e3:.2f} ms warm and "
              f"{row['whole_overhead_cold_s'] * 1e3:.2f} ms cold now")
        for label, p in row["plans"].items():
            count = lambda c: sum(e["count"] for e in c.values())
            spread = lambda xs: f"{min(xs):.2f}-{max(xs):.2f}"
            print(f"  {label:>16}: measured {p['measured_step_time_s'] * 1e3:6.2f} ms; predicted/measured: stored "
                  f"{p['stored_over_measured']:.3f}, warm {p['fresh_warm_over_measured']:.3f} (rounds "
                  f"{spread(p['per_round_warm_over_measured'])}), cold {p['fresh_cold_over_measured']:.3f} (rounds "
                  f"{spread(p['per_round_cold_over_measured'])}); collectives whole "
                  f"{count(p['whole_collectives'])} vs segments {count(p['segment_collectives'])}, FLOPs "
                  f"whole/segments {p['whole_flops'] / max(p['segment_flops'], 1):.3f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "devices": args.devices, "mesh_shape": args.mesh,
                               "rounds": args.rounds, "iterations": args.iterations, "repeats": args.repeats,
                               "stored_caches": args.stored,
                               "models": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
