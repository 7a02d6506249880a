"""CFP against the Alpa-style ILP on the same graph, per tiny model, on 8 virtual CPU devices.

    python bench/bench_cfp_ilp.py [--models gpt bert ...] [--iterations 10] [--repeats 10]

The paper's headline compares CFP with Alpa: up to 1.51x (GPT), 1.31x (LLaMA) and 3.43x (MoE).
Alpa's intra-operator pass is re-built here as ``launcher/sharding/ilp/`` (an ILP over one strategy
per contraction, priced by collectives calibrated on the mesh, solved by HiGHS). For each model
(every ``conf/model/<name>-tiny.yaml`` whose schema ``models/configs.py`` has: gpt, bert,
llama2, moe, and CFP's own workloads cfp-gpt, cfp-llama, cfp-moe), in its own process with 8
virtual devices, on one mesh (``--mesh``, 4x2 as bench_cfp_search.py) and one program:

- CFP as ``mode=search`` runs it: profile every segment combination (a fresh store, so every
  entry is measured now), the DP, the shortlist measured on the whole step (``algorithms/cfp/algorithm.py: choose``);
- the ILP: calibrate the collectives (a fresh store: measured now), formulate, solve;
- then CFP's plan, CFP's plan compiled a second time (the A/A floor: how far one measurement of
  a plan moves from another of the same plan in the same rounds), the ILP's plan and the
  ``--baselines`` trained side by side, ``--repeats`` interleaved rounds of ``--iterations``
  steps (``race.race``).

Reported per model: CFP's step time over the ILP's, *paired* (the median over rounds of the
ratio within each round, as bench_cfp_search.py) and as the ratio of medians, beside the A/A
floor; CFP's profile + search (+ shortlist) time against the ILP's calibration + formulation +
solve time; predicted over measured step time for each; the ILP's own cost model's price of
CFP's plan (where CFP's plan uses strategies the ILP offers), i.e. whether the ILP ranked the
faster plan lower. The machine's load average is recorded before and after each model.
Results go to bench/results/bench_cfp_ilp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def tiny_models() -> list[str]:
    """Every model with a schema and a ``-tiny`` preset."""
    from launcher.models.configs import SCHEMAS

    return [name for name in SCHEMAS if (REPO / "conf" / "model" / f"{name}-tiny.yaml").exists()]


def worker(name: str, mesh_shape: list[int], iterations: int, repeats: int, store: str, profile_repeats: int,
           top_k: int, baselines: list[str]) -> dict:
    import jax

    from bench_cfp_analysis import tiny_model
    from bench_cfp_search import paired

    from launcher.sharding import pipeline

    from launcher.sharding.algorithms.cfp import profile as cfp_profile
    from launcher.sharding.algorithms.cfp import CfpOptions, choose
    from launcher.sharding.algorithms.base import OnMesh
    from launcher.sharding.ilp.plan import from_blocks, ilp_plan
    from launcher.sharding.options import ProfileOptions, SearchOptions
    from launcher.sharding.measuring.quiet import counts
    from launcher.sharding.measuring.store import ProfileStore
    from launcher.sharding.search.dp import search
    from launcher.sharding.search.measure import baseline_runners, plan_runner
    from launcher.sharding.search.race import race

    log = lambda line: print(f"[{name}] {line}", file=sys.stderr, flush=True)
    analyzed = pipeline.analyze(tiny_model(name), mesh_shape=mesh_shape)
    a, program = analyzed.analysis, analyzed.program
    mesh = pipeline.make_mesh(a.mesh_shape)

    # CFP, as mode=search runs it (but every candidate timed in full: no early stop)
    prof = cfp_profile.profile(analyzed, mesh, ProfileOptions(store_dir=str(Path(store) / "cfp"), repeats=profile_repeats,
                                                           warmup=1, overlap_compile=False, early_stop_ratio=0.0),
                            log=log).profiles
    found = search(prof, len(a.blocks))
    t0 = time.perf_counter()
    chosen, candidates, _ = choose([OnMesh(analyzed, mesh, prof)], [found], SearchOptions(),
                                   CfpOptions(verify_top_k=top_k), name="cfp")
    choose_s = time.perf_counter() - t0
    picked = chosen.candidate
    log(f"CFP: {picked.assignment} ({picked.source})")

    # The ILP
    planned = ilp_plan(a, mesh, ProfileStore(Path(store) / "ilp"), repeats=profile_repeats, log=log)
    cfp_choice = from_blocks(planned.operators, a, picked.assignment)

    runners = [chosen, plan_runner(a, program, dict(enumerate(picked.assignment)), mesh, name="cfp again"),
               planned.runner(program)]
    more, skipped = baseline_runners(program, jax.devices(), seed=0, log=log, names=baselines)
    cfp, again, ilp, *others = race(runners + more, iterations=iterations, repeats=repeats)
    s = planned.summary()
    return {
        "model": f"{name}-tiny",
        "mesh_shape": mesh_shape,
        "contractions": len(a.contractions),
        "blocks": len(a.blocks),
        "cfp_assignment": picked.assignment,
        "cfp_source": picked.source,
        "ilp_block_assignment": planned.block_assignment,
        "ilp_choice": planned.solution.choice,
        "cfp_step_time_s": cfp.step_time_s,
        "cfp_again_step_time_s": again.step_time_s,
        "ilp_step_time_s": ilp.step_time_s,
        "cfp_repeat_times_s": cfp.repeat_times_s,
        "cfp_again_repeat_times_s": again.repeat_times_s,
        "ilp_repeat_times_s": ilp.repeat_times_s,
        "cfp_over_ilp_paired": paired(cfp, ilp),
        "cfp_over_ilp_medians": cfp.step_time_s / ilp.step_time_s,
        "ilp_over_cfp_paired": paired(ilp, cfp),
        "aa_paired": paired(again, cfp),
        "aa_medians": again.step_time_s / cfp.step_time_s,
        "cfp_memory_gb": cfp.memory_bytes / 2**30,
        "ilp_memory_gb": ilp.memory_bytes / 2**30,
        "cfp_tflops": cfp.tflops,
        "ilp_tflops": ilp.tflops,
        "baselines": {r.name: {**r.summary(), "over_cfp_paired": paired(r, cfp)} for r in others},
        "baselines_skipped": skipped,
        # what each search costs, from an empty store
        "cfp_profile_time_s": prof.seconds,
        "cfp_profiled_configs": prof.profiled_configs,
        "cfp_measured_configs": prof.measured,          # the rest were read from the store
        "ilp_calibrated_now": s["calibrated_now"],
        "cfp_search_time_s": found.search_time_s,
        "cfp_shortlist_time_s": choose_s,
        "cfp_shortlist": len(candidates),
        "ilp_calibration_time_s": s["calibration_time_s"],
        "ilp_formulate_time_s": s["formulate_time_s"],
        "ilp_solve_time_s": s["solve_time_s"],
        "ilp_num_variables": s["num_variables"],
        "ilp_num_constraints": s["num_constraints"],
        "ilp_plan_space": s["plan_space"],
        # predictions
        "cfp_predicted_step_time_s": picked.predicted_time_s,
        "cfp_predicted_over_measured": picked.predicted_time_s / cfp.step_time_s,
        "ilp_predicted_step_time_s": planned.predicted_step_time_s,
        "ilp_predicted_comm_time_s": s["predicted_comm_time_s"],
        "ilp_predicted_over_measured": planned.predicted_step_time_s / ilp.step_time_s,
        "ilp_model_of_cfp_plan_s": planned.problem.time_s(cfp_choice) if cfp_choice is not None else None,
        "ilp_model_cfp_over_ilp": (planned.problem.time_s(cfp_choice) / planned.predicted_step_time_s
                                   if cfp_choice is not None else None),
        "ilp_predicted_memory_gb": s["predicted_memory_gb"],
        "timings_retaken": counts,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=None, help="default: every tiny model (tiny_models())")
    ap.add_argument("--iterations", type=int, default=10, help="steps per round")
    ap.add_argument("--repeats", type=int, default=10, help="interleaved rounds")
    ap.add_argument("--profile-repeats", type=int, default=10, help="timed runs per candidate (mode.repeats)")
    ap.add_argument("--top-k", type=int, default=4, help="CFP's shortlist (mode.verify_top_k)")
    ap.add_argument("--baselines", nargs="*", default=["dp_tp"], help="built-in plans raced beside them")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--mesh", type=int, nargs="+", default=[4, 2])
    ap.add_argument("--store", default="", help="profile store root (default: a fresh one, so both searches "
                    "measure everything they need now)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "bench_cfp_ilp.json"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        print(json.dumps(worker(args.worker, args.mesh, args.iterations, args.repeats, args.store,
                                args.profile_repeats, args.top_k, args.baselines)))
        return

    root = Path(args.store or tempfile.mkdtemp(prefix="bench-cfp-ilp-"))
    rows = []
    for name in args.models or tiny_models():
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}"}
        load_before = os.getloadavg()
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--worker", name, "--mesh", *map(str, args.mesh),
                               "--iterations", str(args.iterations), "--repeats", str(args.repeats),
                               "--profile-repeats", str(args.profile_repeats), "--top-k", str(args.top_k),
                               "--baselines", *args.baselines, "--store", str(root / name)],
                              env=env, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: worker failed ({proc.returncode})")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row.update(wall_s=time.perf_counter() - t, load_before=load_before, load_after=os.getloadavg())
        rows.append(row)
        print(f"{row['model']:>15}: CFP/ILP step {row['cfp_over_ilp_paired']:.3f} paired, "
              f"{row['cfp_over_ilp_medians']:.3f} medians (A/A {row['aa_paired']:.3f}); CFP profile "
              f"{row['cfp_profile_time_s']:.0f} s + search {row['cfp_search_time_s']:.2f} s + shortlist "
              f"{row['cfp_shortlist_time_s']:.0f} s, ILP calibration {row['ilp_calibration_time_s']:.0f} s + solve "
              f"{row['ilp_solve_time_s']:.2f} s; predicted/measured CFP {row['cfp_predicted_over_measured']:.2f}, "
              f"ILP {row['ilp_predicted_over_measured']:.2f}; load {row['load_before'][0]:.1f} -> "
              f"{row['load_after'][0]:.1f}", flush=True)
        # After every model: a long run stopped half way still leaves what it measured.
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "devices": args.devices,
                                   "mesh_shape": args.mesh, "iterations": args.iterations, "repeats": args.repeats,
                                   "profile_repeats": args.profile_repeats, "top_k": args.top_k,
                                   "baselines": args.baselines, "models": rows}, indent=2) + "\n")
        print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
