"""mode=profile: the CFP profile pass (after the analysis it needs).

Every plan combination of every unique segment is compiled as a program of that segment alone
on the job's devices and timed; results go to the profile store (``mode.store_dir``, shared by
runs and resumable) and ``profiles.json`` in the run dir. ``mode.enumerate=true`` adds the
communication study: every uniform plan (all blocks on plan k) of the whole training step, with
the collective volume of its compiled program, an estimate of the time spent communicating and
the measured step time. The passes are ``launcher.cfp.pipeline``'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from launcher.modes.analysis import Config as AnalysisConfig
from launcher.modes.analysis import write_files


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

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission: the analysis's checks, and no mode.hlo_file (see the message)."""
        from launcher.errors import UserError

        if mode.hlo_file:
            raise UserError(f"mode={mode.name} runs the model's training step; mode.hlo_file={mode.hlo_file!r} is "
                            "for mode=analysis only (a module alone cannot be re-run under other plans)")
        super().check(mode, job)


def analyze_and_profile(ctx: Any) -> tuple[Any, Any, Any]:
    """(Analyzed, mesh, Profiled) for the job's devices: ``launcher.cfp.pipeline``'s analysis and
    profile passes with this mode's options; writes the analysis files and ``profiles.json``."""
    from launcher.cfp import pipeline

    cfg = ctx.mode_cfg  # Config.check refused a mode.hlo_file before submission
    log = lambda line: ctx.log.info("%s", line)
    mesh = pipeline.make_mesh(pipeline.default_mesh_shape(cfg.mesh_shape))  # a mesh that does not fit fails first
    analyzed = pipeline.analyze(ctx.model(), mesh_shape=cfg.mesh_shape, learning_rate=cfg.learning_rate, log=log)
    write_files(ctx, analyzed)
    profiled = pipeline.profile(analyzed, mesh, store_dir=cfg.store_dir, repeats=cfg.repeats, warmup=cfg.warmup,
                                cold_caches=cfg.cold_caches, max_segment_space=cfg.max_segment_space,
                                overlap_compile=cfg.overlap_compile, is_main=ctx.is_main, log=log,
                                progress=ctx.progress)
    ctx.write_json("profiles.json", profiled.to_json(analyzed.analysis))
    return analyzed, mesh, profiled


def run(ctx: Any) -> dict:
    from launcher.cfp import pipeline

    t0 = time.perf_counter()
    cfg = ctx.mode_cfg
    analyzed, mesh, profiled = analyze_and_profile(ctx)
    analysis, profiles = analyzed.analysis, profiled.profiles
    result = {**analysis.summary(), "mesh_shape": list(analysis.mesh_shape),
              "profiled_configs": profiles.profiled_configs, "measured_configs": profiles.measured,
              "reused_configs": profiles.reused, "profile_time_s": profiles.seconds,
              "units": len(profiles.units), "reshard_pairs": len(profiles.reshard)}
    if cfg.enumerate:
        result["communication_study"] = pipeline.communication_study(
            analyzed, mesh, iterations=cfg.iterations, repeats=cfg.run_repeats, seed=ctx.cfg.seed,
            log=lambda line: ctx.log.info("%s", line))
    result["mode_wall_s"] = time.perf_counter() - t0
    return result
