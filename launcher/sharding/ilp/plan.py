"""The ILP's plan for a program: calibrate, formulate, solve, and the plan in CFP's terms.

``ilp_plan`` runs the steps in order (the solver is checked first and the graph next, so bad
input fails before anything is measured). The solution is a strategy per contraction; it is
expressed through the same layouts mechanism as CFP's plans:

- where it coincides with a CFP plan, i.e. for every ParallelBlock some plan of the block gives
  each of its contractions exactly the strategy the ILP chose, it *is* that block assignment:
  ``apply.plan_json(analysis, assignment)`` and ``measure.plan_runner`` build it, so a plan
  both searches find is the very same program;
- otherwise (the ILP splits a block CFP keeps together, e.g. a weight gradient laid out apart
  from its forward contraction) the layouts are per contraction: the operator graph is itself an
  ``Analysis`` whose blocks are single contractions (``operators.py``), so ``apply.py``'s
  ``plan_constraints`` and ``whole_step`` build its constraints unchanged, over the same
  operator ids and program signature. Either way ``plan.json`` runs with ``mode=train mode.plan=``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.strategies import Strategy, notation
from launcher.sharding.apply import AXIS_NAMES, plan_constraints, plan_json
from launcher.sharding.ilp import NAME
from launcher.sharding.measuring.calibrate import calibrate
from launcher.sharding.measuring.costmodel import CommModel
from launcher.sharding.ilp.formulate import Problem, formulate
from launcher.sharding.ilp.operators import OperatorGraph, check_decidable, operator_graph
from launcher.sharding.ilp.solve import Solution, require_solver, solve
from launcher.sharding.search.measure import plan_runner
from launcher.sharding.search.meshes import for_each_mesh
from launcher.errors import NoPlanFits
from launcher.models.plans import Plan

if TYPE_CHECKING:
    from jax.sharding import Mesh
    from launcher.sharding.program import TrainingProgram


@dataclass
class IlpPlanned:
    analysis: Analysis             # CFP's analysis of the program on the plan's mesh
    mesh: Mesh
    operators: OperatorGraph
    problem: Problem
    solution: Solution
    model: CommModel
    calibrated_now: bool
    calibration_time_s: float      # this run's: reading a stored model takes milliseconds
    formulate_time_s: float
    block_assignment: Optional[list[int]]   # CFP's plan per block, where the solution is one
    plan: Any                               # models.plans.Plan, layouts in its constraints
    meshes: list[dict] = field(default_factory=list)   # per mesh solved (``ilp_over_meshes``)

    @property
    def choice(self) -> dict[int, Strategy]:
        return self.operators.choice(self.solution.choice)

    @property
    def predicted_step_time_s(self) -> float:
        return self.problem.time_s(self.solution.choice)

    @property
    def mesh_shape(self) -> list[int]:
        return list(self.analysis.mesh_shape)

    def runner(self, program: TrainingProgram, *, seed: int = 0, name: str = NAME) -> Any:
        """The plan compiled on its mesh as a ``measure.Runner`` (raced like any other plan)."""
        if self.block_assignment is not None:
            return plan_runner(self.analysis, program, dict(enumerate(self.block_assignment)), self.mesh, seed=seed,
                               name=name)
        return plan_runner(self.operators.analysis, program, dict(enumerate(self.solution.choice)), self.mesh,
                           seed=seed, name=name)

    def summary(self) -> dict:
        """The ILP's fields of ``result.json`` (beside its run's step time, TFLOPS and memory)."""
        s, p = self.solution, self.problem
        return {"solve_time_s": s.solve_time_s, "num_variables": s.num_variables, "num_constraints": s.num_constraints,
                "predicted_step_time_s": self.predicted_step_time_s, "predicted_comm_time_s": s.comm_s,
                "predicted_compute_time_s": p.compute_s, "predicted_memory_gb": s.memory_bytes / 2**30,
                "solver_status": s.status, "calibration_time_s": self.calibration_time_s,
                "calibrated_now": self.calibrated_now, "formulate_time_s": self.formulate_time_s,
                "nodes": len(p.sizes), "plan_space": p.space, "mesh_shape": self.mesh_shape,
                "block_assignment": self.block_assignment, "per_contraction": self.block_assignment is None,
                **({"meshes": self.meshes} if self.meshes else {})}

    def describe(self) -> str:
        """``ilp_plan.txt``: every contraction's strategy and what the ILP charged it."""
        a = self.analysis
        lines = [f"# Alpa-style ILP plan on mesh {list(a.mesh_shape)}: {len(self.problem.sizes)} nodes (one per "
                 f"contraction), {self.solution.num_variables} variables, {self.solution.num_constraints} "
                 f"constraints, solved in {self.solution.solve_time_s:.3f} s ({self.solution.status})",
                 f"# predicted: communication {self.solution.comm_s * 1e3:.3f} ms + computation "
                 f"{self.problem.compute_s * 1e3:.3f} ms, peak {self.solution.memory_bytes / 2**20:.3f} MiB per device",
                 "# CFP block plans: " + (str(self.block_assignment) if self.block_assignment is not None else
                                          "none (the ILP lays out contractions of one block apart): per-contraction "
                                          "layouts"), ""]
        for u, (b, p) in enumerate(zip(self.operators.nodes, self.solution.choice, strict=True)):
            c = a.contractions[b.head]
            lines.append(f"{a.contraction_line(b.head)}  [CFP block {a.owner[b.head]}]")
            lines.append(f"    {p}: {notation(c, b.plans[p])}   node cost {self.problem.node_s[u][p] * 1e6:.1f} us "
                         f"of {len(b.plans)} strategies")
        return "\n".join(lines) + "\n"


def to_blocks(a: Analysis, choice: Mapping[int, Strategy]) -> Optional[list[int]]:
    """The plan per ParallelBlock giving every contraction its strategy in ``choice``, or None
    when some block has no such plan (the first such plan on a tie)."""
    out = []
    for b in a.blocks:
        p = next((p for p in range(b.num_plans) if all(b.strategies[op][p] == choice[op] for op in b.roles)), None)
        if p is None:
            return None
        out.append(p)
    return out


def from_blocks(og: OperatorGraph, a: Analysis, assignment: Sequence[int]) -> Optional[list[int]]:
    """A CFP plan per block as the ILP's strategy index per node, or None when it gives some
    contraction a strategy the ILP does not offer (one leaving a mesh axis idle): the ILP's
    cost model can then price CFP's plan beside its own."""
    out = []
    for b in og.nodes:
        block = a.blocks[a.owner[b.head]]
        s = block.strategies[b.head][assignment[block.id]]
        if s not in b.plans:
            return None
        out.append(b.plans.index(s))
    return out


def ilp_plan(a: Analysis, mesh: Mesh, store: Any, *, memory_budget_bytes: Optional[float] = None, repeats: int = 10,
             time_limit_s: float = 300.0, is_main: bool = True,
             log: Callable[[str], None] = lambda line: None) -> IlpPlanned:
    """Calibrate (or read) the cost model of ``mesh``, formulate ``a``'s ILP, solve it, and
    express the solution as a plan (module doc)."""
    require_solver()
    og = operator_graph(a)
    check_decidable(og)
    model, now, calibration_s = calibrate(mesh, store, repeats=repeats, is_main=is_main, log=log)
    log("ILP cost model %s (%.2f s): %s" % ("calibrated now" if now else "read from the profile store", calibration_s,
                                           "; ".join(model.describe())))
    t0 = time.perf_counter()
    problem = formulate(og, model)
    formulate_s = time.perf_counter() - t0
    solution = solve(problem, memory_budget_bytes, time_limit_s)
    log("ILP: %d nodes, %d edges, plan space %.3g; %d variables, %d constraints; %s in %.3f s (formulated in %.3f s)"
        % (len(problem.sizes), len(problem.edges), problem.space, solution.num_variables, solution.num_constraints,
           solution.status, solution.solve_time_s, formulate_s))
    blocks = to_blocks(a, og.choice(solution.choice))
    if blocks is not None:
        plan = plan_json(a, blocks, NAME)
    else:
        axes = tuple((AXIS_NAMES[i], n) for i, n in enumerate(a.mesh_shape))
        plan = Plan(NAME, axes, {"params": {}, "activations": {}, "inputs": {}},
                    plan_constraints(og.analysis, dict(enumerate(solution.choice))))
    planned = IlpPlanned(a, mesh, og, problem, solution, model, now, calibration_s, formulate_s, blocks, plan)
    log("ILP plan: predicted %.6f s per step (communication %.6f s), %.6f GB per device; %s"
        % (planned.predicted_step_time_s, solution.comm_s, solution.memory_bytes / 2**30,
           f"CFP block plans {blocks}" if blocks is not None else "per-contraction layouts (no CFP block plan "
                                                                   "gives every contraction its strategy)"))
    return planned


def ilp_over_meshes(meshes: Sequence[tuple[Analysis, Any]], store: Any, *,
                    memory_budget_bytes: Optional[float] = None, repeats: int = 10, time_limit_s: float = 300.0,
                    is_main: bool = True, log: Callable[[str], None] = lambda line: None) -> IlpPlanned:
    """``ilp_plan`` on each (analysis, mesh) of the same devices; the plan the ILP's own cost
    model predicts fastest is kept, with a row per mesh in its ``meshes``. The ILP judges
    meshes as it judges strategies, by its model: nothing is measured (CFP, in contrast, measures
    its meshes' shortlists on the whole step). A mesh no plan of which fits the budget is left
    out, unless that is every mesh (``meshes.for_each_mesh``)."""
    shapes = [list(a.mesh_shape) for a, _ in meshes]
    found, reasons = for_each_mesh(
        shapes, lambda i: ilp_plan(*meshes[i], store, memory_budget_bytes=memory_budget_bytes, repeats=repeats,
                                   time_limit_s=time_limit_s, is_main=is_main, log=log),
        refuse=NoPlanFits, none_fit=lambda why: NoPlanFits("no plan fits on any mesh the ILP solved: " + why),
        log=log, what="ILP on mesh")
    rows = [{"mesh_shape": shape, "skipped": why} if p is None else
            {"mesh_shape": p.mesh_shape, "predicted_step_time_s": p.predicted_step_time_s,
             "predicted_memory_gb": p.solution.memory_bytes / 2**30, "solve_time_s": p.solution.solve_time_s,
             "num_variables": p.solution.num_variables}
            for shape, p, why in zip(shapes, found, reasons, strict=True)]
    best = min((p for p in found if p is not None), key=lambda p: p.predicted_step_time_s)
    if len(meshes) > 1:
        best.meshes = rows
        log("ILP: the plan on mesh %s is kept (predicted %s)" % (best.mesh_shape, ", ".join(
            "%s: %.6f s" % (r["mesh_shape"], r["predicted_step_time_s"]) for r in rows if "skipped" not in r)))
    return best


def brute_force(problem: Problem, budget: Optional[float] = None) -> tuple[float, list[int]]:
    """The least communication over every plan of a small problem, and its plan (for tests and
    small checks: it enumerates ``problem.space`` plans)."""
    best: tuple[float, list[int]] = (float("inf"), [])
    for choice in itertools.product(*(range(n) for n in problem.sizes)):
        if budget is not None and problem.memory_bytes(choice) > budget:
            continue
        t = problem.comm_s(choice)
        if t < best[0]:
            best = (t, list(choice))
    return best

