"""mode=profile's run: the CFP analysis and profile passes over every mesh (``launcher.sharding.pipeline``),
and the communication study where asked. The options and what they mean: ``launcher/modes/profile.py``."""

from __future__ import annotations

import time

from launcher.sharding import pipeline, results
from launcher.sharding.algorithms.cfp import profile as cfp_profile
from launcher.sharding.options import ProfileOptions
from launcher.runtime.context import TaskContext


def run(ctx: TaskContext) -> dict:
    t0 = time.perf_counter()
    cfg = ctx.mode_cfg  # Config.check refused a mode.hlo_file before submission
    log = lambda line: ctx.log.info("%s", line)
    on = pipeline.analyze_meshes(ctx.model(), cfg.mesh_shape, learning_rate=cfg.learning_rate, log=log)
    for o in on:
        ctx.write_files(o.files())
    on = cfp_profile.profile_meshes(on, ProfileOptions.of(cfg), is_main=ctx.is_main, log=log, progress=ctx.progress)
    for o in on:
        ctx.write_json(o.folder + "profiles.json", cfp_profile.profiles_json(o.profiles, o.analyzed.analysis))
    result = results.profile_fields(on)
    if cfg.enumerate:
        studies = [{"mesh_shape": o.shape,
                    "plans": cfp_profile.communication_study(o.analyzed, o.mesh, iterations=cfg.iterations,
                                                          repeats=cfg.run_repeats, seed=ctx.cfg.seed, log=log)}
                   for o in on]
        result["communication_study"] = studies if len(on) > 1 else studies[0]["plans"]
    result["mode_wall_s"] = time.perf_counter() - t0
    return result
