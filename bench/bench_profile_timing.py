"""How repeatable is the profile's timing, and would another way of timing pick better? Measured on
twins: programs that compute the same thing.

    python bench/bench_profile_timing.py [--programs linen_lm scanned_lm] [--passes 3] [--runs 10 40]

In one process on virtual CPU devices, the `[2, 4]` mesh's plans are the `[4, 2]` mesh's with
the devices transposed, and such devices cannot tell one order from another. So each program the
profile compiles for `[2, 4]` has a twin among `[4, 2]`'s, and the two should time alike. The
bench compiles every candidate a cold profile times on both meshes (the rough model's top
`profile_top_k` of each unit, `CandidateLoop.candidates`), each with its overhead program. It then
times them all under each protocol, in turn, `--passes` times:

- **sequential**: each program's runs back to back, beside its overhead program, one program
  after another, `[4, 2]`'s then `[2, 4]`'s, timed by the profile's own ``Timer`` as CFP's
  artifact times them (the candidate loop with ``interleave=False``);
- **rounds**: each unit's programs on each mesh in rounds, each once a round beside its
  overhead program, one unit after another, by the profile's own ``Timer.rounds`` as its
  candidate loop times them;
- **interleaved**: round by round, every program of both meshes once (beside its overhead
  program) in every round, as the races time whole steps: drift between programs cancels;

each with `--runs` runs per program. The net time is the median run less the median overhead
run, as the profile stores it. Reported per protocol and pass:
- how far the twins' net times are apart (median and 80th percentile of the ratio, folded
  above 1);
- for each unit and mesh, the **regret** of the combination that protocol times fastest: its
  true net time over the truly fastest's. The truth is the mean of separate interleaved passes of
  the most runs, taken before and after the rest and used for nothing else. Being interleaved
  itself, it favours the interleaved protocol at the same number of runs: read that row as an
  upper bound, and compare the protocols at the profile's 10 runs.

To bench/results/bench_profile_timing.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "bench_profile_timing.json"
PROGRAMS = ("linen_lm", "scanned_lm", "nnx_fsdp", "equinox_mlp", "numpy_mlp")
TRUTH_PASSES = 2   # before the protocols' passes and after them


def programs_of(name: str):
    """(mesh, unit blocks, combination in [4, 2]'s plan numbers, compiled, overhead, args) of
    every candidate a cold profile of ``name`` times on [4, 2] and on [2, 4]."""
    from launcher.sharding import pipeline
    from launcher.sharding.analysis.strategies import Strategy
    from launcher.sharding.measuring.store import ProfileStore
    from launcher.sharding.measuring.timing import Timer
    from launcher.sharding.options import ProfileOptions
    from launcher.sharding.profile.candidates import CandidateLoop
    from launcher.sharding.profile.keys import StoreKeys
    from launcher.sharding.profile.units import profiling_units
    from launcher.sharding.user.step import step_program
    from tests import user_programs

    s = getattr(user_programs, f"make_{name}")()
    program = step_program(s.fn, s.args, data_argnums=s.data_argnums, in_shardings=s.in_shardings)
    options, on = ProfileOptions(), {}
    for shape in ([4, 2], [2, 4]):   # analysed as mesh_shape=auto analyses them
        a = pipeline.analyze(program, mesh_shape=shape, two_axis_only=True).analysis
        mesh = pipeline.make_mesh(shape)
        loop = CandidateLoop(a, mesh, ProfileStore(tempfile.mkdtemp(prefix="bench-profile-timing-")),
                             StoreKeys(a, mesh, False), Timer(), profiling_units(a, options.max_segment_space),
                             options, log=lambda line: None)
        on[tuple(shape)] = (a, loop, loop.candidates())
    transposed = lambda s: Strategy(tuple(tuple(sorted(1 - ax for ax in axes)) for axes in s.axes))
    a42, a24 = on[4, 2][0], on[2, 4][0]
    try:
        twin = [[a42.blocks[b].plans.index(transposed(p)) for p in a24.blocks[b].plans] for b in range(len(a24.blocks))]
    except ValueError:
        raise SystemExit(f"{name}: a [2, 4] plan has no transposed twin among [4, 2]'s (the meshes' analyses "
                         "differ), so its programs cannot be paired") from None
    out = []
    for shape, (_, loop, todo) in on.items():
        for u, combo in todo:
            compiled, overhead, args, _, _ = loop.prepare(u, combo)
            key = combo if shape == (4, 2) else tuple(twin[u.start + i][c] for i, c in enumerate(combo))
            out.append((shape, (u.start, u.end), key, compiled, overhead, args))
    return out


def _run(program, args) -> float:
    import jax

    t = time.perf_counter()
    jax.block_until_ready(program(*args))
    return time.perf_counter() - t


def sequential(programs, runs: int) -> list[float]:
    """The candidate loop's own timing (``Timer.beside_overhead``, its one warm-up run), one
    program after another."""
    from launcher.sharding.measuring.timing import Timer

    timer, nets = Timer(warmup=1, repeats=runs), []
    for *_, compiled, overhead, args in programs:
        times, overheads = timer.beside_overhead(compiled, overhead, args)
        nets.append(statistics.median(times) - statistics.median(overheads))
    return nets


def rounds(programs, runs: int) -> list[float]:
    """The candidate loop's own timing (``Timer.rounds``, its one warm-up round): a unit's
    programs on a mesh in rounds, one unit after another."""
    from launcher.sharding.measuring.timing import Timer

    timer, nets, groups = Timer(warmup=1, repeats=runs), [0.0] * len(programs), {}
    for k, (shape, blocks, *_) in enumerate(programs):
        groups.setdefault((tuple(shape), tuple(blocks)), []).append(k)
    for ks in groups.values():
        for k, (times, overheads) in zip(ks, timer.rounds([programs[k][-3:] for k in ks]), strict=True):
            nets[k] = statistics.median(times) - statistics.median(overheads)
    return nets


def interleaved(programs, runs: int) -> list[float]:
    times, overheads = [[] for _ in programs], [[] for _ in programs]
    for *_, compiled, overhead, args in programs:
        _run(compiled, args)
        _run(overhead, args)
    for _ in range(runs):
        for k, (*_, compiled, overhead, args) in enumerate(programs):
            times[k].append(_run(compiled, args))
            overheads[k].append(_run(overhead, args))
    return [statistics.median(t) - statistics.median(o) for t, o in zip(times, overheads, strict=True)]


def score(programs, pairs, units, nets: list[float], truth: list[float]) -> dict:
    """The twins' distance, and each unit's pick's regret against ``truth`` (by twin pair)."""
    folded = sorted(abs(math.log(nets[a] / nets[b])) if nets[a] > 0 and nets[b] > 0 else math.inf for a, b in pairs)
    regrets = []
    for ks in units.values():
        best = min(ks, key=lambda k: truth[k])
        for side in (0, 1):   # each mesh's own pick
            pick = min(ks, key=lambda k: nets[pairs[k][side]])
            regrets.append(truth[pick] / truth[best])
    return {"twins_median": math.exp(statistics.median(folded)), "twins_p80": math.exp(folded[int(0.8 * len(folded))]),
            "picks": len(regrets), "exact_picks": sum(r == 1.0 for r in regrets),
            "mean_regret": statistics.mean(regrets), "worst_regret": max(regrets)}


def one(name: str, passes: int, runs: list[int]) -> dict:
    t0 = time.perf_counter()
    programs = programs_of(name)
    compile_s = time.perf_counter() - t0
    index = {}
    for k, (shape, blocks, key, *_) in enumerate(programs):
        index.setdefault((blocks, key), {})[shape] = k
    pairs = [(d[4, 2], d[2, 4]) for d in index.values() if len(d) == 2]
    units: dict = {}
    for k, (a, _) in enumerate(pairs):
        units.setdefault(programs[a][1], []).append(k)
    most = max(runs)
    truth_nets = [interleaved(programs, most)]
    protocols = {f"{f.__name__} x{n}": (f, n) for n in runs for f in (sequential, rounds, interleaved)}
    measured: dict = {p: [] for p in protocols}
    for _ in range(passes):
        for p, (f, n) in protocols.items():
            t = time.perf_counter()
            measured[p].append((f(programs, n), time.perf_counter() - t))
    truth_nets.append(interleaved(programs, most))
    truth = [statistics.mean(n[i] for n in truth_nets for i in pair) for pair in pairs]
    rows = {}
    for p, got in measured.items():
        scores = [{**score(programs, pairs, units, nets, truth), "seconds": s} for nets, s in got]
        rows[p] = {"passes": scores,
                   **{f"median_{k}": statistics.median(s[k] for s in scores)
                      for k in ("twins_median", "twins_p80", "mean_regret", "worst_regret", "seconds")},
                   "exact_picks": sum(s["exact_picks"] for s in scores), "picks": sum(s["picks"] for s in scores)}
        print(f"  {name:>10} {p:>16}: twins {rows[p]['median_twins_median']:.3f} apart (p80 "
              f"{rows[p]['median_twins_p80']:.3f}); picks exact {rows[p]['exact_picks']}/{rows[p]['picks']}, "
              f"mean regret {rows[p]['median_mean_regret']:.3f}, worst {rows[p]['median_worst_regret']:.3f}; "
              f"{rows[p]['median_seconds']:.1f} s a pass", flush=True)
    return {"program": name, "programs": len(programs), "twin_pairs": len(pairs),
            "units": {str(list(u)): len(ks) for u, ks in units.items()}, "compile_s": compile_s,
            "truth": f"mean of {TRUTH_PASSES} interleaved passes of {most} runs, before and after", "protocols": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", nargs="+", default=["linen_lm"], choices=PROGRAMS,
                    help="tests/user_programs.py's programs")
    ap.add_argument("--passes", type=int, default=3, help="passes of every protocol, in turn")
    ap.add_argument("--runs", type=int, nargs="+", default=[10, 40], help="runs per program (the profile's: 10)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.passes < 1 or min(args.runs) < 1:
        ap.error("--passes and --runs take whole numbers from 1")
    sys.path.insert(0, str(REPO))
    from launcher import jaxcompat

    jaxcompat.set_cpu_device_count(8)
    rows = [one(name, args.passes, args.runs) for name in args.programs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python bench/bench_profile_timing.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"), "machine": platform.platform(), "cores": len(os.sched_getaffinity(0)),
        "devices": 8, "rows": rows}, indent=1))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
