"""Auto-sharding programs written as users write them, from Python, as a user would call it.

    python bench/bench_autoshard.py [--programs scanned_lm nnx_fsdp linen_lm equinox_mlp numpy_mlp]
                                    [--devices 8] [--iterations 10] [--repeats 14]

Each program of ``tests/user_programs.py`` (a scanned decoder LM with a hand-written FSDP x TP
layout; Flax's NNX FSDP toy, an optimizer holding its model's params; a Linen LM stepped as lm1b;
an Equinox MLP passed whole; an MLP with float64 NumPy parameters), in a process of its own with
``--devices`` virtual CPU devices and a fresh profile store:

1. ``autoshard(step, *args)`` with its defaults (every logical mesh, dp and fsdp raced, the
   user's own layout where it has one): the **cold** search's wall time, from an empty store;
2. the same call again: the **warm** search's (the store holds the answer);
3. ``autoshard(..., algorithm="ilp")``: the Alpa-style ILP's plan, and its search time;
4. a race of its own (``--repeats`` interleaved rounds of ``--iterations`` steps,
   ``search/measure.py: race``): CFP's own plan (whatever the answer), the same plan compiled a
   second time (the A/A floor: any ratio is only as exact as this one's distance from 1), the
   ILP's plan, and the baselines dp, fsdp and the user's layout. Reported, paired (the median
   over rounds of the ratio within a round): CFP's own plan over the best baseline, the answer
   (what ``autoshard`` handed back) over it, the ILP's plan over it, the floor, and whether CFP's
   plan is behind the best baseline by more than 5% beyond the floor (issue #34's bound).

Results go to bench/results/bench_autoshard.json (``--out``), every round kept: timings on a
shared 2-core machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "bench_autoshard.json"
PROGRAMS = ("scanned_lm", "nnx_fsdp", "linen_lm", "equinox_mlp", "numpy_mlp")
BOUND = 1.05   # CFP's own plan over the best baseline, beyond the A/A floor


def worker(name: str, store: str, iterations: int, repeats: int) -> dict:
    import jax

    sys.path.insert(0, str(REPO))
    from launcher.sharding.apply import constrained_step
    from launcher.sharding.comparison import compare
    from launcher.sharding.user.api import autoshard
    from launcher.sharding.search.measure import StepRunner, baseline_runner, race
    from launcher.sharding.user.step import step_program
    from tests import user_programs

    log = lambda line: print(f"[{name}] {line}", file=sys.stderr, flush=True)
    quiet = lambda line: None
    make = getattr(user_programs, f"make_{name}")

    def search(**options):
        s = make()
        t = time.perf_counter()
        plan = autoshard(s.fn, *s.args, data_argnums=s.data_argnums, in_shardings=s.in_shardings, store_dir=store,
                         **options)
        return plan, time.perf_counter() - t

    answer, cold = search(log=log)
    _, warm = search(log=quiet)
    ilp, ilp_s = search(algorithm="ilp", log=quiet)
    own = answer.own or answer       # CFP's own plan, whichever plan is the answer
    log(f"cold {cold:.1f} s, warm {warm:.1f} s, ILP {ilp_s:.1f} s; the answer: {answer.why}")

    s = make()
    program = step_program(s.fn, s.args, data_argnums=s.data_argnums, in_shardings=s.in_shardings)

    def runner(plan, label):
        body, in_shardings, _ = constrained_step(program.step, program.args, plan.constraints, plan.mesh())
        return StepRunner(label, program, body, in_shardings)

    ilp_plan = ilp.own or ilp
    runners = [runner(own, "cfp"), runner(own, "cfp again"), runner(ilp_plan, "alpa_ilp")]
    baselines = ["dp", "fsdp"] + (["user"] if program.in_shardings is not None else [])
    runners += [baseline_runner(program, b, jax.devices()) for b in baselines]
    runs = {r.name: r for r in race(runners, iterations=iterations, repeats=repeats)}
    cfp, again = runs["cfp"], runs["cfp again"]
    base = {b: runs[b] for b in baselines}
    ratios = {b: paired(cfp, r) for b, r in base.items()}
    # The fastest baseline as a search's answer names it, round by round (the comparison every output reads).
    best = compare({"cfp": cfp.repeat_times_s, **{b: r.repeat_times_s for b, r in base.items()}}, "cfp").best_baseline
    floor = abs(paired(again, cfp) - 1)
    answer_run = cfp if answer.row == "cfp" else runs.get(answer.row, runs.get("alpa_ilp"))
    return {
        "program": name, "devices": jax.device_count(), "platform": jax.devices()[0].platform,
        "cold_search_s": cold, "warm_search_s": warm, "ilp_search_s": ilp_s,
        "kept": {"source": own.source, "mesh_shape": own.mesh_shape}, "answer": answer.row, "answer_why": answer.why,
        "best_baseline": best,
        "cfp_over_best_paired": ratios[best], "answer_over_best_paired": paired(answer_run, base[best]),
        "ilp_over_best_paired": paired(runs["alpa_ilp"], base[best]), "aa_floor": floor,
        "cfp_behind_best_beyond_bound": ratios[best] > BOUND + floor,
        "cfp_over_each_paired": ratios,
        "predicted_step_time_s": own.predicted_step_time_s,
        "step_time_s": {n: r.step_time_s for n, r in runs.items()},
        "repeat_times_s": {n: r.repeat_times_s for n, r in runs.items()},
        "memory_gb": {n: r.memory_bytes / 2**30 for n, r in runs.items()},
        # The same training under every layout (float sums in another order differ a little).
        "losses_max_rel_diff": max(abs(a - b) / abs(a) for r in runs.values()
                                   for a, b in zip(cfp.losses, r.losses, strict=True)),
    }


def paired(run, other) -> float:
    from launcher.sharding.comparison import paired_over   # the one paired ratio

    return paired_over(run.repeat_times_s, other.repeat_times_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=PROGRAMS)
    ap.add_argument("--devices", type=int, default=8, help="virtual CPU devices (no effect on accelerators)")
    ap.add_argument("--iterations", type=int, default=10, help="steps per round of the bench's race")
    ap.add_argument("--repeats", type=int, default=14, help="interleaved rounds of the bench's race")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--worker", nargs=2, metavar=("PROGRAM", "STORE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.iterations, args.repeats)))
        return
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out, rows = Path(args.out), []
    for name in args.programs:
        store = tempfile.mkdtemp(prefix=f"bench-autoshard-{name}-")
        t = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, __file__, "--worker", name, store, "--iterations",
                                   str(args.iterations), "--repeats", str(args.repeats)], env=env,
                                  stdout=subprocess.PIPE, text=True, cwd=REPO)
        finally:
            shutil.rmtree(store, ignore_errors=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: the worker failed ({proc.returncode})")
        row = {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": time.perf_counter() - t}
        rows.append(row)
        print(f"{name:>12}: cold {row['cold_search_s']:.0f} s, warm {row['warm_search_s']:.1f} s (ILP "
              f"{row['ilp_search_s']:.0f} s); CFP's plan {row['cfp_over_best_paired']:.3f}x {row['best_baseline']}, the "
              f"answer ({row['answer']}) {row['answer_over_best_paired']:.3f}x, ILP {row['ilp_over_best_paired']:.3f}x; "
              f"A/A floor {row['aa_floor']:.3f}" + ("  BEHIND beyond the bound" if row["cfp_behind_best_beyond_bound"]
                                                   else ""), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)   # after every program: a stopped bench keeps it
        out.write_text(json.dumps({"machine": platform.platform(), "cores": os.cpu_count(), "devices": args.devices,
                                   "iterations": args.iterations, "repeats": args.repeats, "bound": BOUND,
                                   "programs": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
