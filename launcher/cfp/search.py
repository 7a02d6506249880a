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

import time
from dataclasses import dataclass

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

    best = min(((e, c) for c, entries in enumerate(front) for e in entries), key=lambda x: (x[0][0], x[0][1]),
               default=None)
    if best is None:  # every path crossed the budget somewhere
        raise UserError(f"no plan fits mode.memory_budget_gb={budget / 2**30:.6g}: the least memory any plan "
                        f"needs is {least / 2**30:.6g} GB per device (predicted); raise the budget")
    (t, m, pc, k), c = best
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
