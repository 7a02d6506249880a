"""mode=profile: the CFP profile pass (after the analysis it needs).

Every plan combination of every unique segment is compiled as a program of that segment alone
on the job's devices and timed (but for CFP's shortcuts: not one over ``mode.memory_budget_gb``,
and not in full one whose first runs are over ``mode.early_stop_ratio`` times its segment's
best); results go to the profile store (``mode.store_dir``, shared by runs and resumable) and
``profiles.json`` in the run dir, beside each mesh's analysis files (with ``mode.mesh_shape=auto``,
in a folder ``mesh_<shape>/`` per mesh). ``mode.enumerate=true`` adds the communication study:
every uniform plan (all blocks on plan k) of the whole training step, with the collective volume
of its compiled program, an estimate of the time spent communicating and the measured step
time. The passes are ``launcher.cfp.pipeline``'s, the result's fields ``launcher.cfp.results``'.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from launcher.cfp import pipeline, results
from launcher.cfp.options import ProfileOptions
from launcher.modes.cfp_config import ProfileConfig


@dataclass
class Config(ProfileConfig):
    name: str = "profile"
    code: str = "profile"


def run(ctx: Any) -> dict:
    t0 = time.perf_counter()
    cfg = ctx.mode_cfg  # Config.check refused a mode.hlo_file before submission
    log = lambda line: ctx.log.info("%s", line)
    on = pipeline.analyze_meshes(ctx.model(), cfg.mesh_shape, learning_rate=cfg.learning_rate, log=log)
    for o in on:
        ctx.write_files(o.files())
    on = pipeline.profile_meshes(on, ProfileOptions.of(cfg), is_main=ctx.is_main, log=log, progress=ctx.progress)
    for o in on:
        ctx.write_json(o.folder + "profiles.json", o.profiles_json())
    result = results.profile_fields(on)
    if cfg.enumerate:
        studies = [{"mesh_shape": o.shape,
                    "plans": pipeline.communication_study(o.analyzed, o.mesh, iterations=cfg.iterations,
                                                          repeats=cfg.run_repeats, seed=ctx.cfg.seed, log=log)}
                   for o in on]
        result["communication_study"] = studies if len(on) > 1 else studies[0]["plans"]
    result["mode_wall_s"] = time.perf_counter() - t0
    return result
