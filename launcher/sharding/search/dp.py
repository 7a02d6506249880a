"""The CFP search pass: the fastest plan for the whole block sequence under a memory budget.

The model is the sequence of profiled units (segments, or parts of them). Choosing one
combination per unit gives a whole-model plan whose predicted step time is the sum of the
units' measured times plus the measured resharding of every tensor that crosses between two
units (each less what running a program with its arguments and results costs, and less the
latency of its gradient all-reduces, both of which the whole step pays once), and whose
predicted per-device memory is the sum of the units' memory (each unit's arguments, results and
temporaries, with the tensors it receives from another unit counted once, where they are
produced).

Dynamic programming over the sequence keeps, for every combination of the current unit, the
Pareto front of (time, memory) over the choices before it; fronts drop anything over the budget
and are capped (evenly thinned along memory; the cap is far above what the models here reach).
When tensors cross only between neighbouring units that finds the fastest plan that fits,
exactly. Tensors that skip units (residual connections, a tied embedding, an MoE layer's
dispatch) are charged along each path the fronts keep, with the layouts that path chose, so
the cost of every kept plan is exact but a path dropped early might have paid less later (the
once-per-step gradient all-reduce latency is added only to whole plans, the same way); a
coordinate descent on the exact cost (one unit's combination at a time, while it helps) then
mends what the pruning missed.

Entries the profile pass's shortcuts left (``profile/candidates.py``): a combination not timed
because a plan holding it would be over the profile's memory budget has no time, and no plan
here may hold it; every plan holding it is over any budget below the profile's, so a search
under a budget no larger excludes it with the rest of what does not fit, and a search under
which some plan holding it would fit (a larger budget, or none) is refused, since it would
choose without combinations that were never timed. A combination
stopped early has a time from its first runs only, at least the early stop's ratio times its
unit's best: it is used as its cost (a bound on it, and no unit's best).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Mapping

from launcher.sharding.profile.boundaries import Boundary
from launcher.sharding.profile.profiler import Profiles
from launcher.errors import NoPlanFits, UserError

FRONT_CAP = 64


@dataclass
class SearchResult:
    combos: list[tuple[int, ...]]      # per unit
    assignment: list[int]              # plan per block
    predicted_time_s: float
    predicted_memory_bytes: int
    search_time_s: float
    runners_up: list["SearchResult"] = field(default_factory=list, repr=False)


class _Costs:
    """Unit and crossing costs by combination index, looked up once each."""

    def __init__(self, prof: Profiles) -> None:
        self.prof = prof
        self.combos = [u.combos() for u in prof.units]
        # Each unit's gradient all-reduces are paid once for the whole step (``total``), not per
        # unit; but a scanned body's, once per iteration (XLA cannot merge them across iterations).
        grads = prof.gradient_allreduces or [[frozenset()] * len(c) for c in self.combos]
        self.grads = [g if u.trips == 1 else [frozenset()] * len(g) for g, u in zip(grads, prof.units, strict=True)]
        lat = prof.allreduce_latency_s
        # A scanned body's unit runs ``trips`` times a step, and holds a layer of what the loop
        # stacks (weights, optimizer state, residuals) per iteration.
        self.time = [[max(prof.unit_time(u.kind, c) - sum(lat[ax] for ax in self.grads[i][k]), 0.0) * u.trips
                      for k, c in enumerate(self.combos[i])] for i, u in enumerate(prof.units)]
        # (A combination the profile did not profile, ``ProfileOptions.top_k``: no plan holds it.)
        self.mem = [[prof.table[u.kind][c]["mem_bytes"] * u.trips if prof.profiled(u.kind, c) else float("inf")
                     for c in self.combos[i]] for i, u in enumerate(prof.units)]
        self.into: list[list[tuple[int, Boundary]]] = [[] for _ in prof.units]  # (index, b) by right unit
        for k, b in enumerate(prof.boundaries):
            self.into[b.right].append((k, b))
        self._crossing: dict[tuple[int, int, int], float] = {}

    def crossing(self, k: int, b: Boundary, left: int, right: int) -> float:
        key = (k, left, right)
        if key not in self._crossing:
            self._crossing[key] = self.prof.boundary_cost(b, left, right)
        return self._crossing[key]

    def plan(self, assignment: list[int]) -> tuple[float, int]:
        """Exact predicted (time, memory) of a plan per block."""
        return self.total(tuple(self.combos[i].index(tuple(assignment[u.start:u.end]))
                                for i, u in enumerate(self.prof.units)))

    def total(self, path: tuple[int, ...]) -> tuple[float, int]:
        """Exact predicted (time, memory) of a combination index per unit."""
        t = self.prof.whole_overhead_s + sum(self.time[i][c] for i, c in enumerate(path))
        if t == float("inf"):  # holds a combination without a time: no resharding to add
            return t, sum(self.mem[i][c] for i, c in enumerate(path))
        t += sum(self.prof.allreduce_latency_s[ax] for ax in frozenset().union(*(self.grads[i][c]
                                                                               for i, c in enumerate(path))))
        t += sum(self.crossing(k, b, path[b.left], path[b.right]) for k, b in enumerate(self.prof.boundaries))
        return t, sum(self.mem[i][c] for i, c in enumerate(path))


def search(prof: Profiles, num_blocks: int, memory_budget_bytes: float | None = None,
           units_over_step: float = 1.0) -> SearchResult:
    """The fastest plan (and the runners-up) whose segments' memories add up to at most
    ``memory_budget_bytes`` times ``units_over_step`` (``budget.UNITS_OVER_STEP`` where the sum is
    a first filter only, the whole step's memory deciding after: ``search/fit.py``)."""
    t0 = time.perf_counter()
    if prof.infeasible:  # the profile stopped: no plan on its mesh fits its budget
        raise UserError(prof.infeasible)
    given = float("inf") if not memory_budget_bytes else float(memory_budget_bytes)
    budget = given * units_over_step
    costs = _Costs(prof)
    cost, mem, units = [list(t) for t in costs.time], costs.mem, prof.units
    _refuse_untimed_within(costs, budget)

    least = sum(min(m) for m in mem)
    over = (f" (their segments' memories add up to {least / 2**30:.6g} GB, over {units_over_step:g}x the budget, "
            "what the sum may over-count the step by)" if units_over_step != 1 else " (predicted)")
    if least > budget:
        raise NoPlanFits(f"no plan fits mode.memory_budget_gb={given / 2**30:.6g}: the least memory any plan "
                         f"needs is {least / units_over_step / 2**30:.6g} GB per device{over}; raise the budget or "
                         "use more devices")

    _own_crossings(costs, cost)
    # front[c]: (time, memory, path) entries, path = a combination index per unit so far
    front = [[(cost[0][c], mem[0][c], (c,))] if mem[0][c] <= budget and cost[0][c] < float("inf") else []
             for c in range(len(cost[0]))]
    for i in range(1, len(units)):
        near = [(k, b) for k, b in costs.into[i] if b.left == i - 1]
        far = [(k, b) for k, b in costs.into[i] if b.left < i - 1]
        new = []
        for c in range(len(cost[i])):
            options = []
            if cost[i][c] == float("inf"):  # untimed, or not profiled
                new.append(options)
                continue
            for pc, entries in enumerate(front):
                if not entries:
                    continue
                step = cost[i][c] + sum(costs.crossing(k, b, pc, c) for k, b in near)
                for t, m, path in entries:
                    if m + mem[i][c] <= budget:
                        skipped = sum(costs.crossing(k, b, path[b.left], c) for k, b in far)
                        options.append((t + step + skipped, m + mem[i][c], path + (c,)))
            new.append(_pareto(options))
        front = new

    ends = sorted((e for entries in front for e in entries), key=lambda e: (e[0], e[1]))
    if not ends:  # every path crossed the budget somewhere
        raise NoPlanFits(f"no plan fits mode.memory_budget_gb={given / 2**30:.6g}: the least memory any plan "
                         f"needs is {least / units_over_step / 2**30:.6g} GB per device{over}; raise the budget")

    def result(path: tuple[int, ...]) -> SearchResult:
        t, m = costs.total(path)
        picked = [costs.combos[i][ci] for i, ci in enumerate(path)]
        assignment = [0] * num_blocks
        for u, combo in zip(units, picked, strict=True):
            for j, p in enumerate(combo):
                assignment[u.start + j] = p
        return SearchResult(picked, assignment, t, int(m), time.perf_counter() - t0)

    best_path = _descend(costs, ends[0][2], budget)
    best = result(best_path)
    # The runners-up: the fastest plan ending in each other combination of the last unit (the
    # DP keeps them anyway), for a final measured choice among the top few (``shortlist``).
    best.runners_up = [result(e[2]) for e in ends if e[2] != best_path]
    best.search_time_s = time.perf_counter() - t0
    return best


def _own_crossings(costs: _Costs, cost: list[list[float]]) -> None:
    """Adds to each unit's ``cost`` what crosses within the unit itself (a scanned body's carry,
    from one iteration to the next): part of the unit's own cost, whatever its neighbours."""
    for i in range(len(cost)):
        for k, b in costs.into[i]:
            if b.left == i:
                cost[i] = [t + costs.crossing(k, b, c, c) if t < float("inf") else t for c, t in enumerate(cost[i])]


def _refuse_untimed_within(costs: _Costs, budget: float) -> None:
    """Refuses a budget under which some plan holding a combination the profile did not time
    would fit (its memory plus the least of every other unit's): the search would be choosing
    without it (see the module doc)."""
    least = [min(m) for m in costs.mem]
    total = sum(least)
    fits = [m + total - least[i] for i, u in enumerate(costs.prof.units) for c, m in zip(costs.combos[i], costs.mem[i], strict=True)
            if costs.prof.profiled(u.kind, c) and not costs.prof.timed(u.kind, c) and m + total - least[i] <= budget]
    if fits:
        within = ("this search has no memory budget, but" if budget == float("inf") else
                  f"within this search's mode.memory_budget_gb={budget / 2**30:.6g},")
        raise UserError(f"{within} {len(fits)} segment combinations were not timed: the profile pass skipped them as "
                        f"over its own memory budget (a plan holding one needs {min(fits) / 2**30:.6g} GB per "
                        "device); "
                        "profile under a budget at least this search's (the same mode.memory_budget_gb), or with "
                        "mode.skip_over_budget=false")


def _descend(costs: _Costs, path: tuple[int, ...], budget: float) -> tuple[int, ...]:
    """Coordinate descent on the exact cost: change one unit's combination at a time while that
    makes the plan faster within the budget."""
    best, (best_t, _) = path, costs.total(path)
    improved = True
    while improved:
        improved = False
        for i in range(len(best)):
            for c in range(len(costs.time[i])):
                if c == best[i] or costs.time[i][c] == float("inf"):
                    continue
                trial = best[:i] + (c,) + best[i + 1:]
                t, m = costs.total(trial)
                if m <= budget and t < best_t - 1e-12:
                    best, best_t, improved = trial, t, True
    return best


def _pareto(options: list[tuple]) -> list[tuple]:
    """Entries not beaten on both time and memory, fastest first, thinned to FRONT_CAP."""
    front = []
    for o in sorted(options, key=lambda o: (o[0], o[1])):
        if not front or o[1] < front[-1][1]:
            front.append(o)
    if len(front) > FRONT_CAP:
        step = (len(front) - 1) / (FRONT_CAP - 1)
        front = [front[round(i * step)] for i in range(FRONT_CAP)]
    return front


def predict(prof: Profiles, assignment: list[int]) -> tuple[float, int]:
    """Predicted (step time, memory) of a whole-model plan given as a plan per block."""
    return _Costs(prof).plan(assignment)


@dataclass
class Candidate:
    """A whole-model plan the search pass measures on the whole step, and where it came from."""
    assignment: list[int]
    predicted_time_s: float
    predicted_memory_bytes: int
    source: str   # "search optimum", "nearest <built-in plan>", "uniform <k>" or "runner-up"
    # Inputs (positions among the step's) stored split over every device between steps, the
    # state as ZeRO-3 stores it (``apply.plan_constraints``); none: as the plan computes with them.
    stored: frozenset = frozenset()
    # The mesh axis the processes change along (``plans.arranged``); None: the first.
    across: int | None = None


def shortlist(prof: Profiles, found: SearchResult, num_blocks: int, k: int,
              memory_budget_bytes: float | None = None,
              nearest: Mapping[str, list[int]] | None = None) -> list[Candidate]:
    """The whole-model plans the search pass measures on the whole step: the search's optimum;
    then the plan nearest each built-in plan (``nearest``: name -> plan per block, see
    ``nearest.py``), fastest predicted first; then, alternately, the fastest predicted uniform
    plans (every block on plan j) and the optimum's runners-up, until ``k`` of those two kinds
    are in. Distinct plans only, all within the budget.

    Why measure at all: inside the whole step XLA fuses across segments and merges collectives
    (one all-reduce for every gradient of a data-parallel plan, where each segment alone pays its
    own), which segment profiles cannot see and which differs from plan to plan, so the
    profiles rank plans well but not exactly. Why the others: the runners-up are near-copies of
    the optimum (one unit's choice differs), while a uniform plan or a built-in plan's nearest
    is a different layout family altogether (data-parallel-like, Megatron-like), and the
    families are where the profiles' misjudgements are largest."""
    budget = float("inf") if not memory_budget_bytes else float(memory_budget_bytes)
    counts = [0] * num_blocks
    for u in prof.units:
        counts[u.start:u.end] = u.plan_counts
    costs = _Costs(prof)

    def candidate(assignment: list[int], source: str) -> Candidate | None:
        t, m = costs.plan(assignment)
        # (An untimed combination's time is infinite: such a plan is never shortlisted.)
        return Candidate(list(assignment), t, int(m), source) if m <= budget and t < float("inf") else None

    uniform = [candidate([min(j, n - 1) for n in counts], f"uniform {j}") for j in range(max(counts, default=0))]
    near = [candidate(a, f"nearest {name}") for name, a in (nearest or {}).items()]
    uniform, near = (sorted(filter(None, x), key=lambda c: c.predicted_time_s) for x in (uniform, near))
    runners_up = [Candidate(r.assignment, r.predicted_time_s, r.predicted_memory_bytes, "runner-up")
                  for r in found.runners_up]
    out: list[Candidate] = []

    def add(c: Candidate) -> bool:
        if any(c.assignment == o.assignment for o in out):
            return False
        out.append(c)
        return True

    add(Candidate(found.assignment, found.predicted_time_s, found.predicted_memory_bytes, "search optimum"))
    for c in near:
        add(c)
    searched, sources = 1, itertools.cycle([uniform, runners_up])
    while searched < k and (uniform or runners_up):
        source = next(sources)
        while source:
            if add(source.pop(0)):
                searched += 1
                break
    return out
