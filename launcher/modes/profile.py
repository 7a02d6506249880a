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
from launcher.modes.analysis import run_analysis


@dataclass
class Config(AnalysisConfig):
    name: str = "profile"
    store_dir: str = "outputs/cfp_profiles"  # shared by runs: entries are reused and resumed
    repeats: int = 5               # timed runs per candidate (the median counts)
    warmup: int = 1                # untimed runs before them
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
    analysis, program, _ = run_analysis(ctx)
    mesh = make_mesh(analysis.mesh_shape, jax.devices())
    store = ProfileStore(Path(cfg.store_dir).expanduser().resolve())
    ctx.log.info("profile store: %s (%d entries)", store.root, len(store))
    overlap = cfg.overlap_compile if cfg.overlap_compile is not None else jax.devices()[0].platform != "cpu"
    ctx.log.info("profile: compiling the next candidate %s", "while timing the current one" if overlap else
                 "after timing the current one (mode.overlap_compile=true to overlap)")
    profiler = Profiler(analysis, mesh, store, repeats=cfg.repeats, warmup=cfg.warmup,
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
                      "mem_bytes": e["mem_bytes"]} for k, combos in profiles.table.items() for c, e in combos.items()],
        "reshard": [{"shape": list(k[0][0]), "dtype": k[0][1], "src": [list(a) for a in k[1]],
                     "dst": [list(a) for a in k[2]], "time_s": v} for k, v in profiles.reshard.items()],
        "exhaustive_space": analysis.exhaustive_space, "segment_space": analysis.segment_space,
    }


def communication_study(ctx: Any, analysis: Any, program: Any, mesh: Any) -> list[dict]:
    """Every uniform plan of the whole step: collective volume, communication estimate, step time."""
    from launcher.cfp.comm import collectives, total_bytes
    from launcher.cfp.measure import run_plan

    cfg = ctx.mode_cfg
    bandwidth = allreduce_bandwidth(mesh)
    ctx.log.info("all-reduce bandwidth on the mesh: %.3f GB/s (used to estimate communication time: this "
                 "backend's profiler trace does not separate collectives)", bandwidth / 1e9)
    rows = []
    for k in range(max(b.num_plans for b in analysis.blocks)):
        assignment = {b.id: min(k, b.num_plans - 1) for b in analysis.blocks}
        r = run_plan(analysis, program, assignment, mesh, iterations=cfg.iterations, repeats=cfg.run_repeats,
                     seed=ctx.cfg.seed, name=f"uniform{k}")
        stats = collectives(r.compiled.as_text())
        volume = total_bytes(stats)
        comm = volume / bandwidth
        row = {"plan": k, "comm_volume_bytes": volume, "collectives": stats, "step_time_s": r.step_time_s,
               "comm_time_s": comm, "compute_time_s": max(r.step_time_s - comm, 0.0),
               "comm_time_method": "estimate: collective bytes / measured all-reduce bandwidth",
               "memory_gb": r.memory_bytes / 2**30}
        rows.append(row)
        ctx.log.info("Uniform plan %d: Comm Volume: %.3f MB, comm time %.6f s (estimate), compute %.6f s, "
                     "step %.6f s", k, volume / 1e6, comm, row["compute_time_s"], r.step_time_s)
    return rows


def allreduce_bandwidth(mesh: Any, mib: float = 4.0, repeats: int = 5) -> float:
    """Bytes per second per device of an all-reduce over every device of ``mesh``."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from launcher.cfp.profile import timed_runs, _slowest_process

    n = mesh.devices.size
    per = max(int(mib * 2**20 / 4), 1)
    sharded = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    x = jax.make_array_from_callback((n, per), sharded, lambda idx: np.ones((1, per), np.float32))
    f = jax.jit(lambda y: y.sum(axis=0, keepdims=True), in_shardings=sharded,
                out_shardings=NamedSharding(mesh, PartitionSpec())).lower(x).compile()
    t = float(np.median(_slowest_process(timed_runs(f, [x], 1, repeats))))
    return per * 4 / t


def run(ctx: Any) -> dict:
    t0 = time.perf_counter()
    analysis, program, mesh, profiles = run_profile(ctx)
    result = {**analysis.summary(), "mesh_shape": list(analysis.mesh_shape),
              "profiled_configs": profiles.profiled_configs, "measured_configs": profiles.measured,
              "reused_configs": profiles.reused, "profile_time_s": profiles.seconds,
              "units": len(profiles.units), "reshard_pairs": len(profiles.reshard)}
    if ctx.mode_cfg.enumerate:
        result["communication_study"] = communication_study(ctx, analysis, program, mesh)
    result["mode_wall_s"] = time.perf_counter() - t0
    return result
