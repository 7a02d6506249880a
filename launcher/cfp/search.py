"""The CFP search pass: the fastest plan for the whole block sequence under a memory budget.

The model is the sequence of profiled units (segments, or parts of them). Choosing one
combination per unit gives a whole-model plan whose predicted step time is the sum of the
units' measured times plus the measured resharding at each boundary (each less the cost of
launching a program, which the whole step pays once), and whose predicted
per-device memory is the sum of the units' memory (each unit's arguments, results and
temporaries, with the tensors it receives from a neighbour counted once, at the neighbour).

Dynamic programming over the sequence keeps, for every combination of the current unit, the
Pareto front of (time, memory) over the choices before it; fronts drop anything over the budget,
so the answer is the fastest plan that fits, found exactly. Fronts are capped (evenly thinned
along memory) to keep very deep models fast; the cap is far above what the models here reach.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from launcher.cfp.profile import Profiles
from launcher.errors import UserError

FRONT_CAP = 64


@dataclass
class SearchResult:
    combos: list[tuple[int, ...]]      # per unit
    assignment: list[int]              # plan per block
    predicted_time_s: float
    predicted_memory_bytes: int
    search_time_s: float
    runners_up: list["SearchResult"] = field(default_factory=list, repr=False)


def search(prof: Profiles, num_blocks: int, memory_budget_bytes: float | None = None) -> SearchResult:
    t0 = time.perf_counter()
    budget = float("inf") if not memory_budget_bytes else float(memory_budget_bytes)
    units = prof.units
    combos = [u.combos() for u in units]
    cost = [[prof.unit_time(u.kind, c) for c in combos[i]] for i, u in enumerate(units)]
    mem = [[prof.table[u.kind][c]["mem_bytes"] for c in combos[i]] for i, u in enumerate(units)]

    least = sum(min(m) for m in mem)
    if least > budget:
        raise UserError(f"no plan fits mode.memory_budget_gb={budget / 2**30:.6g}: the least memory any plan "
                        f"needs is {least / 2**30:.6g} GB per device (predicted); raise the budget or use more "
                        "devices")

    # front[c] = list of (time, memory, previous combo index, index in the previous front)
    front = [[(cost[0][c], mem[0][c], -1, -1)] if mem[0][c] <= budget else [] for c in range(len(combos[0]))]
    history = [front]
    for i in range(1, len(units)):
        b = prof.boundaries[i - 1]
        new = []
        for c in range(len(combos[i])):
            options = []
            for pc, entries in enumerate(front):
                if not entries:
                    continue
                step = prof.boundary_cost(b, pc, c) + cost[i][c]
                for k, (t, m, _, _) in enumerate(entries):
                    if m + mem[i][c] <= budget:
                        options.append((t + step, m + mem[i][c], pc, k))
            new.append(_pareto(options))
        front = new
        history.append(front)

    ends = sorted(((e, c) for c, entries in enumerate(front) for e in entries), key=lambda x: (x[0][0], x[0][1]))
    if not ends:  # every path crossed the budget somewhere
        raise UserError(f"no plan fits mode.memory_budget_gb={budget / 2**30:.6g}: the least memory any plan "
                        f"needs is {least / 2**30:.6g} GB per device (predicted); raise the budget")

    def result(end: tuple) -> SearchResult:
        (t, m, pc, k), c = end
        chosen = [c]
        for i in range(len(units) - 1, 0, -1):
            chosen.append(pc)
            _, _, pc, k = history[i - 1][pc][k]
        chosen.reverse()
        picked = [combos[i][ci] for i, ci in enumerate(chosen)]
        assignment = [0] * num_blocks
        for u, combo in zip(units, picked):
            for j, p in enumerate(combo):
                assignment[u.start + j] = p
        return SearchResult(picked, assignment, t + prof.whole_launch_s, int(m), time.perf_counter() - t0)

    best = result(ends[0])
    # The runners-up: the fastest plan ending in each other combination of the last unit (the
    # DP keeps them anyway), for a final measured choice among the top few (``shortlist``).
    best.runners_up = [result(e) for e in ends[1:] if e[0][1] <= budget]
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
    t, m, idx = prof.whole_launch_s, 0, []
    for u in prof.units:
        combo = tuple(assignment[u.start:u.end])
        t += prof.unit_time(u.kind, combo)
        m += prof.table[u.kind][combo]["mem_bytes"]
        idx.append(u.combos().index(combo))
    for i, b in enumerate(prof.boundaries):
        t += prof.boundary_cost(b, idx[i], idx[i + 1])
    return t, m


def shortlist(prof: Profiles, found: SearchResult, num_blocks: int, k: int,
              memory_budget_bytes: float | None = None) -> list[tuple[list[int], float, int]]:
    """Up to ``k`` distinct whole-model plans (assignment, predicted time, memory) for the search
    pass to measure on the whole step: the search's optimum first, then, alternately, the
    fastest predicted uniform plans (every block on plan j) and the optimum's runners-up, all
    within the budget.

    Why measure at all: a segment run alone is slower than inside the whole step, where XLA
    fuses and combines collectives across segments, and not by the same factor for every plan,
    so the profiles rank plans well but not exactly. Why uniform
    plans: the runners-up are near-copies of the optimum (one unit's choice differs), while a
    uniform plan is a different layout family altogether (data-parallel-like, Megatron-like)."""
    budget = float("inf") if not memory_budget_bytes else float(memory_budget_bytes)
    counts = [0] * num_blocks
    for u in prof.units:
        counts[u.start:u.end] = u.plan_counts
    uniform = []
    for j in range(max(counts, default=0)):
        assignment = [min(j, n - 1) for n in counts]
        t, m = predict(prof, assignment)
        if m <= budget:
            uniform.append((assignment, t, m))
    uniform.sort(key=lambda x: x[1])
    runners_up = [(r.assignment, r.predicted_time_s, r.predicted_memory_bytes) for r in found.runners_up]
    out = [(found.assignment, found.predicted_time_s, found.predicted_memory_bytes)]
    seen = {tuple(found.assignment)}
    sources = itertools.cycle([uniform, runners_up])
    while len(out) < k and (uniform or runners_up):
        source = next(sources)
        while source:
            a, t, m = source.pop(0)
            if tuple(a) not in seen:
                seen.add(tuple(a))
                out.append((list(a), t, m))
                break
    return out
