"""mode=profile: the CFP profile pass (after the analysis it needs).

Every plan combination of every unique segment is compiled as a program of that segment alone
on the job's devices and timed; results go to the profile store (``mode.store_dir``, shared by
runs and resumable) and ``profiles.json`` in the run dir. ``mode.enumerate=true`` adds the
communication study: every uniform plan (all blocks on plan k) of the whole training step, with
the collective volume of its compiled program, an estimate of the time spent communicating and
the measured step time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from launcher.modes.analysis import Config as AnalysisConfig
from launcher.modes.analysis import mesh_shape_of, run_analysis


@dataclass
class Config(AnalysisConfig):
    name: str = "profile"
    store_dir: str = "outputs/cfp_profiles"  # shared by runs: entries are reused and resumed
    # Timed runs per candidate (the median counts). Cheap beside compiling it, and plans of a
    # small model differ by less than one run's noise.
    repeats: int = 10
    warmup: int = 1                # untimed runs before them
    # Every timed run after each device rewrote a buffer larger than its cache, as
    # triton.testing.do_bench does (launcher/cfp/timing.py). Off: on CPU devices it made segment
    # profiles over-predict the whole step as much as warm ones under-predict it
    # (bench/bench_cfp_additivity.py).
    cold_caches: bool = False
    max_segment_space: int = 128   # templates with more combinations are profiled in parts
    # Compile the next candidate while timing this one. null: yes on accelerators, no on CPU
    # devices, where the compiler and the timed program would share (and skew) the same cores.
    overlap_compile: Optional[bool] = None
    enumerate: bool = False        # also run the communication study over uniform plans
    iterations: int = 10           # training steps per repeat when a whole-model plan is run
    run_repeats: int = 3


def run_profile(ctx: Any) -> tuple[Any, Any, Any, Any]:
    """(Analysis, TrainingProgram, mesh, Profiles) for the job's devices."""
    import jax

    from launcher.cfp.apply import make_mesh
    from launcher.cfp.profile import Profiler, split_parts
    from launcher.cfp.store import ProfileStore
    from launcher.errors import UserError

    cfg = ctx.mode_cfg
    if cfg.hlo_file:
        raise UserError(f"mode={cfg.name} runs the model's training step; mode.hlo_file={cfg.hlo_file!r} is for "
                        "mode=analysis only (a module alone cannot be re-run under other plans)")
    mesh = make_mesh(mesh_shape_of(cfg), jax.devices())  # a mesh that does not fit the devices fails first
    analysis, program, _ = run_analysis(ctx)
    store = ProfileStore(Path(cfg.store_dir).expanduser().resolve())
    ctx.log.info("profile store: %s (%d entries)", store.root, len(store))
    overlap = cfg.overlap_compile if cfg.overlap_compile is not None else jax.devices()[0].platform != "cpu"
    ctx.log.info("profile: compiling the next candidate %s", "while timing the current one" if overlap else
                 "after timing the current one (mode.overlap_compile=true to overlap)")
    profiler = Profiler(analysis, mesh, store, repeats=cfg.repeats, warmup=cfg.warmup, cold=cfg.cold_caches,
                        max_space=cfg.max_segment_space, overlap=overlap,
                        log=lambda line: ctx.log.info("%s", line), is_main=ctx.is_main)
    for t in analysis.templates:
        if t.space > cfg.max_segment_space:
            parts = [t.plan_counts[lo:hi] for lo, hi in split_parts(t.plan_counts, cfg.max_segment_space)]
            ctx.log.info("template %d: %d combinations exceed mode.max_segment_space=%d; profiled in parts %s",
                         t.id, t.space, cfg.max_segment_space, parts)
    profiles = profiler.run(lambda total, what: ctx.progress(total, what))
    ctx.write_json("profiles.json", profiles_json(analysis, profiles))
    return analysis, program, mesh, profiles


def profiles_json(analysis: Any, profiles: Any) -> dict:
    return {
        "units": [{"index": u.index, "segment": u.segment, "template": u.kind[0], "part": u.kind[1],
                   "blocks": [u.start, u.end], "plan_counts": u.plan_counts} for u in profiles.units],
        "profiles": [{"template": k[0], "part": k[1], "combination": list(c), "time_s": e["time_s"],
                      "overhead_s": e.get("overhead_s", 0.0), "mem_bytes": e["mem_bytes"]}
                     for k, combos in profiles.table.items() for c, e in combos.items()],
        "reshard": [{"shape": list(k[0][0]), "dtype": k[0][1], "src": [list(a) for a in k[1]],
                     "dst": [list(a) for a in k[2]], "time_s": v} for k, v in profiles.reshard.items()],
        "whole_overhead_s": profiles.whole_overhead_s,
        "allreduce_latency_s": [{"axes": list(axes), "time_s": t} for axes, t in profiles.allreduce_latency_s.items()],
        "gradient_allreduces": [[sorted(map(list, c)) for c in u] for u in profiles.gradient_allreduces or []],
        "exhaustive_space": analysis.exhaustive_space, "segment_space": analysis.segment_space,
    }


def run(ctx: Any) -> dict:
    t0 = time.perf_counter()
    analysis, program, mesh, profiles = run_profile(ctx)
    result = {**analysis.summary(), "mesh_shape": list(analysis.mesh_shape),
              "profiled_configs": profiles.profiled_configs, "measured_configs": profiles.measured,
              "reused_configs": profiles.reused, "profile_time_s": profiles.seconds,
              "units": len(profiles.units), "reshard_pairs": len(profiles.reshard)}
    if ctx.mode_cfg.enumerate:
        from launcher.cfp.measure import communication_study

        cfg = ctx.mode_cfg
        result["communication_study"] = communication_study(
            analysis, program, mesh, iterations=cfg.iterations, repeats=cfg.run_repeats, seed=ctx.cfg.seed,
            log=lambda line: ctx.log.info("%s", line))
    result["mode_wall_s"] = time.perf_counter() - t0
    return result
