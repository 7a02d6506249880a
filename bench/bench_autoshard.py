"""Auto-sharding a Flax model written without xlaunch in mind, against what a user would write.

    python bench/bench_autoshard.py [--devices 8] [--mesh auto] [--algorithm cfp] [--iterations 10]
                                    [--repeats 14] [--search-settings full|small]

In a process with ``--devices`` virtual CPU devices (on a machine with accelerators, its own):
the Flax NNX transformer of ``tests/autoshard_models.py`` (a larger configuration, ``MODEL``)
is auto-sharded from Python (``launcher.cfp.autoshard``, the hand-written tensor-parallel layout
given as the user's ``in_shardings``, as a user would hand it), then its plan races, in the
same interleaved rounds (``--repeats`` of ``--iterations`` steps each, ``search/measure.py:
race``), against:

- ``dp``: the batch split over every device, the state replicated;
- ``fsdp``: every state leaf split on its largest dimension the device count divides;
- ``tp``: Megatron's layout written by hand (``tensor_parallel``): a (data, model) mesh with
  ``model`` of 2, the attention heads and the MLP's hidden columns split over ``model`` (the
  output projections' rows), the vocabulary too (embedding rows, head columns), the batch over
  ``data``; the optimizer state as its parameters;
- ``cfp again``: the searched plan compiled a second time, the A/A floor: any ratio is only as
  exact as this one's distance from 1.

Reported: the searched plan's time over each baseline's, paired (the median over rounds of the
ratio within a round, which cancels the machine's drift) and as the ratio of median rounds; the
floor; the plan's source (search optimum, nearest dp...) and mesh; the search's own wall time.
Results go to bench/results/bench_autoshard.json (``--out``).

``--search-settings small`` (the search's smallest settings, a few minutes on a 2-core machine)
checks the bench end to end; the measurement to report is the default (``full``: mode=search's
defaults: tens of minutes on 8 virtual devices of a quiet 2-core machine, most of it profiling
the three meshes of 8 devices).
Timings on a shared machine are noisy: the file keeps every round.
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

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "bench_autoshard.json"

# Larger than the tests' model; every dimension the plans split divides 8 devices (a learning rate at
# which its training is stable, so the losses under each layout stay comparable).
MODEL = dict(vocab=512, width=64, heads=4, ffn=256, layers=4, seq=32, batch=16, lr=1e-3)
SMALL = dict(repeats=2, max_segment_space=6, iterations=2, run_repeats=2, verify_top_k=1, verify_iterations=2,
             verify_repeats=2)


def tensor_parallel(state, batch, devices):
    """Megatron's layout of the Flax model's state and batch, as a user would write it: rules on
    the parameters' paths, the optimizer state laid out as its parameters."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(devices).reshape(-1, 2), ("data", "model"))
    rules = [  # (path contains, leaf rank) -> spec
        (("attn", "query", "kernel"), P(None, "model", None)), (("attn", "key", "kernel"), P(None, "model", None)),
        (("attn", "value", "kernel"), P(None, "model", None)), (("attn", "query", "bias"), P("model", None)),
        (("attn", "key", "bias"), P("model", None)), (("attn", "value", "bias"), P("model", None)),
        (("attn", "out", "kernel"), P("model", None, None)),
        (("up", "kernel"), P(None, "model")), (("up", "bias"), P("model")), (("down", "kernel"), P("model", None)),
        (("embed", "embedding"), P("model", None)), (("head", "kernel"), P(None, "model")),
        (("head", "bias"), P("model")),
    ]

    def spec(path, leaf):
        keys = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]
        for names, s in rules:
            if all(n in keys for n in names) and len(s) == leaf.ndim:
                return NamedSharding(mesh, s)
        return NamedSharding(mesh, P())

    state_sh = jax.tree_util.tree_map_with_path(spec, state)
    batch_sh = jax.tree.map(lambda x: NamedSharding(mesh, P("data")), batch)
    return state_sh, batch_sh


def worker(args: argparse.Namespace) -> dict:
    import jax

    sys.path.insert(0, str(REPO))
    from launcher.cfp.apply import constrained_step
    from launcher.cfp.autoshard import autoshard
    from launcher.cfp.search.measure import StepRunner, baseline_runner, race
    from launcher.cfp.user_step import step_program
    from tests.autoshard_models import make_flax_step

    log = lambda line: print(f"[autoshard] {line}", file=sys.stderr, flush=True)
    step, (state, batch) = make_flax_step(**MODEL)
    tp = tensor_parallel(state, batch, jax.devices())
    settings = SMALL if args.search_settings == "small" else {}
    mesh_shape = args.mesh if args.mesh == ["auto"] else [int(n) for n in args.mesh]
    t0 = time.perf_counter()
    answer = autoshard(step, state, batch, in_shardings=tp, mesh_shape="auto" if mesh_shape == ["auto"] else mesh_shape,
                       algorithm=args.algorithm, store_dir=args.store, log=log, **settings)
    search_s = time.perf_counter() - t0
    # autoshard hands back the answer (the fastest plan its race measured, which may be a
    # baseline's layout); the bench races the searched plan itself.
    plan = answer.own or answer
    log(f"the answer: {answer.row} ({answer.why})")
    log(f"searched plan: {plan.source} on mesh {plan.mesh_shape}, predicted {plan.predicted_step_time_s:.6f} s")

    program = step_program(step, (state, batch), in_shardings=tp)
    body, in_shardings, _ = constrained_step(program.step, program.args, plan.constraints, plan.mesh())
    runners = [StepRunner("cfp", program, body, in_shardings), StepRunner("cfp again", program, body, in_shardings)]
    runners += [baseline_runner(program, name, jax.devices()) for name in ("dp", "fsdp", "user")]
    runners[-1].name = "tp"
    runs = {r.name: r for r in race(runners, iterations=args.iterations, repeats=args.repeats)}
    cfp, again = runs.pop("cfp"), runs.pop("cfp again")
    floor = abs(paired(again, cfp) - 1)
    return {
        "model": MODEL, "algorithm": args.algorithm, "devices": jax.device_count(),
        "platform": jax.devices()[0].platform,
        "search_settings": args.search_settings, "search_wall_s": search_s,
        "source": plan.source, "mesh_shape": plan.mesh_shape, "meshes": plan.meshes, "answer": answer.row,
        "answer_why": answer.why,
        "predicted_step_time_s": plan.predicted_step_time_s, "step_time_s": cfp.step_time_s,
        "repeat_times_s": cfp.repeat_times_s, "memory_gb": cfp.memory_bytes / 2**30,
        "cfp_again_repeat_times_s": again.repeat_times_s,
        "aa_floor": floor,
        "baselines": {name: r.summary() for name, r in runs.items()},
        "searched_over": {name: {"paired": paired(cfp, r), "medians": cfp.step_time_s / r.step_time_s,
                                 "beyond_floor": paired(cfp, r) < 1 - floor}
                          for name, r in runs.items()},
        "search_comparison": plan.comparison(),   # the search's own race (its settings' rounds)
        # The same training under every layout: the largest relative difference of a loss from the
        # searched plan's at the same step (float sums in another order: ~1e-6 to 1e-5).
        "losses_max_rel_diff": max(abs(a - b) / abs(a) for r in runs.values() for a, b in zip(cfp.losses, r.losses, strict=True)),
        "losses": {"cfp": cfp.losses, **{name: r.losses for name, r in runs.items()}},
    }


def paired(run, other) -> float:
    return statistics.median(t / u for t, u in zip(run.repeat_times_s, other.repeat_times_s, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=8, help="virtual CPU devices (no effect on accelerators)")
    ap.add_argument("--mesh", nargs="+", default=["auto"], help="auto, or a mesh shape, e.g. --mesh 4 2")
    ap.add_argument("--algorithm", choices=["cfp", "ilp"], default="cfp")
    ap.add_argument("--iterations", type=int, default=10, help="steps per round")
    ap.add_argument("--repeats", type=int, default=14, help="interleaved rounds")
    ap.add_argument("--search-settings", choices=["full", "small"], default="full")
    ap.add_argument("--store", default=str(REPO / "outputs" / "cfp_profiles"))
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", *sys.argv[1:]], env=env, stdout=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"worker failed ({proc.returncode})")
    row = {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": time.perf_counter() - t}
    for name, r in row["searched_over"].items():
        print(f"searched ({row['source']}, mesh {row['mesh_shape']}) / {name}: {r['paired']:.3f} paired, "
              f"{r['medians']:.3f} medians{'  (beyond the A/A floor)' if r['beyond_floor'] else ''}")
    print(f"A/A floor {row['aa_floor']:.3f}; search {row['search_wall_s']:.0f} s; losses under every layout within "
          f"{row['losses_max_rel_diff']:.1e} (relative) of the searched plan's")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "iterations": args.iterations,
                               "repeats": args.repeats, **row}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
