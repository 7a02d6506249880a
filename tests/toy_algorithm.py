"""A sharding algorithm defined outside the package, as a user adds one: this module alone
(``mode.algorithm=first mode.algorithm_module=tests.toy_algorithm``), importing the public
algorithm API only (``launcher/sharding/algorithms/base.py``). It plans every ParallelBlock
with its first plan on the first mesh analysed; the orchestration analyses, races it beside the
baselines, answers and writes the run dir as for CFP's plan or the ILP's."""

from __future__ import annotations

from typing import Sequence

from launcher.sharding.algorithms.base import Algorithm, Hooks, OnMesh, Planned


class FirstPlans(Algorithm):
    name = "first"
    description = "every block's first plan"
    option_names = ("first_note",)

    def plan(self, on: Sequence[OnMesh], hooks: Hooks) -> Planned:
        where = on[0]
        assignment = [0] * len(where.analyzed.analysis.blocks)
        hooks.log(f"first: plan {assignment} on mesh {where.shape} ({self.setting('first_note') or ''})")
        return Planned(self.name, self.row, where, where.plan_of(assignment, self.row),
                       where.runner(assignment, name=self.row, seed=self.options.seed), "first plans",
                       predicted_step_time_s=None, predicted_memory_bytes=None,
                       fields={"plan": {"assignment": assignment, "mesh_shape": where.shape}, "first_blocks": len(assignment)},
                       files={"first_plan.txt": f"{assignment} on mesh {where.shape}\n"})
