"""A sharding algorithm defined outside the package, as a user adds one: this module alone
(``mode.algorithm=first mode.algorithm_module=tests.toy_algorithm``), importing the public
algorithm API only (``launcher/sharding/algorithms/base.py``). It plans every ParallelBlock
with its first plan on the first mesh analysed (or, with ``first_plans``, the plans it is
given, block by block in turn); the orchestration analyses, races it beside the baselines,
answers and writes the run dir as for CFP's plan or the ILP's, and asks it why its plan ran
behind a baseline (``behind``), where it did."""

from __future__ import annotations

from typing import Optional, Sequence

from launcher.sharding.algorithms.base import Algorithm, Behind, Hooks, OnMesh, Planned


class FirstPlans(Algorithm):
    name = "first"
    description = "every block's first plan"
    option_names = ("first_note", "first_plans")

    def _plans(self) -> list[int]:
        """``first_plans``: the plan of each block in turn ("01": the first, the second, the
        first...); every block's first by default."""
        return [int(c) for c in str(self.setting("first_plans") or "0")]

    def plan(self, on: Sequence[OnMesh], hooks: Hooks) -> Planned:
        where, plans = on[0], self._plans()
        blocks = where.analyzed.analysis.blocks
        assignment = [plans[b % len(plans)] % block.num_plans for b, block in enumerate(blocks)]
        hooks.log(f"first: plan {assignment} on mesh {where.shape} ({self.setting('first_note') or ''})")
        return Planned(self.name, self.row, where, where.plan_of(assignment, self.row),
                       where.runner(assignment, name=self.row, seed=self.options.seed), "first plans",
                       predicted_step_time_s=None, predicted_memory_bytes=None,
                       fields={"plan": {"assignment": assignment, "mesh_shape": where.shape}, "first_blocks": len(assignment)},
                       files={"first_plan.txt": f"{assignment} on mesh {where.shape}\n"})

    def behind(self, planned: Planned, baseline: str, ratio: float) -> Optional[Behind]:
        told = "".join(map(str, self._plans()))
        return Behind(f"Behind {baseline}: first takes the plans it is told ({told}, block by block) and measures none",
                      f"first's plan ran {ratio:.3f}x {baseline}: it takes plans {told} block by block, as "
                      "its option first_plans tells it, and measures none before the race")
