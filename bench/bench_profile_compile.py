"""Do the profile's quicker XLA options (``quick_compile``, on CPU devices) rank its programs as the
defaults do? The programs a cold profile compiles (each unit's combinations the rough model ranks
first, ``profile_top_k``), each compiled under XLA's defaults and under ``--options`` (the
profile's, ``candidates.QUICK_CPU_COMPILE``, by default), both timed side by side in interleaved rounds.

    python bench/bench_profile_compile.py [--models gpt llama2] [--meshes 8 4x2] [--rounds 9]
        [--options xla_cpu_use_fusion_emitters=false xla_backend_optimization_level=1 | defaults]

Compiling is nearly all of a cold search on CPU devices (docs/autoshard.md), so options that make
XLA compile faster are tempting; but the profile is only worth its time if it ranks a unit's
combinations as the whole step will run them, and the step compiles under the defaults. Per
model and mesh, reported: the seconds compiling every program takes under each, and the CPU
seconds (XLA's CPU compiler uses several cores for one program); per unit, the **regret** of
choosing by the options' timings: the defaults' time of the combination the options time fastest
over the defaults' fastest (1: the same choice), and the spread of each program's run time under
the options over the defaults'. Results: bench/results/bench_profile_compile.json.

Timings on virtual CPU devices share the machine's cores, so a regret can be noise: ``--options
defaults`` is the A/A (the same executable on both sides), whose regrets are timing's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_cfp_analysis import MODELS  # noqa: E402  (beside this file)

RESULTS = REPO / "bench" / "results" / "bench_profile_compile.json"
DEFAULT_OPTIONS = ["xla_cpu_use_fusion_emitters=false", "xla_backend_optimization_level=1"]   # the profile's on CPU (quick_compile)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(name: str, mesh_shape: list[int], options: dict, rounds: int) -> dict:
    """Every profiled program of ``name``-tiny on ``mesh_shape``, under the defaults and ``options``."""
    import jax

    from bench_cfp_analysis import tiny_model
    from launcher.sharding import pipeline
    from launcher.sharding.options import ProfileOptions
    from launcher.sharding.profile.candidates import CandidateLoop
    from launcher.sharding.profile.keys import StoreKeys
    from launcher.sharding.profile.segment_program import build, synthetic_inputs
    from launcher.sharding.profile.units import profiling_units
    from launcher.sharding.measuring.store import ProfileStore
    from launcher.sharding.measuring.timing import Timer

    analyzed = pipeline.analyze(tiny_model(name), mesh_shape=mesh_shape)
    a = analyzed.analysis
    mesh = pipeline.make_mesh(a.mesh_shape)
    opts = ProfileOptions()
    with tempfile.TemporaryDirectory() as store:
        loop = CandidateLoop(a, mesh, ProfileStore(store), StoreKeys(a, mesh, False), Timer(1, 1),
                             profiling_units(a, opts.max_segment_space), opts, log=lambda line: None)
        todo = loop.candidates()   # the rough model's top_k of each unit kind, as a cold profile picks
    # Both sides name an option (xla_dump_disable_metadata changes nothing XLA makes), so neither
    # is JAX's in-memory cache's executable of a plain compile; with ``--options defaults`` the
    # second side is the first's executable: the A/A.
    base = {"xla_dump_disable_metadata": True}
    sides = {"defaults": base, "options": {**base, **options}}
    compile_s = {k: 0.0 for k in sides}
    compile_cpu_s = {k: 0.0 for k in sides}
    programs = []
    for u, combo in todo:
        sp = loop.program(u)
        fn, shardings = build(a, sp, u.assignment(combo), mesh)
        args = synthetic_inputs(a, sp, shardings)
        lowered = jax.jit(fn, in_shardings=shardings).lower(*args)
        compiled = {}
        for side, o in sides.items():
            t, c = time.perf_counter(), _cpu_s()
            try:
                compiled[side] = lowered.compile(o)
            except Exception as e:  # noqa: BLE001  an option this jaxlib does not know, in XLA's words
                raise SystemExit(f"--options {' '.join(f'{k}={v}' for k, v in options.items())}: {e}") from None
            compile_s[side] += time.perf_counter() - t
            compile_cpu_s[side] += _cpu_s() - c
        programs.append((u.kind, combo, compiled, args))
    # Interleaved rounds, each program under both sides back to back: drift hits both alike.
    times = [{side: [] for side in sides} for _ in programs]
    for _ in range(rounds):
        for (_, _, compiled, args), row in zip(programs, times, strict=True):
            for side, c in compiled.items():
                jax.block_until_ready(c(*args))
                t = time.perf_counter()
                jax.block_until_ready(c(*args))
                row[side].append(time.perf_counter() - t)
    medians = [{side: statistics.median(ts) for side, ts in row.items()} for row in times]
    units_out = []
    for kind in dict.fromkeys(k for k, *_ in programs):
        mine = [(combo, m) for (k, combo, *_), m in zip(programs, medians, strict=True) if k == kind]
        best = min(mine, key=lambda cm: cm[1]["defaults"])
        picked = min(mine, key=lambda cm: cm[1]["options"])
        units_out.append({"unit": list(kind), "combinations": len(mine), "best": list(best[0]),
                          "picked_by_options": list(picked[0]),
                          "regret": picked[1]["defaults"] / best[1]["defaults"],
                          "run_ratios": [m["options"] / m["defaults"] for _, m in mine]})
    ratios = [r for u in units_out for r in u["run_ratios"]]
    return {"model": f"{name}-tiny", "mesh_shape": mesh_shape, "programs": len(programs),
            "compile_s": compile_s, "compile_cpu_s": compile_cpu_s, "units": units_out,
            "max_regret": max(u["regret"] for u in units_out),
            "run_ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt", "llama2"], choices=MODELS,
                    help="built-in models, profiled as their -tiny presets")
    ap.add_argument("--meshes", nargs="+", default=["8", "4x2"], help="logical meshes, e.g. 8 4x2")
    ap.add_argument("--options", nargs="+", default=DEFAULT_OPTIONS, metavar="NAME=VALUE",
                    help="XLA compile options (without --) for the options side; 'defaults': an A/A, "
                         "the same executable on both sides (the regret timing noise alone makes)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    import jax

    from launcher import jaxcompat
    from launcher.hlo._xla import parse_xla_flags

    aa = args.options == ["defaults"]   # an A/A: the regret and the spread timing alone gives
    bad = [] if aa else [o for o in args.options if not o.lstrip("-").startswith("xla_")]
    if bad:
        ap.error(f"--options {' '.join(bad)}: give XLA options as xla_<name>=<value>, "
                 "e.g. xla_cpu_use_fusion_emitters=false, or defaults (the A/A)")
    options = {} if aa else parse_xla_flags(args.options)

    jaxcompat.set_cpu_device_count(args.devices)
    rows = []
    for name in args.models:
        for shape in args.meshes:
            mesh_shape = [int(n) for n in shape.split("x")]
            row = one(name, mesh_shape, options, args.rounds)
            rows.append(row)
            c, cpu = row["compile_s"], row["compile_cpu_s"]
            print(f"{row['model']:>12} {shape:>4}: {row['programs']} programs; compile {c['defaults']:.1f} s "
                  f"({cpu['defaults']:.1f} s CPU) defaults, {c['options']:.1f} s ({cpu['options']:.1f} s CPU) options; "
                  f"run time options/defaults median {row['run_ratio']['median']:.3f} "
                  f"({row['run_ratio']['min']:.3f}-{row['run_ratio']['max']:.3f}); worst unit regret "
                  f"{row['max_regret']:.3f}", flush=True)
    out = {"command": "python bench/bench_profile_compile.py " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d"), "machine": platform.platform(), "cores": os.cpu_count(),
           "jax": jax.__version__, "options": options, "rounds": args.rounds, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
