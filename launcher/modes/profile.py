"""mode=profile: the CFP profile pass (after the analysis it needs).

Every plan combination of every unique segment is compiled as a program of that segment alone
on the job's devices and timed (but for CFP's shortcuts: not one over ``mode.memory_budget_gb``,
and not in full one whose first runs are over ``mode.early_stop_ratio`` times its segment's
best); results go to the profile store (``mode.store_dir``, shared by runs and resumable) and
``profiles.json`` in the run dir, beside each mesh's analysis files (with ``mode.mesh_shape=auto``,
in a folder ``mesh_<shape>/`` per mesh). ``mode.enumerate=true`` adds the communication study:
every uniform plan (all blocks on plan k) of the whole training step, with the collective volume
of its compiled program, an estimate of the time spent communicating and the measured step
time. The passes are ``launcher.sharding.pipeline``'s, the result's fields ``launcher.sharding.results``',
run by ``launcher/modes/runs/profile.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.modes.cfp_config import ProfileConfig
from launcher.figures import Figure, Figures, seconds


@dataclass
class Config(ProfileConfig):
    name: str = "profile"
    code: str = "profile"


# --- what a run of it says (launcher/cli/console.py; a sweep's table: figures) ------------------------

figures = Figures((
    Figure("profile_time", "profile time", "s", True, lambda r: r["profile_time_s"]),
    Figure("combinations", "combinations", "", None, lambda r: r["profiled_configs"]),
))


def answer(r: dict) -> str:
    return (f"profile: {r.get('profiled_configs')} segment combinations ({r.get('measured_configs')} measured now, "
            f"{r.get('reused_configs')} reused from the store; {r.get('over_budget_configs', 0)} over the memory "
            f"budget, {r.get('stopped_early_configs', 0)} stopped early) in {seconds(r.get('profile_time_s', 0.0))}")


def line(r: dict) -> str:
    return f"{r.get('profiled_configs')} combinations, {r.get('measured_configs')} measured"
