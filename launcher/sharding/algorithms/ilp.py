"""The Alpa-style ILP (``launcher/sharding/ilp/``) as an algorithm: nothing profiled; on every mesh
analysed the collectives are calibrated into the profile store (once per mesh and machine), the
ILP solved under the profile's memory budget, and the plan its cost model predicts fastest kept.
Raced alone (``mode.algorithm=ilp``) or beside CFP's plan (``alpa_ilp`` in ``mode.baselines``).
Its own option, the solver's time limit (``mode.ilp_time_limit_s``, ``autoshard(ilp_time_limit_s=...)``),
is ``IlpOptions``'."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from launcher.sharding.algorithms.base import Algorithm, Hooks, OnMesh, Planned
from launcher.sharding.ilp import NAME
from launcher.sharding.options import Options, ProfileOptions, SearchOptions


# Why the ILP kept its plan over the plan nearest a baseline that is the baseline's own layout
# (sharding/behind.py, where the race measured it behind).
KEPT_BECAUSE = "the ILP's cost model predicted its plan faster (it measures no plan before the race)"


@dataclass(frozen=True)
class IlpOptions(Options):
    """The Alpa-style ILP's options (``launcher/sharding/ilp/``)."""

    # Its collective cost model is calibrated into the profile's store (once per mesh, with the
    # profile's repeats), and it solves under the profile's memory budget.
    profile: ProfileOptions = ProfileOptions()
    time_limit_s: float = 300.0  # HiGHS's limit per mesh; the best plan found by then is kept


class AlpaIlp(Algorithm):
    name = "ilp"
    row = NAME
    title = "the Alpa-style ILP's plan"
    heading = "The ILP's plan"
    description = "the Alpa-style ILP"
    color = "tab:orange"
    two_axis_only = False   # every strategy analysed: the ILP drops those that leave an axis repeating work
    option_defaults = {"ilp_time_limit_s": IlpOptions.time_limit_s}

    def __init__(self, options: SearchOptions, settings: Mapping[str, object] = {}) -> None:  # noqa: B006 - read only
        super().__init__(options, settings)
        self.ilp = IlpOptions(profile=options.profile, time_limit_s=float(self.setting("ilp_time_limit_s")))

    def plan(self, on: Sequence[OnMesh], hooks: Hooks) -> Planned:
        from launcher.sharding.ilp.plan import ilp_over_meshes  # noqa: PLC0415 - JAX
        from launcher.sharding.measuring.store import ProfileStore  # noqa: PLC0415

        p = self.ilp.profile
        store = ProfileStore(Path(p.store_dir).expanduser().resolve())
        planned = ilp_over_meshes([(o.analyzed.analysis, o.mesh) for o in on], store,
                                  memory_budget_bytes=p.memory_budget_bytes, repeats=p.repeats,
                                  time_limit_s=self.ilp.time_limit_s, is_main=hooks.is_main, log=hooks.log)
        where = next(o for o in on if o.mesh is planned.mesh)
        meshes = planned.meshes or [{"mesh_shape": planned.mesh_shape,
                                     "predicted_step_time_s": planned.predicted_step_time_s}]
        summary = planned.summary()
        fields = {"algorithm": self.name,
                  "plan": {"mesh_shape": planned.mesh_shape, "block_assignment": planned.block_assignment}, **summary}
        return Planned(self.name, self.row, where, planned.plan, planned.runner(where.analyzed.program,
                                                                                  seed=self.options.seed),
                       "ILP", planned.predicted_step_time_s, planned.solution.memory_bytes, meshes, fields,
                       baseline_fields=summary, files={"ilp_plan.txt": planned.describe()}, details=planned,
                       assignment=planned.block_assignment, measured_before_race=False,
                       kept_because=KEPT_BECAUSE)
