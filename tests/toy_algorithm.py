"""A sharding algorithm defined outside the package, as a user adds one: this module alone
(``mode.algorithm=first mode.algorithm_module=tests.toy_algorithm``). It plans every
ParallelBlock with its first plan on the first mesh analysed; the orchestration analyses, races
it beside the baselines, answers and writes the run dir as for CFP's plan or the ILP's."""

from __future__ import annotations

from typing import Any, Sequence

from launcher.sharding.algorithms.base import Algorithm, Hooks, Planned


class FirstPlans(Algorithm):
    name = "first"
    description = "every block's first plan"
    option_names = ("first_note",)

    def plan(self, on: Sequence[Any], hooks: Hooks) -> Planned:
        from launcher.sharding.apply import plan_json  # noqa: PLC0415 - JAX: the command line imports this module
        from launcher.sharding.search.measure import plan_runner  # noqa: PLC0415

        where = on[0]
        analysis, program = where.analyzed.analysis, where.analyzed.program
        assignment = [0] * len(analysis.blocks)
        hooks.log(f"first: plan {assignment} on mesh {where.shape} ({self.settings.get('first_note', '')})")
        runner = plan_runner(analysis, program, dict(enumerate(assignment)), where.mesh, seed=self.options.seed,
                             name=self.row)
        return Planned(self.name, self.row, where, plan_json(analysis, assignment), runner, "first plans",
                       predicted_step_time_s=None, predicted_memory_bytes=None,
                       fields={"plan": {"assignment": assignment, "mesh_shape": where.shape}, "first_blocks": len(assignment)},
                       files={"first_plan.txt": f"{assignment} on mesh {where.shape}\n"})
