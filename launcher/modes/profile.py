"""mode=profile: the CFP profile pass (after the analysis it needs).

Every plan combination of every unique segment is compiled as a program of that segment alone
on the job's devices and timed (but for CFP's shortcuts: not one over ``mode.memory_budget_gb``,
and not in full one whose first runs are over ``mode.early_stop_ratio`` times its segment's
best); results go to the profile store (``mode.store_dir``, shared by runs and resumable) and
``profiles.json`` in the run dir. ``mode.enumerate=true`` adds the
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
    memory_budget_gb: float = 0.0  # per device; 0 = unlimited (mode=search's plans must fit it too)
    # CFP's profiling shortcuts (launcher/cfp/profile/candidates.py). A combination no plan
    # within mode.memory_budget_gb can hold (its compiled memory plus the least the other
    # segments need, where known) is not timed (a later run with a larger budget times it).
    skip_over_budget: bool = True
    # A combination whose first 2 timed runs are all over this many times the fastest of its
    # segment timed so far is timed no further (its time, a bound, is stored as such; a later
    # run with a larger ratio or 0 times it in full). 0: time every combination in full.
    early_stop_ratio: float = 1.5
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
        if mode.early_stop_ratio < 0:
            raise UserError(f"mode.early_stop_ratio={mode.early_stop_ratio}: must be 0 (off) or more (e.g. 1.5)")
        super().check(mode, job)


def analyses(ctx: Any, two_axis_only: bool = True) -> list[tuple[Any, Any, str]]:
    """(Analyzed, mesh, folder) per logical mesh of ``mode.mesh_shape`` (``auto``: every mesh
    worth searching, ``launcher/cfp/search/meshes.py``, analysed with ``two_axis_only``), the
    analysis files written into the run dir (with ``auto``, into the folder ``mesh_<shape>/`` of
    each). With ``auto``, a mesh the model cannot divide is left out (the log says why); with one
    shape it is refused."""
    import jax

    from launcher.cfp import pipeline
    from launcher.cfp.search.meshes import is_auto, mesh_shapes
    from launcher.errors import UserError

    cfg = ctx.mode_cfg
    log = lambda line: ctx.log.info("%s", line)
    auto = is_auto(cfg.mesh_shape)
    shapes = mesh_shapes(cfg.mesh_shape, jax.device_count())
    if auto:
        log("mode.mesh_shape=auto: searching the logical meshes %s of the %d devices" % (shapes, jax.device_count()))
    model = ctx.model()
    out, refused = [], []
    for shape in shapes:
        mesh = pipeline.make_mesh(shape)  # a mesh that does not fit fails first
        try:
            analyzed = pipeline.analyze(model, mesh_shape=shape, learning_rate=cfg.learning_rate,
                                        two_axis_only=auto and two_axis_only, log=log)
        except UserError as e:
            if not auto:
                raise
            refused.append(f"{shape}: {e}")
            log("mesh %s: left out: %s" % (shape, e))
            continue
        folder = f"mesh_{'x'.join(map(str, shape))}/" if auto else ""
        write_files(ctx, analyzed, folder)
        out.append((analyzed, mesh, folder))
    if not out:
        raise UserError("mode.mesh_shape=auto: the model divides none of the meshes of %d devices: %s"
                        % (jax.device_count(), "; ".join(refused)))
    return out


def analyze_and_profile(ctx: Any) -> list[Any]:
    """One ``pipeline.OnMesh`` per mesh of ``analyses``: ``launcher.cfp.pipeline``'s profile
    pass with this mode's options after the analysis; ``profiles.json`` beside each mesh's
    analysis files."""
    from launcher.cfp import pipeline

    cfg = ctx.mode_cfg  # Config.check refused a mode.hlo_file before submission
    log = lambda line: ctx.log.info("%s", line)
    out = []
    for analyzed, mesh, folder in analyses(ctx):
        profiled = pipeline.profile(analyzed, mesh, store_dir=cfg.store_dir, repeats=cfg.repeats, warmup=cfg.warmup,
                                    cold_caches=cfg.cold_caches, max_segment_space=cfg.max_segment_space,
                                    overlap_compile=cfg.overlap_compile, memory_budget_gb=cfg.memory_budget_gb,
                                    skip_over_budget=cfg.skip_over_budget, early_stop_ratio=cfg.early_stop_ratio,
                                    is_main=ctx.is_main, log=log, progress=ctx.progress)
        ctx.write_json(folder + "profiles.json", profiled.to_json(analyzed.analysis))
        out.append(pipeline.OnMesh(analyzed, mesh, profiled.profiles))
    from launcher.cfp.profile.budget import refuse_if_nothing_fits
    refuse_if_nothing_fits([o.shape for o in out], [o.profiles for o in out])  # no mesh has a plan within budget
    return out


def mesh_fields(on: Any) -> dict:
    """The result fields of one mesh's analysis and profile."""
    analysis, profiles = on.analyzed.analysis, on.profiles
    return {**analysis.summary(), "mesh_shape": list(analysis.mesh_shape),
            "profiled_configs": profiles.profiled_configs, "measured_configs": profiles.measured,
            "reused_configs": profiles.reused, "profile_time_s": profiles.seconds,
            # Of the table (reused entries included): not timed, over the memory budget; and
            # timed only until the early stop (launcher/cfp/profile/candidates.py).
            "over_budget_configs": profiles.over_budget_configs,
            "stopped_early_configs": profiles.stopped_early_configs,
            "units": len(profiles.units), "reshard_pairs": len(profiles.reshard)}


def run(ctx: Any) -> dict:
    from launcher.cfp import pipeline

    t0 = time.perf_counter()
    cfg = ctx.mode_cfg
    on = analyze_and_profile(ctx)
    result = mesh_fields(on[0])
    if len(on) > 1:
        result = {"meshes": [mesh_fields(o) for o in on],
                  **{k: sum(mesh_fields(o)[k] for o in on) for k in ("profiled_configs", "measured_configs",
                                                                    "reused_configs", "profile_time_s",
                                                                    "over_budget_configs", "stopped_early_configs")}}
    if cfg.enumerate:
        result["communication_study"] = [
            {"mesh_shape": o.shape,
             "plans": pipeline.communication_study(o.analyzed, o.mesh, iterations=cfg.iterations,
                                                   repeats=cfg.run_repeats, seed=ctx.cfg.seed,
                                                   log=lambda line: ctx.log.info("%s", line))}
            for o in on] if len(on) > 1 else pipeline.communication_study(
                on[0].analyzed, on[0].mesh, iterations=cfg.iterations, repeats=cfg.run_repeats, seed=ctx.cfg.seed,
                log=lambda line: ctx.log.info("%s", line))
    result["mode_wall_s"] = time.perf_counter() - t0
    return result
