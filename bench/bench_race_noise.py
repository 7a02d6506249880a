"""How exactly the default job's final race can compare two plans: an A/A race in its setting.

    python bench/bench_race_noise.py [--rounds 40] [--iterations 5] [--model gpt]

The default job (``python -m launcher``) runs 2 processes of 4 CPU devices, gloo between them.
This starts the same two processes (``jax.distributed`` on localhost), and races, in
``--rounds`` interleaved rounds of ``--iterations`` steps as ``mode=cfp``'s final runs do
(``launcher.sharding.search.race.race``): dp_tp, dp_tp compiled a second time, and the plan
nearest dp_tp on the 4x2 mesh (``launcher/sharding/search/nearest.py``). dp_tp over itself is an A/A
test: any spread in it is the machine's.

Reported: a round's spread (its standard deviation over the median round, per plan); the
whole race's ratios (second dp_tp and nearest plan over dp_tp; paired: the median over rounds of
the ratio within a round; medians: the ratio of median rounds); and, resampling the A/A race's
rounds (bootstrap, 4000 draws), the standard deviation of each ratio over a race of 10 and of
20 rounds: how far from 1 a race of that many rounds may put two identical plans; and over the
same draws, how often the final race's verdict (``comparison.verdict``: the 2% margin, and the
race's own noise floor) would have handed the answer to the second dp_tp, and how often the
margin alone would have. Results go to bench/results/bench_race_noise.json. ``--reuse`` computes
them again from the rounds that file holds, racing nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "bench_race_noise.json"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def worker(args: argparse.Namespace) -> None:
    import jax

    from launcher import jaxcompat

    jaxcompat.set_cpu_device_count(4)
    jaxcompat.use_gloo_cpu_collectives()
    jaxcompat.distributed_initialize(coordinator_address=args.coordinator, num_processes=2,
                                     process_id=args.worker, local_device_ids=None, initialization_timeout=120,
                                     heartbeat_timeout_seconds=100)
    from bench_cfp_analysis import tiny_model
    from launcher.sharding import pipeline
    from launcher.sharding.measuring.timing import slowest_process
    from launcher.sharding.search.measure import baseline_runner, plan_runner
    from launcher.sharding.search.race import race
    from launcher.sharding.search.nearest import nearest_plans

    analyzed = pipeline.analyze(tiny_model(args.model), mesh_shape=[4, 2])
    a, program = analyzed.analysis, analyzed.program
    near = nearest_plans(a, program, ["dp_tp"], jax.devices())["dp_tp"]
    runners = [baseline_runner(program, "dp_tp", jax.devices()), baseline_runner(program, "dp_tp", jax.devices()),
               plan_runner(a, program, dict(enumerate(near)), pipeline.make_mesh(a.mesh_shape), name="nearest dp_tp")]
    race(runners, iterations=args.iterations, repeats=args.rounds)
    slowest = slowest_process([t for r in runners for t in r.rounds])
    if args.worker == 0:
        n = args.rounds
        rounds = {name: slowest[i * n:(i + 1) * n] for i, name in enumerate(("dp_tp", "dp_tp again", "nearest dp_tp"))}
        Path(args.out).write_text(json.dumps({"nearest_dp_tp": near, "rounds_s": rounds}))


def medians(x, y) -> float:
    return statistics.median(x) / statistics.median(y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--reuse", action="store_true", help="the rounds of the results file, raced again in no process")
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker >= 0:
        return worker(args)

    import numpy as np

    from launcher.sharding.comparison import verdict
    from launcher.sharding.comparison import paired_over as paired
    from launcher.clusters.base import free_port

    if args.reuse:
        raw = json.loads(RESULTS.read_text())
        command, args.rounds, args.iterations = raw["command"], raw["rounds"], raw["iterations"]
        args.model = raw["model"].removesuffix("-tiny")
    else:
        command = "python bench/bench_race_noise.py " + " ".join(sys.argv[1:])
        out = RESULTS.with_suffix(".tmp")
        coordinator = f"127.0.0.1:{free_port()}"
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(i), "--coordinator", coordinator,
                                   "--out", str(out), "--rounds", str(args.rounds), "--iterations",
                                   str(args.iterations), "--model", args.model],
                                  env={**os.environ, "JAX_PLATFORMS": "cpu"})
                 for i in range(2)]
        if any(p.wait() for p in procs):
            sys.exit("a worker failed; see its output above")
        raw = json.loads(out.read_text())
        out.unlink()
    r = {k: np.asarray(v) for k, v in raw["rounds_s"].items()}
    a, b = r["dp_tp"], r["dp_tp again"]
    rng = np.random.default_rng(0)
    resampled = {}
    for n in (10, 20):
        draws = [rng.integers(0, len(a), n) for _ in range(4000)]
        for name, f in (("paired", paired), ("medians", medians)):
            v = np.array([f(b[i], a[i]) for i in draws])
            resampled[f"{n} rounds, {name}"] = {"sd": float(v.std())}
        # The same draws as final races of dp_tp again (the "searched" plan) against dp_tp: the
        # share the verdict answers with the second compile, and with the margin alone.
        verdicts = [verdict([list(b[i]), list(a[i])], [1], margin=0.02) for i in draws]
        resampled[f"{n} rounds, A/A answered by the second dp_tp"] = {
            "with the noise floor": float(np.mean([v.answer == 0 for v in verdicts])),
            "with the margin alone": float(np.mean([v.searched_over_best < 0.98 for v in verdicts])),
            "median noise floor": float(np.median([v.noise for v in verdicts]))}
    summary = {
        "command": command,
        "model": f"{args.model}-tiny", "processes": 2, "devices_per_process": 4, "mesh": [4, 2],
        "rounds": args.rounds, "iterations": args.iterations, "nearest_dp_tp": raw["nearest_dp_tp"],
        "round_spread": {k: float(v.std() / np.median(v)) for k, v in r.items()},
        "dp_tp_again_over_dp_tp": {"paired": paired(b, a), "medians": medians(b, a)},
        "nearest_over_dp_tp": {"paired": paired(r["nearest dp_tp"], a), "medians": medians(r["nearest dp_tp"], a)},
        "aa_resampled": resampled,
        "rounds_s": raw["rounds_s"],
        # The machine that raced the rounds (--reuse computes from them again, elsewhere maybe).
        "machine": raw["machine"] if args.reuse else {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                      "python": platform.python_version()},
    }
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"a round's spread: {', '.join(f'{k} {v:.3f}' for k, v in summary['round_spread'].items())}")
    print(f"dp_tp again / dp_tp: paired {paired(b, a):.3f}, medians {medians(b, a):.3f}; nearest / dp_tp: paired "
          f"{summary['nearest_over_dp_tp']['paired']:.3f}, medians {summary['nearest_over_dp_tp']['medians']:.3f}")
    for k, v in resampled.items():
        print(f"A/A over {k}: " + ", ".join(f"{name} {x:.3f}" for name, x in v.items()))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
