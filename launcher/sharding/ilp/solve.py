"""Solving the ILP (``formulate.Problem``) with HiGHS, through ``highspy``.

Why HiGHS: Alpa solved its ILP with PuLP, which writes the model to a file and runs the CBC
binary it bundles (a solver that has seen few releases since). ``highspy`` is the maintained
HiGHS solver (the MILP solver behind SciPy's ``milp``) as wheels that carry the solver itself:
``pip`` installs it wherever the package index serves Python, with no external binary, it takes
the model as arrays (no file), and it depends on numpy alone, so installing it never touches
the platform's JAX.

The model is Alpa's linearisation. A binary ``s[u, p]`` per node and strategy, one per node;
for every pair of nodes with an edge cost a continuous ``e[u, v, p, q]`` whose row sums are
``s[u, p]`` and column sums ``s[v, q]``: with ``s`` one-hot, the only such ``e`` is the single 1
at the two choices, so ``sum e * cost`` is the edge's cost exactly (and the relaxation is tighter
than Alpa's ``e <= s`` rows). Edges to a node with one strategy fold into the other node's cost.
The objective is in microseconds (the solver's absolute gap is 1e-6). Memory: one row per
program point whose most bytes any plan could have live there exceed the budget (the others
cannot bind).

An infeasible budget is bad input: the message gives the least peak memory any plan needs, found
by a second solve of the same rows with the peak as the objective.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from launcher.sharding.ilp.formulate import Problem
from launcher.errors import NoPlanFits, UserError

TIME_LIMIT_S = 300.0
SCALE = 1e6   # objective in microseconds


@dataclass
class Solution:
    choice: list[int]          # strategy index per node
    comm_s: float              # the objective: predicted communication seconds
    memory_bytes: float        # predicted peak bytes per device
    num_variables: int
    num_constraints: int
    solve_time_s: float
    status: str                # "optimal", or "time limit (gap ...)" with the best plan found


def require_solver() -> Any:
    """The ``highspy`` module, or bad input saying how to get it (before any measuring)."""
    try:
        import highspy  # noqa: PLC0415  a dependency, but a broken install gets the line below
    except ImportError as e:
        raise UserError(f"the ILP solver is missing ({e}): install it with `python -m pip install highspy` "
                        "(xlaunch depends on it: `python -m pip install -e .` installs it too)") from None
    return highspy


def solve(problem: Problem, memory_budget_bytes: Optional[float] = None,
          time_limit_s: float = TIME_LIMIT_S) -> Solution:
    """The plan of least communication whose peak memory fits ``memory_budget_bytes`` (None:
    any); ``NoPlanFits`` (bad input) when none fits, with the least memory any plan needs."""
    t0 = time.perf_counter()
    budget = memory_budget_bytes if memory_budget_bytes else None
    rows = np.zeros(0, dtype=int)
    if budget is not None:
        lo, hi = problem.memory_bounds()
        if (lo > budget).any():
            _no_plan_fits(problem, budget, time_limit_s)
        rows = np.nonzero(hi > budget)[0]
    model = _Model(problem, rows, budget)
    h, status = model.run(time_limit_s)
    if status == "infeasible":
        _no_plan_fits(problem, budget, time_limit_s)
    choice = model.choice(h)
    return Solution(choice, problem.comm_s(choice), problem.memory_bytes(choice), model.num_col, model.num_row,
                    time.perf_counter() - t0, status)


def least_memory(problem: Problem, time_limit_s: float = TIME_LIMIT_S) -> tuple[float, list[int]]:
    """The least peak bytes per device any plan has, and that plan."""
    lo, hi = problem.memory_bounds()
    if not len(lo):
        return 0.0, [0] * len(problem.sizes)
    rows = np.nonzero(hi > lo.max())[0]
    if not len(rows):  # no plan changes the peak: every plan has it
        return float(lo.max()), [0] * len(problem.sizes)
    model = _Model(problem, rows, None, least_memory=True)
    h, status = model.run(time_limit_s)
    if status == "infeasible":
        raise UserError("the ILP solver found no plan at all for this program (HiGHS: infeasible); this is a bug: "
                        "report it with the run dir")
    choice = model.choice(h)
    return problem.memory_bytes(choice), choice


def _no_plan_fits(problem: Problem, budget: float, time_limit_s: float) -> None:
    least, _ = least_memory(problem, time_limit_s)
    raise NoPlanFits(f"no plan fits mode.memory_budget_gb={budget / 2**30:.6g}: the least memory any plan needs is "
                     f"{least / 2**30:.6g} GB per device (predicted by the ILP's liveness model); raise the budget "
                     "or use more devices")


class _Model:
    """The HiGHS model of a problem: columns s (per node and strategy), e (per edge and pair of
    strategies) and, for ``least_memory``, the peak z; rows: one strategy per node, e's row and
    column sums, memory at ``rows`` (the program points kept)."""

    def __init__(self, problem: Problem, rows: np.ndarray, budget: Optional[float], least_memory: bool = False):
        self.problem = problem
        sizes, offsets = problem.sizes, problem.offsets
        n_s = sum(sizes)
        cost = np.concatenate(problem.node_s).astype(np.float64) * SCALE
        edges = []
        for (u, v), m in problem.edges.items():
            if sizes[u] == 1:
                cost[offsets[v]:offsets[v] + sizes[v]] += m[0, :] * SCALE
            elif sizes[v] == 1:
                cost[offsets[u]:offsets[u] + sizes[u]] += m[:, 0] * SCALE
            else:
                edges.append((u, v, m))
        r, c, x = [], [], []            # the constraint matrix, by coordinates
        lower, upper = [], []

        def row(cols: list[int], vals: list[float], lo: float, hi: float) -> None:
            k = len(lower)
            r.extend([k] * len(cols))
            c.extend(cols)
            x.extend(vals)
            lower.append(lo)
            upper.append(hi)

        for o, n in zip(offsets, sizes, strict=True):
            row(list(range(o, o + n)), [1.0] * n, 1.0, 1.0)
        col = n_s
        e_costs = []
        for u, v, m in edges:
            nu, nv = m.shape
            grid = np.arange(col, col + nu * nv).reshape(nu, nv)
            for p in range(nu):
                row([*grid[p].tolist(), offsets[u] + p], [1.0] * nv + [-1.0], 0.0, 0.0)
            for q in range(nv):
                row([*grid[:, q].tolist(), offsets[v] + q], [1.0] * nu + [-1.0], 0.0, 0.0)
            e_costs.append(m.reshape(-1) * SCALE)
            col += nu * nv
        z = col if least_memory else None
        for t in rows:
            nz = np.nonzero(problem.mem_rows[t])[0]
            vals = problem.mem_rows[t][nz] / 2**20       # MiB: coefficients near 1
            const = problem.mem_const[t] / 2**20
            if least_memory:
                row([*nz.tolist(), z], [*vals.tolist(), -1.0], -np.inf, -const)
            else:
                row(nz.tolist(), vals.tolist(), -np.inf, budget / 2**20 - const)
        self.num_col = col + (1 if least_memory else 0)
        self.num_row = len(lower)
        if least_memory:
            self.cost = np.concatenate([np.zeros(n_s), np.zeros(col - n_s), [1.0]])
        else:
            self.cost = np.concatenate([cost, *e_costs]) if e_costs else cost
        self.n_s, self.z = n_s, z
        self.coo = (np.array(r, dtype=np.int64), np.array(c, dtype=np.int64), np.array(x, dtype=np.float64))
        self.bounds = (np.array(lower), np.array(upper))

    def run(self, time_limit_s: float) -> tuple[Any, str]:
        highspy = require_solver()
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit_s))
        h.setOptionValue("mip_rel_gap", 1e-9)
        h.setOptionValue("threads", 1)   # the machine is shared with the training it plans for
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = self.num_col, self.num_row
        lp.col_cost_ = self.cost
        lp.col_lower_ = np.zeros(self.num_col)
        upper = np.ones(self.num_col)
        if self.z is not None:
            upper[self.z] = np.inf   # the peak, in MiB
        lp.col_upper_ = upper
        lp.row_lower_, lp.row_upper_ = self.bounds
        r, c, x = self.coo
        order = np.lexsort((c, r))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.searchsorted(r[order], np.arange(self.num_row + 1)).astype(np.int32)
        lp.a_matrix_.index_ = c[order].astype(np.int32)
        lp.a_matrix_.value_ = x[order]
        lp.integrality_ = [highspy.HighsVarType.kInteger] * self.n_s + \
            [highspy.HighsVarType.kContinuous] * (self.num_col - self.n_s)
        h.passModel(lp)
        h.run()
        status = h.getModelStatus()
        S = highspy.HighsModelStatus
        if status == S.kOptimal:
            return h, "optimal"
        if status == S.kInfeasible:
            return h, "infeasible"
        solved = h.getInfo().primal_solution_status == 2  # a feasible plan was found before the limit
        if status in (S.kTimeLimit, S.kIterationLimit, S.kInterrupt) and solved:
            return h, f"{h.modelStatusToString(status)} (best plan found, gap {h.getInfo().mip_gap:.3g})"
        raise UserError(f"the ILP solver (HiGHS {highspy.Highs().version()}) did not solve the model: "
                        f"{h.modelStatusToString(status)}; raise its time limit (mode.ilp_time_limit_s) or use a "
                        "smaller mesh")

    def choice(self, h: Any) -> list[int]:
        values = np.asarray(h.getSolution().col_value[:self.n_s])
        return [int(np.argmax(values[o:o + n])) for o, n in zip(self.problem.offsets, self.problem.sizes, strict=True)]
